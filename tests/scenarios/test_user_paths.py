"""Guarantees through the paths users take: ``Trainer.predict`` (1 and 2 ranks, the CLI),
``resume_data=False`` through ``fit(ckpt_path=...)``, default policies equal to explicit ones,
workers that never import Lightning, datasets rewritten at the same path, `BufferShuffle`'s shard
default, the plan printed after a resume re-pins a version, ``fork`` refused, killed workers, a
transform that returns a tuple.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lance_lightning import (
    BufferShuffle,
    ConfigError,
    DataCursorCheckpoint,
    LanceDataLoader,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    WorkerDiedError,
)
from lance_lightning.load.forked_server import ENV_SWITCH as FORKED_SERVER
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from tests import zygote
from tests.helpers import RecordingModel, append_rows, flat, write_dataset
from tests.worker_probe import KillOnRow, ToTuple

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _trainer(root: Path, **kwargs: Any) -> pl.Trainer:
    args: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    args.update(kwargs)
    return pl.Trainer(**args)


def _fit(
    root: Path, dm: LanceDataModule, *, name: str, ckpt_every: int = 0, ckpt_path: Path | None = None, **kwargs: Any
) -> RecordingModel:
    callbacks: list[Any] = [DataCursorCheckpoint()]
    if ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=root / f"ckpt_{name}", filename="{step}", every_n_train_steps=ckpt_every, save_top_k=-1
            )
        )
    model = RecordingModel()
    kwargs.setdefault("max_epochs", 1)
    trainer = _trainer(root / name, callbacks=callbacks, enable_checkpointing=bool(ckpt_every), **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None)
    return model


# -- 1. predict ------------------------------------------------------------------------------------
PREDICT_ROWS = 301  # 2 ranks x 50: 3 full steps and a 1-row tail (rank 1 has no tail row)


@pytest.fixture
def predict_uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "predict.lance", PREDICT_ROWS, fragment_rows=100)


def test_predict_returns_every_row_once_in_storage_order(tmp_path: Path, predict_uri: str) -> None:
    dm = LanceDataModule(predict=LanceSource(predict_uri, columns=["id", "x"]), batch_size=64)
    predictions = _trainer(tmp_path).predict(RecordingModel(), datamodule=dm)
    assert [len(p) for p in predictions] == [64, 64, 64, 64, 45]
    assert flat(predictions) == list(range(PREDICT_ROWS))


def test_predict_with_a_loader_built_outside_the_hooks(tmp_path: Path, predict_uri: str) -> None:
    """Lightning rebuilds a loader it did not see being built from its public attributes."""
    dm = LanceDataModule(predict=LanceSource(predict_uri, columns=["id", "x"]), batch_size=100)
    dm.setup("predict")
    loader = dm.predict_dataloader()
    predictions = _trainer(tmp_path).predict(RecordingModel(), dataloaders=loader)
    assert flat(predictions) == list(range(PREDICT_ROWS))


def test_loader_refuses_a_sampler(tmp_path: Path, predict_uri: str) -> None:
    dm = LanceDataModule(predict=LanceSource(predict_uri), batch_size=10)
    dm.setup("predict")
    with pytest.raises(ConfigError) as error:
        LanceDataLoader(dm.predict_dataloader().dataset, sampler=[0, 1])
    assert error.value.param == "sampler" and "leave `sampler` unset" in str(error.value)


def _rank_records(out: Path) -> list[dict[str, Any]]:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("predict.rank*.json"))]
    return sorted(records, key=lambda r: r["rank"])


def _in_step_order(records: list[dict[str, Any]]) -> list[int]:
    """Rank 0's batch of step 0, rank 1's, ..., then step 1: the storage order for NoShuffle."""
    steps = max(len(r["batches"]) for r in records)
    return [i for step in range(steps) for r in records if step < len(r["batches"]) for i in r["batches"][step]]


@pytest.mark.slow
def test_predict_on_two_ranks_writes_every_row_once(tmp_path: Path, predict_uri: str) -> None:
    out = tmp_path / "out"
    # Rank 0 forked from the test zygote (the process a fresh start gives, less the imports; rank 1
    # from its spare, tests/zygote_spare.py) in its own session, ended with every rank after the run.
    command = [sys.executable, str(REPO_ROOT / "tests" / "predict_worker.py"), str(out), predict_uri, "50"]
    done = zygote.run_in_session(command, cwd=REPO_ROOT, env=_env(), timeout=300)
    assert not done.timed_out and done.returncode == 0, done.output[-6000:]
    records = _rank_records(out)
    assert [r["world_size"] for r in records] == [2, 2]
    # 301 rows: 3 steps of 2 x 50, then row 300 on rank 0; rank 1 has one batch fewer, no padding.
    assert [len(r["batches"]) for r in records] == [4, 3]
    ids = _in_step_order(records)
    assert ids == list(range(PREDICT_ROWS)), "predicted rows are not every row once, in storage order"


@pytest.mark.slow
def test_cli_predict(tmp_path: Path, predict_uri: str) -> None:
    config = tmp_path / "predict.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  devices: 1
  logger: false
  enable_progress_bar: false
  default_root_dir: {tmp_path / "root"}
  callbacks:
    - class_path: tests.predict_worker.IdsWriter
      init_args: {{out_dir: {tmp_path / "out"}}}
model:
  class_path: tests.helpers.RecordingModel
data:
  predict: {{uri: {predict_uri}, columns: [id, x]}}
  batch_size: 64
""")
    proc = zygote.run(  # forked from the test zygote: the process a fresh start gives, less the imports
        [sys.executable, "-m", "lance_lightning.cli", "predict", "--config", str(config)],
        cwd=REPO_ROOT,
        env=_env(),
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = _rank_records(tmp_path / "out")
    assert len(records) == 1 and flat(records[0]["batches"]) == list(range(PREDICT_ROWS))


# -- 3. resume_data=False through fit(ckpt_path=...) -------------------------------------------------
ROWS, BATCH, K = 300, 16, 5  # 18 steps per epoch, checkpoint at step 5


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)


