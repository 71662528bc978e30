"""The GPT pretraining example (examples/gpt_mixture.py, configs/gpt_mixture.yaml) works end to end.

- ``prepare`` builds the code and prose corpora and their BPE tokenizer from local files only,
  deterministically and idempotently; the token ids decode back to the documents.
- `GPT` on batches shaped as the packing contract says (built here by `pack`, a plain reference
  of that contract): attention and positions never cross a document, and a real ``Trainer.fit``
  logs the loss, tokens/s, padding fraction and mixture shares to TensorBoard.
- The shipped config through the CLI (``lance-lightning fit``) in 2 DDP CPU ranks, killed after a
  checkpoint (its session SIGKILLed as a rank starts the step after it) and resumed on 1 rank with
  ``--ckpt_path``: training continues at the checkpoint's step and the killed + resumed runs trained
  exactly the windows of an uninterrupted run, none twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from tests import zygote

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "configs" / "gpt_mixture.yaml"
IGNORE = -100
TIMEOUT_S = 480


# -- a reference of the packing contract (docs: issue 19), for batches without TokenPacking -------
def pack(documents: list[list[int]], seq_len: int) -> list[dict[str, torch.Tensor]]:
    """``documents`` concatenated and cut into windows of ``seq_len`` tokens (the last partial one
    dropped), each with next-token ``labels`` (ignored where the next token starts another
    document), ``position_ids`` (index within the document) and ``document_ids`` (per window)."""
    tokens = [t for doc in documents for t in doc]
    doc_of = [d for d, doc in enumerate(documents) for _ in doc]
    position = [p for doc in documents for p in range(len(doc))]
    windows = []
    for start in range(0, len(tokens) - seq_len + 1, seq_len):
        span = range(start, start + seq_len)
        labels = [tokens[i + 1] if i + 1 < len(tokens) and doc_of[i + 1] == doc_of[i] else IGNORE for i in span]
        first = doc_of[start]
        windows.append(
            {
                "input_ids": torch.tensor([tokens[i] for i in span]),
                "labels": torch.tensor(labels),
                "position_ids": torch.tensor([position[i] for i in span]),
                "document_ids": torch.tensor([doc_of[i] - first for i in span], dtype=torch.int32),
            }
        )
    return windows


def collate(windows: list[dict[str, torch.Tensor]], source: list[int] | None = None) -> dict[str, torch.Tensor]:
    batch = {key: torch.stack([w[key] for w in windows]) for key in windows[0]}
    seq_len = batch["input_ids"].shape[1]
    lengths = [int(n) for w in windows for n in torch.unique_consecutive(w["document_ids"], return_counts=True)[1]]
    batch["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    batch["max_seqlen"] = torch.tensor(max(lengths))
    assert int(batch["cu_seqlens"][-1]) == len(windows) * seq_len
    if source is not None:
        batch["source"] = torch.tensor(source)
    return batch


# -- prepare ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.gpt_mixture import prepare

    return Path(prepare(str(tmp_path_factory.mktemp("gpt") / "data"), max_bytes=60_000, vocab_size=512))


def _tables(out: Path) -> dict[str, Any]:
    return {name: lance.dataset(str(out / f"{name}.lance")).to_table() for name in ("code", "prose", "val")}


def test_prepare_writes_both_corpora_deterministically_and_once(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from examples.gpt_mixture import EOS, EOS_ID, code_documents, prepare, prose_documents

    tables = _tables(corpus)
    for name, table in tables.items():
        assert str(table.schema.field("tokens").type) == "list<item: int32>", name
        assert table["n_tokens"].to_pylist() == [len(t) for t in table["tokens"].to_pylist()], name
        assert table.num_rows >= (2 if name == "val" else 20), name
    assert all(p.startswith("stdlib/") and ".py#" in p for p in tables["code"]["path"].to_pylist())
    assert any(p.startswith("pydoc_data/topics/") for p in tables["prose"]["path"].to_pylist())
    assert set(tables["val"]["corpus"].to_pylist()) == {"code", "prose"}
    train_paths = set(tables["code"]["path"].to_pylist()) | set(tables["prose"]["path"].to_pylist())
    assert not train_paths & set(tables["val"]["path"].to_pylist()), "a document is in train and val"

    tokenizer = Tokenizer.from_file(str(corpus / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 512 and tokenizer.token_to_id(EOS) == EOS_ID
    texts = dict(code_documents() + prose_documents())
    for name in ("code", "prose"):
        row = tables[name].slice(3, 1).to_pylist()[0]
        assert tokenizer.decode(row["tokens"]) == texts[row["path"]], f"{name}: tokens do not decode to the text"

    again = Path(prepare(str(tmp_path / "again"), max_bytes=60_000, vocab_size=512))
    assert (again / "tokenizer.json").read_bytes() == (corpus / "tokenizer.json").read_bytes()
    assert all(_tables(again)[name].equals(table) for name, table in tables.items()), "not deterministic"

    versions = {name: lance.dataset(str(again / f"{name}.lance")).version for name in tables}
    prepare(str(again), max_bytes=1000, vocab_size=300)  # complete output: left alone
    assert {name: lance.dataset(str(again / f"{name}.lance")).version for name in tables} == versions
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare(str(tmp_path / "foreign"))


# -- the model ----------------------------------------------------------------------------------
def test_gpt_attention_and_positions_stay_within_each_document() -> None:
    from examples.gpt_mixture import GPT

    torch.manual_seed(0)
    model = GPT(vocab_size=64, d_model=32, n_heads=2, n_layers=2).eval()
    first, second = torch.randint(1, 64, (5,)).tolist(), torch.randint(1, 64, (11,)).tolist()
    (window,) = pack([first, second], seq_len=16)
    alone = pack([second + [0] * 5], seq_len=16)[0]  # the second document at the window start
    with torch.no_grad():
        packed = model(window["input_ids"][None], window["position_ids"][None], window["document_ids"][None])
        reference = model(alone["input_ids"][None], alone["position_ids"][None], alone["document_ids"][None])
        leaky = model(window["input_ids"][None])  # no document ids: attention crosses the boundary
        leaky_restarted = model(window["input_ids"][None], window["position_ids"][None])
    torch.testing.assert_close(packed[0, 5:], reference[0, :11])
    assert not torch.allclose(leaky[0, 5:], reference[0, :11], atol=1e-4)
    assert not torch.allclose(leaky_restarted[0, 5:], leaky[0, 5:], atol=1e-4), "position_ids are not used"
    assert window["labels"][4] == IGNORE and window["labels"][5] == second[1]


class _Batches(torch.utils.data.Dataset):
    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.batches[index]


def _scalars(log_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_gpt_trains_on_packed_mixture_batches_and_logs_throughput(corpus: Path, tmp_path: Path) -> None:
    from examples.gpt_mixture import GPT

    tables = _tables(corpus)
    documents = {name: [doc[:40] for doc in tables[name]["tokens"].to_pylist()] for name in ("code", "prose")}
    windows = {name: pack(docs, seq_len=16) for name, docs in documents.items()}  # boundaries in most windows
    batches = []
    for step in range(12):  # 3 code windows and 1 prose window per batch, in varying positions
        source = [0, 0, 0, 1][step % 4 :] + [0, 0, 0, 1][: step % 4]
        picks = iter(range(4 * step, 4 * step + 4))
        batches.append(collate([windows["code" if s == 0 else "prose"][next(picks)] for s in source], source))
    padding = [float((b["labels"] == IGNORE).float().mean()) for b in batches]
    assert 0 < sum(padding), "no document boundary in the batches"

    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=4,
        log_every_n_steps=1,
        logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = GPT(vocab_size=512, d_model=32, n_heads=2, n_layers=1, lr=1e-2, source_names=["code", "prose"])
    loader = torch.utils.data.DataLoader(_Batches(batches), batch_size=None)
    trainer.fit(model, train_dataloaders=loader)

    scalars = _scalars(Path(trainer.logger.log_dir))
    losses = scalars["train/loss"]
    assert len(losses) == 48 and sum(losses[-4:]) < sum(losses[:4]), losses
    assert scalars["train/padding_fraction"][:12] == pytest.approx(padding)
    assert len(scalars["train/tokens_per_s"]) == 44 and min(scalars["train/tokens_per_s"]) > 0  # not per epoch start
    assert scalars["train/mixture/code"] == pytest.approx([0.75] * 48)
    assert scalars["train/mixture/prose"] == pytest.approx([0.25] * 48)


# -- the shipped config through the CLI: 2 DDP ranks, killed, resumed on 1 rank ------------------
class WindowRecorder(Callback):
    """Appends each trained batch's global step, window digests and sources to ``<out>/rank<r>.jsonl``."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int):
        self.out.mkdir(parents=True, exist_ok=True)
        record = {
            "step": trainer.global_step,
            "windows": [hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in batch["input_ids"].cpu()],
            "source": batch["source"].tolist() if "source" in batch else None,
        }
        with open(self.out / f"rank{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")


