"""``lance-lightning prepare`` in a subprocess: the closing report, a rerun that does nothing, one-screen
errors, a SIGKILL at three moments and its rerun equal to an uninterrupted run row for row, and
``lance-lightning fit --config`` from a raw image folder to a trained epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lance
import pytest

from lance_lightning.write.ledger import DONE_KEY
from tests import zygote
from tests.helpers import run_cli_process
from tests.unit.write.inputs import image_folder

REPO_ROOT = Path(__file__).resolve().parents[2]

#: A prepare that SIGKILLs itself at a moment (``commit:N``, ``write:N``, ``rename``).
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"


def _prepare_args(root: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--format", "imagefolder", "--input", str(root), "--output", str(out), *extra]


@pytest.mark.slow
def test_prepare_reports_then_does_nothing_on_rerun(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=3, bad=("dog/broken.jpg",))
    code, output = run_cli_process(_prepare_args(root, tmp_path / "out.lance", "--unit-files", "4"), tmp_path)
    assert code == 0, output
    assert "prepared from imagefolder" in output and "9 rows in 3 units" in output and "rows/s" in output
    assert "skipped dog/broken.jpg: is not a readable image" in output
    code, output = run_cli_process(_prepare_args(root, tmp_path / "out.lance", "--unit-files", "4"), tmp_path)
    assert code == 0 and "is already complete" in output and "nothing to do" in output, output


@pytest.mark.slow
def test_prepare_errors_fit_one_screen_and_name_the_flag(tmp_path: Path) -> None:
    code, output = run_cli_process(_prepare_args(tmp_path / "missing", tmp_path / "out.lance"), tmp_path)
    assert code == 1, output
    assert "lance-lightning prepare: error: does not exist" in output and "parameter: --input" in output
    assert len(output.strip().splitlines()) <= 6 and "Traceback" not in output
    code, output = run_cli_process(["prepare", "--format", "csv", "--input", "x", "--output", "y"], tmp_path)
    assert code == 2 and "invalid choice: 'csv'" in output, output


@pytest.fixture(scope="module")
def killed_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The SIGKILL tests' image folder and the oracle: an uninterrupted CLI prepare of it (one for the
    three moments; each test only reads the folder and writes its own output)."""
    root = tmp_path_factory.mktemp("killed_input")
    folder = image_folder(root / "in", per_class=4, bad=("fox/zz.png",))
    code, output = run_cli_process(_prepare_args(folder, root / "whole.lance", "--quiet"), root)
    assert code == 0, output
    return folder, root / "whole.lance"


def _killed_prepare(moment: str, args: list[str]) -> subprocess.CompletedProcess:
    """``python tests/prepare_kill.py MOMENT cli ARGS`` forked from the test zygote (`tests.zygote`:
    the process a fresh start gives, less the imports; its status -9 when it SIGKILLs itself)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return zygote.run([sys.executable, str(KILLER), moment, "cli", *args], env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["commit:2", "write:3", "rename"])
def test_sigkill_mid_prepare_then_rerun_equals_an_uninterrupted_run(
    tmp_path: Path, killed_input: tuple[Path, Path], moment: str
) -> None:
    root, whole_out = killed_input
    args = _prepare_args(root, tmp_path / "out.lance", "--unit-files", "2", "--workers", "2", "--quiet")[1:]
    killed = _killed_prepare(moment, args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert not (tmp_path / "out.lance").exists()  # never looks complete at the output
    partial = lance.dataset(str(tmp_path / "out.lance.partial"))
    assert (DONE_KEY in partial.config()) == (moment == "rename")
    code, output = run_cli_process(["prepare", *args], tmp_path)
    assert code == 0, output
    assert ("already complete" if moment == "rename" else "resumed after") in output, output
    resumed, whole = (lance.dataset(str(path)).to_table() for path in (tmp_path / "out.lance", whole_out))
    assert resumed.num_rows == 12 and resumed.equals(whole)


_FIT_CONFIG = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: 1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  num_sanity_val_steps: 0
  default_root_dir: {root}
model:
  class_path: examples.digits.DigitsClassifier
data:
  train:
    uri: {out}
    columns: [image, label]
    prepare: {{format: imagefolder, input: {images}}}
  batch_size: 4
  transform:
    class_path: lance_lightning.transforms.DecodeImage
    init_args: {{column: image, mode: gray, size: 8}}
"""


