"""Faults during loading: a DataLoader worker killed mid-epoch gives a clear error, never a hang.

Workers are real processes (forkserver) reading a real Lance dataset; they are killed with
SIGKILL, as the kernel's OOM killer would. The DataLoader must notice within seconds (its SIGCHLD
handler, or its worker status check every 5 s) and raise a `RuntimeError` naming the worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback

from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from tests.helpers import RecordingModel, write_dataset

WORKER_DIED = r"DataLoader worker \(pid"


class SlowTransform:
    """Sleeps per batch in the worker, so the main process is blocked waiting when a worker dies."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


def _module(uri: str, transform: Any = None) -> LanceDataModule:
    return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=16, shuffle=RowShuffle(seed=1),
                           num_workers=2, reader_threads=1, transform=transform)


def _worker_pids(loader: Any) -> list[int]:
    iterator = loader._iterator
    assert iterator is not None, "the loader has no live multi-process iterator"
    return [worker.pid for worker in iterator._workers]


def _shutdown(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "ds.lance", 4000, fragment_rows=500)


@pytest.mark.timeout(90)
def test_worker_killed_between_batches_raises(uri: str) -> None:
    dm = _module(uri)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pids = _worker_pids(loader)
    assert len(pids) == 2 and all(pid != os.getpid() for pid in pids)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=WORKER_DIED) as error:
            os.kill(pids[0], signal.SIGKILL)
            for _ in batches:
                pass
    finally:
        _shutdown(loader)
    assert time.monotonic() - started < 15, "the dead worker was noticed too late"
    assert str(pids[0]) in str(error.value)


@pytest.mark.timeout(90)
def test_worker_killed_while_main_process_waits_raises(uri: str) -> None:
    """The main thread is blocked in ``next()`` when the worker dies (killed from another thread)."""
    dm = _module(uri, transform=SlowTransform(0.3))
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pids = _worker_pids(loader)
    killer = threading.Timer(0.5, os.kill, args=(pids[1], signal.SIGKILL))
    started = time.monotonic()
    killer.start()
    try:
        with pytest.raises(RuntimeError, match=WORKER_DIED) as error:
            for _ in batches:
                pass
    finally:
        killer.cancel()
        _shutdown(loader)
    assert time.monotonic() - started < 15
    assert str(pids[1]) in str(error.value)


class KillWorkerAt(Callback):
    """SIGKILLs one DataLoader worker of the train loader after batch ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.killed: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if batch_idx == self.at and self.killed is None:
            loader = trainer.datamodule.train_dataloader()
            self.killed = _worker_pids(loader)[0]
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_killed_during_trainer_fit_raises(uri: str, tmp_path: Path) -> None:
    dm = _module(uri)
    killer = KillWorkerAt(3)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[killer])
    model = RecordingModel()
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=WORKER_DIED) as error:
            trainer.fit(model, datamodule=dm)
    finally:
        _shutdown(dm.train_dataloader())
    assert killer.killed is not None and str(killer.killed) in str(error.value)
    assert time.monotonic() - started < 60
    assert 4 <= len(model.seen) < 4000 // 16, "training stopped at the fault, not before and not at the end"