class OneIntraOpThread(Callback):
    """Sets torch's intra-op threads to 1 when the fit starts: its tiny ops gain nothing from a team
    of 2 OpenMP threads, which on a loaded 2-core machine only contend (and spin) for the cores
    (Lightning already gives each of 2 DDP ranks 1 thread there). What the fit trains does not
    depend on it."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        torch.set_num_threads(1)


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(out.glob("rank*.jsonl")) for line in path.read_text().splitlines()]


def _config(corpus: Path, tmp_path: Path, every: int, mixture: bool) -> Path:
    """The shipped config on the test corpus, small: 1 epoch, a checkpoint every ``every`` steps.

    Without ``mixture``, the code corpus alone, cut into windows by `TokenWindows` (no packing)."""
    config = json.loads(json.dumps(yaml.safe_load(CONFIG.read_text())).replace("data/gpt/", f"{corpus.as_posix()}/"))
    config["trainer"].update(max_steps=-1, max_epochs=1, log_every_n_steps=1, limit_val_batches=2)
    config["trainer"].pop("val_check_interval")
    config["trainer"]["callbacks"][0]["init_args"].update(every_n_train_steps=every, save_top_k=-1)
    config["model"]["init_args"].update(vocab_size=512, d_model=32, n_heads=2, n_layers=1)
    config["data"]["batch_size"] = 4
    if mixture:
        config["data"]["packing"]["init_args"]["seq_len"] = 64
        mixture_args = config["data"]["train"]["init_args"]
        # An epoch of 160 samples in blocks of 40 (the test corpus has a few hundred windows), the
        # schedule's stage changing at step 10 (sample 80, after the kill at sample 32, so the resumed
        # run crosses it): blocks of 32 + 8 then 24 + 16, 0.7 code overall, as in the shipped config
        # (2,400 samples cost three fits 350 s on 2 cores; 400 samples, 39 s).
        mixture_args.update(samples=160, block=40)
        mixture_args["schedule"][0]["until_step"] = 10
    else:
        del config["data"]["packing"]
        config["data"]["train"] = {"uri": f"{corpus.as_posix()}/code.lance", "columns": ["tokens"]}
        config["data"]["batch_size"] = 1  # a step: one document's windows (the corpus has few documents)
        config["data"]["val"]["columns"] = ["tokens"]
        windows = {"column": "tokens", "window": 64, "eos_id": 0}
        config["data"]["transform"] = {"class_path": "lance_lightning.transforms.TokenWindows", "init_args": windows}
    path = tmp_path / "gpt_test.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _command(config: Path, cwd: Path, record: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """``lance-lightning fit`` of ``config`` recording its windows in ``record`` (on 1 intra-op thread,
    `OneIntraOpThread`), and its environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):  # see tests/scenarios/test_ddp.py
        env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "lance_lightning_test_pycache"))
    recorder = {"class_path": "tests.scenarios.test_gpt_example.WindowRecorder", "init_args": {"out": str(record)}}
    threads = {"class_path": "tests.scenarios.test_gpt_example.OneIntraOpThread"}
    command = [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)]
    command += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", *args]
    command += [f"--trainer.callbacks+={json.dumps(recorder)}", f"--trainer.callbacks+={json.dumps(threads)}"]
    cwd.mkdir(parents=True, exist_ok=True)
    return command, env