@pytest.mark.slow
def test_fit_from_a_raw_image_folder_in_one_command(tmp_path: Path) -> None:
    images = image_folder(tmp_path / "images", per_class=4)
    config = tmp_path / "fit.yaml"
    config.write_text(_FIT_CONFIG.format(root=tmp_path / "run", out=tmp_path / "images.lance", images=images))
    code, output = run_cli_process(["fit", "--config", str(config)], REPO_ROOT)
    assert code == 0, output[-3000:]
    assert output.count("images.lance prepared from imagefolder") == 2, output[-3000:]  # the report, explain()
    assert "12 rows" in output
    assert "`Trainer.fit` stopped: `max_epochs=1` reached" in output
    code, output = run_cli_process(["fit", "--config", str(config)], REPO_ROOT)
    assert code == 0 and output.count("is already complete") == 2, output[-3000:]


def test_the_prepare_command_imports_neither_lightning_nor_torch() -> None:
    from tests.helpers import packages_imported_by

    assert (
        packages_imported_by(["lance_lightning.cli.prepare", "lance_lightning.write.prepare"], ("lightning", "torch"))
        == []
    )


@pytest.mark.parametrize("args", [["--help"], ["--format", "nope", "--input", "x", "--output", "y"]])
def test_prepare_help_and_a_usage_error_import_not_even_lance(args: list[str]) -> None:
    """``prepare --help`` and a usage error need only argparse: answered in a fraction of a second
    (about 0.15 s of CPU; 1.3 s while the parser imported Lance and pyarrow)."""
    code = (
        "import json, sys\nfrom lance_lightning.cli import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as e:\n    print('exit', e.code)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'lance', 'pyarrow', 'torch', 'lightning'})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "prepare", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    *shown, imported = done.stdout.strip().splitlines()
    assert imported == "[]", imported
    if args == ["--help"]:
        assert any("--format {imagefolder,webdataset,parquet,hf,videofolder,audiofolder}" in line for line in shown)
    else:
        assert shown[-1] == "exit 2" and "invalid choice: 'nope'" in done.stderr, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("killed", [False, True])
def test_videofolder_of_several_units_reads_back_as_its_files(tmp_path: Path, killed: bool) -> None:
    """Issue #50's reproduction: two class folders of three 3 KB ``.mp4`` files, ``--unit-files 2
    --workers 1`` (units written after the dataset exists), also SIGKILLed after the first commit and
    rerun: every column of every row equals the input files' (the oracle), blob bytes included."""
    from tests.unit.write.test_prepare_blobs import class_folder

    expected = [
        {"id": r["id"], "video": r["blob"], **{k: r[k] for k in ("label", "label_name", "path")}}
        for r in class_folder(tmp_path / "raw", ".mp4")
    ]
    args = ["--format", "videofolder", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "v.lance")]
    args += ["--unit-files", "2", "--workers", "1", "--no-probe-media"]  # fake bytes: not opened as media
    if killed:
        run = _killed_prepare("commit:1", args)
        assert run.returncode == -signal.SIGKILL, run.stderr.decode()[-2000:]
    code, output = run_cli_process(["prepare", *args], tmp_path)
    assert code == 0 and "6 rows in 3 units" in output and "0 files skipped" in output, output
    assert ("resumed after 1 of 3 units" in output) == killed, output
    got = lance.dataset(str(tmp_path / "v.lance")).to_table(blob_handling="all_binary").to_pylist()
    assert got == expected
