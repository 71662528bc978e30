"""The docs cannot rot: every Python and YAML snippet in docs/*.md and README.md runs here.

- A ```python block runs in this process (``exec``) in a fresh temporary directory laid out like the
  repository after the examples' prepare steps: ``data/digits.lance`` (400 rows of the real digits
  dataset) is always there; ``<!-- test: setup=tokens,embeddings -->`` on the line before the block
  adds ``data/stdlib_tokens.lance`` / ``data/embeddings.lance`` (small real builds of
  examples/lm_pretrain.py and examples/tabular.py). Blocks are self-contained: nothing carries over.
- A ```yaml block is parsed and instantiated by the real `LanceLightningCLI` (``run=False``). A
  block with ``model:`` is a whole config; one without is a fragment, merged over
  ``configs/quickstart.yaml``. When every source it names is local, the data module is also set
  up on the datasets above, which checks its columns and filters against real data.
- Fences that would escape this test by their name (``py``, ``yml``, ...) are refused; commands
  that are not meant to run here (torchrun, SLURM, S3) belong in ```bash blocks.
- docs/api.md is what docs/gen_api.py generates from the current docstrings; relative links and
  their #anchors resolve; every number in a paragraph, list item or table row that cites
  ``benchmarks/results/<file>.md`` is in the benchmark files it links.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO_ROOT / "docs").glob("*.md")) + [REPO_ROOT / "README.md"]
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
RUNNABLE = {"python", "yaml"}
MISNAMED = {"py", "python3", "py3", "pycon", "ipython", "yml"}
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*test:\s*(.*?)\s*-->\s*$")
#: fixture name -> path under the block's working directory
DATASETS = {"digits": "data/digits.lance", "tokens": "data/stdlib_tokens.lance", "embeddings": "data/embeddings.lance"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    setup: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with its language, first line number and test marker."""
    text = path.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        setup: tuple[str, ...] = ()
        if marker:
            key, _, value = marker.group(1).partition("=")
            assert key.strip() == "setup", f"{path}:{line}: unknown test marker {marker.group(0)!r}"
            setup = tuple(v.strip() for v in value.split(",") if v.strip())
            unknown = set(setup) - set(DATASETS)
            assert not unknown, f"{path}:{line}: unknown setup {sorted(unknown)}; known: {sorted(DATASETS)}"
        blocks.append(Block(path, line, match.group(1).lower(), match.group(2), setup))
    return blocks


ALL_BLOCKS = [block for path in DOCS for block in extract_blocks(path)]
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]
YAML = [b for b in ALL_BLOCKS if b.lang == "yaml"]


# -- datasets -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory):
    """name -> path of a small real dataset, built once per session on first use."""
    root = tmp_path_factory.mktemp("doc_datasets")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = _build(name, root)
        return built[name]

    return get


def _build(name: str, root: Path) -> Path:
    import lance

    out = root / Path(DATASETS[name]).name
    if name == "digits":
        from examples.digits import prepare

        full = prepare(str(root / "digits_full.lance"))
        lance.write_dataset(lance.dataset(full).to_table().slice(0, 400), str(out))
    elif name == "tokens":
        from examples.lm_pretrain import prepare

        prepare(str(out), max_files=12)
    else:
        from examples.tabular import prepare

        prepare(str(out), rows=3000)
    return out


def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, datasets, names) -> None:
    monkeypatch.chdir(tmp_path)
    for name in names:
        shutil.copytree(datasets(name), tmp_path / DATASETS[name])


# -- the snippets ---------------------------------------------------------------------------------
def test_snippets_are_found_and_named_to_run() -> None:
    assert len(PYTHON) >= 5 and len(YAML) >= 3, (len(PYTHON), len(YAML))
    misnamed = [b.id for b in ALL_BLOCKS if b.lang in MISNAMED]
    assert not misnamed, f"fences named py/yml/... are not run by this test; use python or yaml: {misnamed}"


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_snippet_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, datasets) -> None:
    _workdir(tmp_path, monkeypatch, datasets, ("digits", *block.setup))
    monkeypatch.setenv("PL_TRAINER_ENABLE_PROGRESS_BAR", "False")  # Trainer defaults; snippets' arguments win
    monkeypatch.setenv("PL_TRAINER_ENABLE_MODEL_SUMMARY", "False")
    monkeypatch.setattr(sys, "argv", ["snippet"])
    code = compile(block.code, block.id, "exec")
    exec(code, {"__name__": "__main__"})  # noqa: S102 - the docs' own code