def _dm(uri: str, shuffle: Any = None, **kwargs: Any) -> LanceDataModule:
    """A train data module; ``shuffle=None`` leaves the argument out (its default)."""
    if shuffle is not None:
        kwargs["shuffle"] = shuffle
    return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=BATCH, **kwargs)


@pytest.mark.parametrize("seed", [1, 2], ids=["same-plan", "changed-seed"])
def test_resume_data_false_starts_the_data_epoch_fresh(tmp_path: Path, uri: str, seed: int) -> None:
    _fit(tmp_path, _dm(uri, RowShuffle(seed=1)), name="A", ckpt_every=K, max_steps=K)
    whole = _fit(tmp_path, _dm(uri, RowShuffle(seed=seed)), name="C", max_epochs=2)
    resumed = _fit(
        tmp_path,
        _dm(uri, RowShuffle(seed=seed), resume_data=False),
        name="B",
        max_epochs=2,
        ckpt_path=tmp_path / "ckpt_A" / f"step={K}.ckpt",
    )
    epoch0 = [ids for ids, e in zip(resumed.seen, resumed.seen_epochs) if e == 0]
    epoch1 = [ids for ids, e in zip(resumed.seen, resumed.seen_epochs) if e == 1]
    whole0 = [ids for ids, e in zip(whole.seen, whole.seen_epochs) if e == 0]
    whole1 = [ids for ids, e in zip(whole.seen, whole.seen_epochs) if e == 1]
    assert epoch0 == whole0, "the data epoch did not start at its first row, or was not read in full"
    assert epoch1 == whole1, "the epoch after the fresh start differs from an uninterrupted run's"