class KillSessionPast(Callback):
    """SIGKILLs the fit's whole session (its process group: every rank, every worker) when a rank
    starts a batch past step ``step``: once the checkpoint of step ``step`` is written, as a user's
    ``kill -9`` of the launch midway."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int):
        if trainer.global_step > self.step:
            os.killpg(0, signal.SIGKILL)


def _in_session(config: Path, cwd: Path, record: Path, *args: str) -> tuple[int, str]:
    """The fit in its own session, forked from the test zygote (`tests.zygote`: the process a fresh
    start gives, less the imports; rank 1 from its spare, `tests.zygote_spare`), every rank killed after it: its
    exit status and output."""
    command, env = _command(config, cwd, record, *args)
    done = zygote.run_in_session(command, cwd=cwd, env=env, timeout=TIMEOUT_S)
    assert not done.timed_out, f"fit hung\n{done.output[-4000:]}"
    return done.returncode, done.output


def _fit_to_end(config: Path, cwd: Path, record: Path, *args: str) -> str:
    """The fit run to its end in its own session (`_in_session`); its output."""
    code, output = _in_session(config, cwd, record, *args)
    assert code == 0, output[-6000:]
    return output


def _kill_and_resume(config: Path, tmp_path: Path, every: int) -> dict[str, Any]:
    """Fit ``config`` in 2 DDP ranks, SIGKILL it after its checkpoint at step ``every``, resume that
    checkpoint on 1 rank, and fit it uninterrupted on 1 rank; check that training continued at the
    checkpoint's step and that the windows trained equal the uninterrupted run's. Returns the
    records of each run and the resumed run's TensorBoard scalars."""
    kill = {"class_path": "tests.scenarios.test_gpt_example.KillSessionPast", "init_args": {"step": every}}
    ddp = ["--trainer.devices=2", "--trainer.strategy=ddp", f"--trainer.callbacks+={json.dumps(kill)}"]
    code, output = _in_session(config, tmp_path / "killed", tmp_path / "rec_killed", *ddp)
    assert code == -signal.SIGKILL, output[-4000:]
    checkpoints = tmp_path / "killed" / "runs" / "gpt_mixture" / "tensorboard" / "version_0" / "checkpoints"
    checkpoint = checkpoints / f"step={every}.ckpt"
    assert checkpoint.is_file(), output[-4000:]
    before = [r for r in _records(tmp_path / "rec_killed") if r["step"] < every]
    assert sorted({r["step"] for r in before}) == list(range(every)) and len(before) == 2 * every

    _fit_to_end(config, tmp_path / "resumed", tmp_path / "rec_resumed", f"--ckpt_path={checkpoint}")
    after = _records(tmp_path / "rec_resumed")
    assert after and after[0]["step"] == every, "training did not continue at the checkpoint's step"
    assert [r["step"] for r in after] == list(range(every, every + len(after)))

    _fit_to_end(config, tmp_path / "whole", tmp_path / "rec_whole")
    whole = _records(tmp_path / "rec_whole")
    trained = Counter(w for r in before + after for w in r["windows"])
    expected = Counter(w for r in whole for w in r["windows"])
    assert trained == expected, (
        f"killed + resumed trained {sum(trained.values())} windows, uninterrupted {sum(expected.values())}; "
        f"more often than uninterrupted: {sum((trained - expected).values())}, "
        f"missing: {sum((expected - trained).values())}"
    )
    scalars = _scalars(tmp_path / "resumed" / "runs" / "gpt_mixture" / "tensorboard" / "version_0")
    for tag in ("train/loss", "train/tokens_per_s", "train/padding_fraction", "val/loss"):
        assert scalars.get(tag), f"{tag} not in TensorBoard: {sorted(scalars)}"
    assert any(tag.startswith("data/") for tag in scalars), "DataLoadingMonitor logged nothing"
    return {"before": before, "after": after, "whole": whole, "scalars": scalars}


@pytest.mark.soak  # the mixture test below runs the same kill and resume on the same path
@pytest.mark.slow
def test_gpt_config_on_one_source_killed_in_ddp_resumes_on_one_rank(corpus: Path, tmp_path: Path) -> None:
    _kill_and_resume(_config(corpus, tmp_path, every=4, mixture=False), tmp_path, every=4)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three DDP launches, each bounded by TIMEOUT_S: more than 300 s under load
def test_gpt_mixture_config_killed_in_ddp_resumes_on_one_rank_without_retraining(corpus: Path, tmp_path: Path) -> None:
    runs = _kill_and_resume(_config(corpus, tmp_path, every=4, mixture=True), tmp_path, every=4)
    sources = Counter(s for r in runs["whole"] for s in r["source"])
    share = sources[0] / sum(sources.values())
    assert abs(share - 0.7) <= 0.02, f"code share {share:.3f} of the epoch, weight 0.7"
    assert runs["scalars"].get("train/mixture/code") and runs["scalars"].get("train/mixture/prose")
    assert max(runs["scalars"]["train/padding_fraction"]) > 0, "no label masked at a document boundary"
    assert any(tag.startswith("data/mixture/") for tag in runs["scalars"]), "DataLoadingMonitor logged no mixture"