@pytest.mark.parametrize("block", YAML, ids=lambda b: b.id)
def test_yaml_snippet_parses(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, datasets) -> None:
    from lance_lightning import LanceDataModule
    from lance_lightning.cli import LanceLightningCLI

    config = yaml.safe_load(block.code)
    assert isinstance(config, dict), f"{block.id}: not a YAML mapping"
    if "model" not in config:
        config = _merge(yaml.safe_load(QUICKSTART.read_text()), config)
    _workdir(tmp_path, monkeypatch, datasets, DATASETS)
    path = tmp_path / "snippet.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(sys, "argv", ["lance-lightning"])
    cli = LanceLightningCLI(
        datamodule_class=LanceDataModule,
        subclass_mode_model=True,
        run=False,
        save_config_kwargs={"overwrite": True},
        args=["--config", str(path)],
    )
    datamodule = cli.datamodule
    assert isinstance(datamodule, LanceDataModule)
    splits = [source for source in datamodule.sources.values() if source is not None]
    uris = [source.uri for split in splits for source in getattr(split, "sources", [split])]  # a mixture's too
    if uris and all(uri and "://" not in uri for uri in uris):  # not a catalog's table ("" until setup)
        datamodule.setup(None)  # pins and plans every configured split on the real data
        assert datamodule.plans


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        source = {"uri", "namespace"} & set(value) if isinstance(value, dict) else set()  # replaces, as YAML does
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and "class_path" not in value and not source:
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# -- generated and cited content ------------------------------------------------------------------
def _load_gen_api():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_api", REPO_ROOT / "docs" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_generated_from_the_current_docstrings() -> None:
    expected = _load_gen_api().render()
    current = (REPO_ROOT / "docs" / "api.md").read_text()
    assert current == expected, "docs/api.md is out of date with the docstrings: run `python docs/gen_api.py`"


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", text, re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_relative_links_and_anchors_resolve() -> None:
    broken = []
    for doc in DOCS:
        text = _FENCE.sub("", doc.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])|(?<![\w.,])\d+\.\d+(?=x(?!\w)|(?![\w.]))")


def _units(text: str) -> list[str]:
    """Table rows one by one; other text by paragraph or list item (a claim and its citation)."""
    units: list[str] = []
    for line in _FENCE.sub("", text).splitlines():
        starts_item = re.match(r"\s*(?:[-*]|\d+\.)\s", line) is not None
        if line.lstrip().startswith("|") or not line.strip() or starts_item or not units:
            units.append(line)
        else:
            units[-1] += " " + line
    return [unit for unit in units if unit.strip()]


def test_the_numbers_checked_include_ratios() -> None:
    """Ratios written with an ``x`` (``1.39x``) are quoted numbers too (the check missed them
    before); versions, identifiers and units glued to a number are not."""
    found = _NUMBER.findall("read 1.39x as fast, 1,234 rows/s, 0.5 s, v0.1.2, 2.5GB, 3.0x2")
    assert found == ["1.39", "1,234", "0.5"], found


def test_cited_benchmark_numbers_are_in_the_cited_results() -> None:
    """A paragraph, list item or table row that links benchmarks/results/X.md may only quote
    numbers (1,234 or 1.23) found in the benchmark files it links."""
    missing = []
    for doc in DOCS:
        for unit in _units(doc.read_text()):
            cited = re.findall(r"benchmarks/(?:results/)?[\w.-]+\.md", unit)
            if not any("/results/" in name for name in cited):
                continue
            text = " ".join((REPO_ROOT / name).read_text() for name in cited)
            for value in _NUMBER.findall(unit):
                if value not in text:
                    missing.append(f"{doc.name}: {value} not in {sorted(set(cited))}: {unit.strip()[:120]}")
    assert not missing, "\n".join(missing)