# -- 5. the default shuffle is NoShuffle() -----------------------------------------------------------
@pytest.mark.parametrize(
    ("saved", "resumed"),
    [(None, NoShuffle()), (NoShuffle(), None)],
    ids=["default-then-explicit", "explicit-then-default"],
)
def test_default_shuffle_is_no_shuffle_to_the_cursor(tmp_path: Path, uri: str, saved: Any, resumed: Any) -> None:
    a = _fit(tmp_path, _dm(uri, saved), name="A", ckpt_every=K, max_steps=K)
    dm = _dm(uri, resumed)
    text = dm.explain("train")
    assert "strategy: NoShuffle(" in text and "Lazy" not in text, text
    b = _fit(tmp_path, dm, name="B", ckpt_path=tmp_path / "ckpt_A" / f"step={K}.ckpt")
    assert flat(a.seen + b.seen) == list(range(ROWS // BATCH * BATCH))


# -- 6. workers never import Lightning -----------------------------------------------------------------
#: A fresh process (the fork server is per process: in the test process it may already have
#: imported an earlier test's transform module) fits with 2 workers and the default policies,
#: which are pickled to each worker; prints what the workers reported.
_WORKER_PROBE = """
import json, os, sys
import lightning.pytorch as pl
from lance_lightning import LanceDataModule, LanceSource
from tests.helpers import RecordingModel
from tests.worker_probe import RecordModules

class Recorder(RecordingModel):
    flags, pids, forked = set(), set(), set()
    def training_step(self, batch, batch_idx):
        self.flags.update(batch["lightning_imported"].tolist())
        self.forked.update(batch["forked"].tolist())
        self.pids.update(batch["pid"].tolist())
        return super().training_step(batch, batch_idx)

dm = LanceDataModule(train=LanceSource(sys.argv[1], columns=["id", "x"]), batch_size=16,
                     transform=RecordModules(), num_workers=2)
model = Recorder()
pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False, default_root_dir=sys.argv[2]).fit(model, datamodule=dm)
print(json.dumps({"flags": sorted(model.flags), "forked": sorted(model.forked), "pids": sorted(model.pids),
                  "main": os.getpid()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("script", ["-c", "file", "file, stock server", "file, stock server and start"])
def test_workers_do_not_import_lightning(tmp_path: Path, uri: str, script: str) -> None:
    """By default the fork server is a fork of the training process (`lance_lightning.load.forked_server`):
    workers hold its modules, Lightning's included, and import nothing. The stock server
    (``LANCE_LIGHTNING_FORKED_SERVER=off``, or a process that opened a dataset first) imports the
    readers, and its workers skip the import of a training script that is a file (it imports
    Lightning), because nothing sent to them is defined in it (`lance_lightning.load.lean_start`);
    with ``LANCE_LIGHTNING_LEAN_WORKERS=off`` too they import it, as ``multiprocessing`` does."""
    env = {**_env(), "PL_SEED_WORKERS": "1"}  # as after seed_everything(workers=True), which LightningCLI runs
    env[HANDOFF] = "off"  # every batch from the workers
    stock = script.startswith("file, stock server")
    if stock:
        env[FORKED_SERVER] = "off"
    if script == "file, stock server and start":
        env["LANCE_LIGHTNING_LEAN_WORKERS"] = "off"
    command = [sys.executable, "-c", _WORKER_PROBE]
    if script != "-c":
        guarded = f"if __name__ == '__main__':\n{textwrap.indent(_WORKER_PROBE, '    ')}"
        (tmp_path / "train.py").write_text(f"import lightning.pytorch\n{guarded}")  # a script's imports at the top
        command = [sys.executable, str(tmp_path / "train.py")]
    proc = subprocess.run(
        [*command, uri, str(tmp_path)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["pids"]) == 2 and report["main"] not in report["pids"], "batches did not come from 2 workers"
    assert report["forked"] == ([0] if stock else [1]), "the fork server's kind"
    assert report["flags"] == ([1] if script.endswith("and start") else [0]), "flags: worker imported Lightning"


#: A script that defines its transform itself: workers must import the script to unpickle it.
_SCRIPT_TRANSFORM = """
import json, os, sys
import lightning.pytorch as pl
from lance_lightning import LanceDataModule, LanceSource
from tests.helpers import RecordingModel

class TagRows:
    def __call__(self, batch):
        batch["tag"] = batch["id"] * 0 + os.getpid()
        return batch

class Recorder(RecordingModel):
    tags = set()
    def training_step(self, batch, batch_idx):
        self.tags.update(batch["tag"].tolist())
        return super().training_step(batch, batch_idx)

if __name__ == "__main__":
    dm = LanceDataModule(train=LanceSource(sys.argv[1], columns=["id", "x"]), batch_size=16,
                         transform=TagRows(), num_workers=2)
    model = Recorder()
    pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=sys.argv[2]).fit(model, datamodule=dm)
    print(json.dumps({"tags": sorted(model.tags), "main": os.getpid(), "rows": len(model.seen)}))
"""


@pytest.mark.slow
def test_a_transform_defined_in_the_script_reaches_the_workers(tmp_path: Path, uri: str) -> None:
    """The lean start keeps the script's import where the workers need it (a transform defined there).
    The script runs forked from the test zygote (the process a fresh start gives, its ``__main__``
    the script, less the imports): what it tests is where the workers find the script's class."""
    (tmp_path / "train.py").write_text(_SCRIPT_TRANSFORM)
    proc = zygote.run(
        [sys.executable, str(tmp_path / "train.py"), uri, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**_env(), HANDOFF: "off"},  # every batch from the workers
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["tags"]) == 2 and report["main"] not in report["tags"], report


# -- 7. a dataset deleted and written again at the same path -----------------------------------------
def test_dataset_rewritten_at_the_same_path(tmp_path: Path) -> None:
    path = tmp_path / "again.lance"
    write_dataset(path, 100)
    first = RecordingModel()
    _trainer(tmp_path, limit_val_batches=None).validate(
        first, datamodule=LanceDataModule(val=LanceSource(str(path), columns=["id", "x"]), batch_size=40)
    )
    shutil.rmtree(path)
    write_dataset(path, 150, fragment_rows=50)  # version 1 again, other files
    second = RecordingModel()
    _trainer(tmp_path, limit_val_batches=None).validate(
        second, datamodule=LanceDataModule(val=LanceSource(str(path), columns=["id", "x"]), batch_size=40)
    )
    assert flat(first.val_seen) == list(range(100))
    assert flat(second.val_seen) == list(range(150))


# -- 8. BufferShuffle's shard default follows buffer_rows ---------------------------------------------
def test_buffer_shuffle_shard_default_follows_the_buffer(tmp_path: Path) -> None:
    assert BufferShuffle().shard_rows == 1024
    strategy = BufferShuffle(buffer_rows=800)
    assert strategy.shard_rows == 200
    assert BufferShuffle(buffer_rows=3).shard_rows == 1
    assert BufferShuffle(buffer_rows=100, shard_rows=100).shard_rows == 100  # the rule checked: <= buffer_rows
    with pytest.raises(ConfigError) as error:
        BufferShuffle(buffer_rows=100, shard_rows=101)
    assert "at most `buffer_rows` (100)" in str(error.value)
    uri = write_dataset(tmp_path / "ds.lance", 2000, fragment_rows=500)
    model = _fit(tmp_path, _dm(uri, strategy), name="A")
    assert sorted(flat(model.seen)) == list(range(2000))  # 125 whole batches of 16


# -- 9. the plan printed at start describes the version the resume reads ------------------------------
def test_plan_printed_after_resume_describes_the_repinned_version(tmp_path: Path, uri: str) -> None:
    _fit(tmp_path, _dm(uri, RowShuffle(seed=1)), name="A", ckpt_every=K, max_steps=K)
    append_rows(uri, 700)  # version 2: 1,000 rows, 62 batches
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    try:
        b = _fit(tmp_path, _dm(uri, RowShuffle(seed=1)), name="B", ckpt_path=tmp_path / "ckpt_A" / f"step={K}.ckpt")
    finally:
        logger.removeHandler(handler)
    plans = [line for line in lines if line.startswith("split 'train'")]
    assert len(plans) == 1, lines
    assert "@ version 1," in plans[0] and "rows: 300 of 300" in plans[0], plans[0]
    assert f"batches: {ROWS // BATCH} per rank" in plans[0], plans[0]
    assert (
        f"resume: data epoch 0 at row {K * BATCH} of 300 (version 1; {K} step(s) of trainer epoch 0 done)" in plans[0]
    ), plans[0]
    assert max(flat(b.seen)) < ROWS


# -- 10. fork refused; a killed worker raises WorkerDiedError ------------------------------------------
def test_fork_with_workers_is_refused(uri: str) -> None:
    with pytest.raises(ConfigError) as error:
        _dm(uri, num_workers=2, multiprocessing_context="fork")
    message = str(error.value)
    assert error.value.param == "multiprocessing_context" and "'fork'" in message and "forkserver" in message
    dm = _dm(uri)
    dm.setup("fit")
    with pytest.raises(ConfigError):
        LanceDataLoader(dm.train_dataloader().dataset, num_workers=2, multiprocessing_context="fork")
    LanceDataLoader(dm.train_dataloader().dataset, num_workers=0, multiprocessing_context="fork")  # no workers


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_killed_worker_raises_worker_died_error_through_fit(
    tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HANDOFF, "off")  # row 200 is read by a worker, never by this process
    dm = _dm(uri, transform=KillOnRow(200, os.getpid()), num_workers=2)
    model = RecordingModel()
    with pytest.raises(WorkerDiedError) as error:
        _trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    message = str(error.value)
    assert error.value.pids and f"pid {error.value.pids[0]}" in message and "SIGKILL" in message, message
    assert len(model.seen) < ROWS // BATCH


# -- 2. len after a restore, in a loop of one's own -------------------------------------------------------
@pytest.mark.parametrize("batch_after", [BATCH, 10, 24], ids=["same", "batch-down", "batch-up"])
def test_len_after_restore_is_what_the_next_iteration_yields(uri: str, batch_after: int) -> None:
    dm = _dm(uri, RowShuffle(seed=1))
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    trained = [next(batches)["id"].tolist() for _ in range(K)]
    state = loader.state_dict()
    other = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]), batch_size=batch_after, shuffle=RowShuffle(seed=1)
    )
    other.setup("fit")
    resumed = other.train_dataloader()
    resumed.load_state_dict(state)
    left = (ROWS - K * BATCH) // batch_after
    assert len(resumed) == left
    rest = [batch["id"].tolist() for batch in resumed]
    assert len(rest) == left
    assert len(set(flat(trained + rest))) == K * BATCH + left * batch_after
    assert len(resumed) == ROWS // batch_after  # the next epoch is whole
    assert len(list(resumed)) == ROWS // batch_after


# -- a transform may return any type -----------------------------------------------------------------
class TupleRecorder(RecordingModel):
    """Trains on ``(x, id, pid)`` batches; records the ids and the pids that made them."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: set[int] = set()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, ids, pids = batch
        self.pids.update(pids.tolist())
        return super().training_step({"x": x, "id": ids}, batch_idx)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_returning_a_tuple_trains_through_fit(
    tmp_path: Path, uri: str, num_workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker statistics and row positions travel beside the batch, so a tuple batch reaches the step intact
    (they rode inside the batch dict before: ``'tuple' object has no attribute 'pop'`` at the first batch)."""
    monkeypatch.setenv(HANDOFF, "off")  # with workers, every batch from them
    dm = _dm(uri, transform=ToTuple(), num_workers=num_workers)
    model = TupleRecorder()
    _trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    assert flat(model.seen) == list(range(ROWS // BATCH * BATCH)), "rows lost, repeated or out of order"
    assert (len(model.pids) == 2 and os.getpid() not in model.pids) if num_workers else model.pids == {os.getpid()}
    figures = dm.train_dataloader().metrics_snapshot().totals
    assert figures["delivered_rows"] == ROWS // BATCH * BATCH, "worker statistics did not reach the main process"
