"""Faults during loading: dead workers and datasets that change under a running fit.

- A DataLoader worker killed mid-epoch gives a clear error, never a hang. Workers are real
  processes (forkserver) reading a real Lance dataset; they are killed with SIGKILL, as the
  kernel's OOM killer would. The DataLoader must notice within a second once no batch can come
  (its worker check, `WORKER_CHECK_S`: the workers are the fork server's children, so no SIGCHLD
  reaches it) and raise `WorkerDiedError` naming the worker and signal.
- Workers forced to read (``LANCE_LIGHTNING_WORKER_CHOICE=workers``) that die as they start stop
  the fit in its first epoch with `WorkerDiedError`, however short its epochs, in process and on
  2 DDP ranks through the CLI.
- Workers that cannot start (a script without ``if __name__ == "__main__":``, which every worker
  runs again on import) end the run with an error that names the fix, never a hang or a bare
  ``BrokenPipeError``.
- A dataset that gets new versions during training (rows appended, overwritten, deleted, mid-epoch
  and between epochs) does not change what the run reads: it reads the version pinned at setup,
  exactly as a run on an unchanged copy does; resuming from a checkpoint after the dataset moved on
  re-pins the checkpoint's version and trains exactly the rest.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

from lance_lightning import LanceDataModule, LanceSource, RowShuffle, WorkerDiedError
from lance_lightning.load.forked_server import ENV_SWITCH as FORKED_SERVER
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.loader import SIGTERM_GRACE_S
from lance_lightning.load.race import CHOICE_SWITCH
from lance_lightning.load.workers import WORKER_CHECK_S
from tests import zygote
from tests.harness import ckpt_file, fit
from tests.helpers import RecordingModel, WaitsForForkServer, append_rows, flat, make_table, write_dataset
from tests.race_cli import fit_config
from tests.worker_probe import DiesOnArrival

WORKER_DIED = r"DataLoader worker \(pid"


class SlowTransform:
    """Sleeps per batch in the worker, so the main process is blocked waiting when a worker dies."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


def _module(uri: str, transform: Any = None) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]),
        batch_size=16,
        shuffle=RowShuffle(seed=1),
        num_workers=2,
        reader_threads=1,
        transform=transform,
    )


def _worker_pids(loader: Any) -> list[int]:
    iterator = loader._iterator
    assert iterator is not None, "the loader has no live multi-process iterator"
    return [worker.pid for worker in iterator._workers]


def _shutdown(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


#: Rows of the `uri` fixture's dataset.
ROWS = 4000


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=500)


#: A user's script with no ``if __name__ == "__main__":`` guard; its transform optionally carries
#: ``big`` bytes, so that the parent is still writing a worker's start-up data when the worker dies.
_UNGUARDED_SCRIPT = """
import sys
import numpy as np
from lance_lightning import LanceDataModule, LanceSource

class Carry:
    def __init__(self, size):
        self.table = np.ones(size, dtype=np.uint8)

    def __call__(self, batch):
        return batch

dm = LanceDataModule(train=LanceSource(sys.argv[1]), batch_size=16, num_workers=2, transform=Carry(int(sys.argv[2])))
dm.setup("fit")
print(sum(1 for _ in dm.train_dataloader()))
"""


@pytest.mark.slow  # forkserver workers in a subprocess
@pytest.mark.parametrize(
    ("carried", "error"),
    [
        (1, "WorkerDiedError"),  # the start-up data is sent before the worker fails: it exits with an error
        (1 << 27, "ConfigError"),  # the worker fails while the parent still writes: BrokenPipeError
    ],
    ids=["small", "large"],
)
def test_workers_of_a_script_without_a_main_guard_fail_naming_the_fix(
    uri: str, tmp_path: Path, carried: int, error: str
) -> None:
    """The stock fork server's workers import the script, so they run its unguarded code; a forked
    server's workers hold it as it was (`lance_lightning.load.forked_server`), so the same script reads.

    The script runs forked from the test zygote (`tests.zygote.run`: the process a fresh start gives,
    its ``__main__`` the script, less the imports); the stock server is a fresh interpreter either
    way, and its workers import the script by path as they would under a fresh start."""
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED_SCRIPT)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if carried == 1:  # the forked server, once
        forked = zygote.run([sys.executable, str(script), uri, str(carried)], text=True, timeout=300, env=env)
        assert forked.returncode == 0 and forked.stdout.split() == [str(ROWS // 16)], forked.stderr[-3000:]
    done = zygote.run(
        [sys.executable, str(script), uri, str(carried)], text=True, timeout=300, env={**env, FORKED_SERVER: "off"}
    )
    assert done.returncode != 0
    # The script's own error; the other worker may print its traceback after it (CI run of 1939a95).
    raised = [line for line in done.stderr.splitlines() if line.startswith(f"lance_lightning.errors.{error}: ")]
    assert len(raised) == 1, done.stderr[-3000:]
    assert 'if __name__ == "__main__":' in raised[0] and "num_workers=0" in raised[0], raised[0]


@pytest.mark.slow  # forkserver workers: 10-20 s on 2 busy cores
@pytest.mark.timeout(90)
def test_worker_killed_between_batches_raises(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HANDOFF, "off")  # one worker is followed from the first batch
    dm = _module(uri)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pids = _worker_pids(loader)
    assert len(pids) == 2 and all(pid != os.getpid() for pid in pids)
    started = time.monotonic()
    try:
        with pytest.raises(WorkerDiedError, match=WORKER_DIED) as error:
            os.kill(pids[0], signal.SIGKILL)
            for _ in batches:
                pass
    finally:
        _shutdown(loader)
    assert time.monotonic() - started < 15, "the dead worker was noticed too late"
    assert str(pids[0]) in str(error.value) and "SIGKILL" in str(error.value)


@pytest.mark.slow  # forkserver workers: 10-20 s on 2 busy cores
@pytest.mark.timeout(90)
def test_worker_killed_while_main_process_waits_raises(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The main thread is blocked in ``next()`` when the worker dies (killed from another thread)."""
    monkeypatch.setenv(HANDOFF, "off")  # one worker is followed from the first batch
    dm = _module(uri, transform=SlowTransform(0.1))
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pids = _worker_pids(loader)
    killer = threading.Timer(0.5, os.kill, args=(pids[1], signal.SIGKILL))
    started = time.monotonic()
    killer.start()
    try:
        with pytest.raises(WorkerDiedError, match=WORKER_DIED) as error:
            for _ in batches:
                pass
    finally:
        killer.cancel()
        _shutdown(loader)
    # Never a hang: the loader notices a dead forkserver worker when no data arrives for
    # `WORKER_CHECK_S`, so the live worker's outstanding runs (up to 2 messages of 0.1 s batches
    # here) come first. 0.1 s a batch still keeps the main thread waiting in ``next()`` nearly all
    # the time (it only counts the batches).
    assert time.monotonic() - started < 60
    assert str(pids[1]) in str(error.value) and "SIGKILL" in str(error.value)


class HeldAfterFirst:
    """Holds every batch after the first in the worker while the file ``gate`` exists."""

    def __init__(self, gate: str) -> None:
        self.gate = gate
        self.seen = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.seen += 1
        while self.seen > 1 and os.path.exists(self.gate):
            time.sleep(0.01)
        return batch


@pytest.mark.slow  # forkserver workers
@pytest.mark.timeout(90)
def test_a_worker_killed_while_the_other_is_held_is_reported_well_before_torchs_check(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No batch can come (the live worker is held): the dead worker is noticed at the loader's next
    check (`WORKER_CHECK_S`), not after torch's 5 s (``MP_STATUS_CHECK_INTERVAL``): a fork server's
    workers send no SIGCHLD to this process."""
    monkeypatch.setenv(HANDOFF, "off")  # one worker is followed from the first batch
    gate = tmp_path / "hold"
    gate.touch()
    dm = _module(uri, transform=HeldAfterFirst(str(gate)))
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pids = _worker_pids(loader)
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(pids[1], signal.SIGKILL)
        killed_at.append(time.monotonic())

    killer = threading.Timer(0.3, kill)
    killer.start()
    try:
        with pytest.raises(WorkerDiedError, match=WORKER_DIED) as error:
            for _ in batches:
                pass
        noticed = time.monotonic() - killed_at[0]
    finally:
        killer.cancel()
        gate.unlink()
        _shutdown(loader)
    assert WORKER_CHECK_S < MP_STATUS_CHECK_INTERVAL / 4
    assert noticed < MP_STATUS_CHECK_INTERVAL / 2, f"the dead worker was noticed {noticed:.1f} s after it died"
    assert str(pids[1]) in str(error.value) and "SIGKILL" in str(error.value)


class KillWorkerAt(Callback):
    """SIGKILLs one DataLoader worker of the train loader after batch ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.killed: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.at and self.killed is None:
            loader = trainer.datamodule.train_dataloader()
            self.killed = _worker_pids(loader)[0]
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_killed_during_trainer_fit_raises(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_kwargs: dict
) -> None:
    monkeypatch.setenv(HANDOFF, "off")  # one worker is followed from the first batch
    dm = _module(uri)
    killer = KillWorkerAt(3)
    trainer = pl.Trainer(**trainer_kwargs, max_epochs=1, callbacks=[killer])
    model = RecordingModel()
    started = time.monotonic()
    try:
        with pytest.raises(WorkerDiedError, match=WORKER_DIED) as error:
            trainer.fit(model, datamodule=dm)
    finally:
        _shutdown(dm.train_dataloader())
    assert killer.killed is not None and f"pid {killer.killed}" in str(error.value) and "SIGKILL" in str(error.value)
    assert time.monotonic() - started < 60
    assert 4 <= len(model.seen) < 4000 // 16, "training stopped at the fault, not before and not at the end"


class SigtermWorkerAt(Callback):
    """SIGTERMs one DataLoader worker of the train loader after batch ``at``, and this process
    ``later`` seconds after that (None: never), as a job's SIGTERM that reaches the trainer last."""

    def __init__(self, at: int, later: float | None) -> None:
        self.at, self.later = at, later
        self.killed: int | None = None
        self.timer: threading.Timer | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx != self.at or self.killed is not None:
            return
        self.killed = _worker_pids(trainer.datamodule.train_dataloader())[0]
        os.kill(self.killed, signal.SIGTERM)
        if self.later is not None:
            self.timer = threading.Timer(self.later, os.kill, args=(os.getpid(), signal.SIGTERM))
            self.timer.start()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("later", [1.5, None], ids=["trainer-signalled-later", "trainer-never-signalled"])
def test_workers_killed_by_sigterm_before_the_trainer_stop_the_fit_as_sigterm_does(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_kwargs: dict, later: float | None
) -> None:
    """A worker dies of SIGTERM before the trainer receives its own (a scheduler signals every
    process of a job, not all at once): the loader notices within `WORKER_CHECK_S`, waits for the
    trainer's SIGTERM (`SIGTERM_GRACE_S`) and stops the fit as Lightning stops it on SIGTERM. A
    trainer that never receives one gets `WorkerDiedError` naming SIGTERM once the grace passed."""
    assert later is None or WORKER_CHECK_S < later < SIGTERM_GRACE_S
    monkeypatch.setenv(HANDOFF, "off")  # one worker is followed from the first batch
    dm = _module(uri)
    killer = SigtermWorkerAt(3, later)
    trainer = pl.Trainer(**trainer_kwargs, max_epochs=1, callbacks=[killer])
    model = RecordingModel()
    expected = SIGTERMException if later is not None else WorkerDiedError
    try:
        with pytest.raises(expected) as error:
            trainer.fit(model, datamodule=dm)
    finally:
        if killer.timer is not None:  # a fit that ended first must not be signalled after it
            killer.timer.cancel()
            killer.timer.join()
        _shutdown(dm.train_dataloader())
    assert 4 <= len(model.seen) < 4000 // 16, "training stopped at the fault, not before and not at the end"
    if later is None:
        assert f"pid {killer.killed}" in str(error.value) and "SIGTERM" in str(error.value)
        assert error.value.exitcodes == [-signal.SIGTERM]  # type: ignore[attr-defined]
    else:
        assert isinstance(error.value.__cause__, WorkerDiedError), "the stop names the workers' death as its cause"


def test_a_worker_died_error_keeps_its_pids_and_exit_codes_across_processes() -> None:
    """Pickled (a DDP rank's error, a Ray worker's), the error keeps what a handler reads."""
    error = pickle.loads(pickle.dumps(WorkerDiedError("died", [11, 12], [-signal.SIGTERM, 3])))
    assert (str(error), error.pids, error.exitcodes) == ("died", [11, 12], [-signal.SIGTERM, 3])


# -- workers that die as they start ------------------------------------------------------------------
#: Rows a batch. Epochs of 2 batches leave the workers nothing after what this process read ahead
#: (their empty read runs before its last batch); epochs of 12 hand them the rest of the epoch.
DIES_BATCH = 8


class ServerWaiting(WaitsForForkServer, RecordingModel):
    """`RecordingModel` whose fit waits for the fork server before its first batch."""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("epoch_batches", "persistent", "choice"),
    [(2, False, "workers"), (12, True, "workers"), (40, False, "race")],
    ids=["forced, 2 per epoch", "forced, 12 persistent", "race, 40 per epoch"],
)
def test_workers_that_die_as_they_start_stop_the_fit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trainer_kwargs: dict,
    epoch_batches: int,
    persistent: bool,
    choice: str,
) -> None:
    """#51: workers that die as they start stop a `Trainer.fit` with `WorkerDiedError` when their
    batches are needed. Forced to the workers
    (``LANCE_LIGHTNING_WORKER_CHOICE=workers``), in the first epoch, however short: workers started each
    epoch and handed nothing, or persistent and handed the rest. Before, an epoch shorter than the
    race's window was read whole in process and its workers were started after its last batch,
    which Lightning never asks past: a 3-epoch fit ended without an error, its workers never
    started. With the race as shipped, a transform that holds the GIL 30 ms a batch in this process (the
    race counts its CPU time) opens the gate at the measured window: the
    hand-over starts the workers mid-epoch (the model waits for the fork server before its first
    batch, `WaitsForForkServer`: the gate opens in the first epoch)."""
    monkeypatch.setenv(CHOICE_SWITCH, choice)
    uri = write_dataset(tmp_path / "ds.lance", epoch_batches * DIES_BATCH)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]),
        batch_size=DIES_BATCH,
        num_workers=2,
        persistent_workers=persistent,
        transform=DiesOnArrival(0.03 if choice == "race" else 0.0),
    )
    model = ServerWaiting()
    trainer = pl.Trainer(**trainer_kwargs, max_epochs=3)
    with pytest.raises(WorkerDiedError, match="exited with code 3"):
        trainer.fit(model, datamodule=dm)
    trained, rows = flat(model.seen), epoch_batches * DIES_BATCH
    assert trained == [i % rows for i in range(len(trained))], "the batches before the error are not the fit's first"
    assert 0 < len(model.seen) < epoch_batches, "the error did not stop the first epoch"


def _two_rank_cli_fit(tmp_path: Path, steps: int, epochs: int, transform: str) -> zygote.Grouped:
    """``lance-lightning fit`` on 2 DDP ranks (gloo) with 2 workers forced and ``transform``, epochs
    of ``steps`` batches a rank; each rank logs its trained rows to ``rows.rank<r>``."""
    uri = write_dataset(tmp_path / "ds.lance", 2 * steps * DIES_BATCH)
    config = fit_config(
        tmp_path,
        uri,
        model="tests.scenarios.test_race_as_shipped.RowLog",
        devices=2,
        epochs=epochs,
        batch=DIES_BATCH,
        workers=2,
        transform=transform,
        every=100,
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    env.update({CHOICE_SWITCH: "workers", "PYTHONPATH": root})
    return zygote.run_in_session(
        [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        timeout=240,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_two_rank_ddp_cli_fit_forced_to_workers_that_die_as_they_start_fails_naming_them(tmp_path: Path) -> None:
    """The same through ``lance-lightning fit`` on 2 DDP ranks (gloo), epochs of 3 batches a rank:
    the run exits with an error naming the dead workers, never a hang, and trains no epoch whole."""
    done = _two_rank_cli_fit(tmp_path, 3, 3, "{class_path: tests.worker_probe.DiesOnArrival}")
    assert not done.timed_out, done.output[-4000:]
    assert done.returncode != 0 and "WorkerDiedError" in done.output, done.output[-4000:]
    assert "exited with code 3" in done.output, done.output[-4000:]
    for rank in range(2):
        log = tmp_path / f"rows.rank{rank}"
        steps = log.read_text().splitlines() if log.exists() else []
        assert len(steps) < 3, f"rank {rank} trained its first epoch whole"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_on_one_ddp_rank_mid_epoch_ends_the_cli_fit_naming_it(tmp_path: Path) -> None:
    """``lance-lightning fit`` on 2 DDP ranks (gloo), workers forced: one worker of rank 1 is
    SIGKILLed mid-epoch (`tests.worker_probe.KilledOnRank`). The run exits with an error naming
    `WorkerDiedError` and SIGKILL, never a hang (rank 0 waits in a collective for rank 1), and
    rank 1 does not train its epoch whole."""
    transform = "{class_path: tests.worker_probe.KilledOnRank, init_args: {rank: 1, after: 3}}"
    done = _two_rank_cli_fit(tmp_path, 12, 2, transform)
    assert not done.timed_out, done.output[-4000:]
    assert done.returncode != 0 and "WorkerDiedError" in done.output, done.output[-4000:]
    assert "was killed by SIGKILL" in done.output, done.output[-4000:]
    log = tmp_path / "rows.rank1"
    steps = log.read_text().splitlines() if log.exists() else []
    assert len(steps) < 12, "rank 1 trained its first epoch whole"


# -- datasets that get new versions during training --------------------------------------------------
CHANGE_ROWS, CHANGE_BATCH = 600, 16  # filter label < 8: 480 rows, 30 steps per epoch


def _append(uri: str) -> None:
    append_rows(uri, 200)


def _overwrite(uri: str) -> None:
    lance.write_dataset(make_table(300, start=10_000), uri, mode="overwrite")


def _delete(uri: str) -> None:
    lance.dataset(uri).delete("id % 3 = 0")


class ChangeDataset(Callback):
    """Writes a new version of the dataset at given global steps (mid-epoch) and at epoch ends."""

    def __init__(self, uri: str, at_steps: dict[int, Any], at_epoch_end: dict[int, Any]) -> None:
        self.uri = uri
        self.at_steps = at_steps
        self.at_epoch_end = at_epoch_end
        self.done: list[str] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        change = self.at_steps.get(trainer.global_step)
        if change is not None and f"step {trainer.global_step}" not in self.done:
            change(self.uri)
            self.done.append(f"step {trainer.global_step}")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        change = self.at_epoch_end.get(trainer.current_epoch)
        if change is not None:
            change(self.uri)
            self.done.append(f"end of epoch {trainer.current_epoch}")


def _changing_module(uri: str, num_workers: int) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], filter="label < 8"),
        batch_size=CHANGE_BATCH,
        shuffle=RowShuffle(seed=4),
        num_workers=num_workers,
        persistent_workers=False,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_new_versions_during_training_do_not_change_what_the_run_reads(tmp_path: Path, num_workers: int) -> None:
    """Append, overwrite and delete mid-epoch and between epochs; compare with a run on an unchanged copy.

    With ``num_workers=2`` and ``persistent_workers=False`` new worker processes open the dataset
    in the second epoch, after the changes: they must still read the pinned version. The baseline
    reads with ``num_workers=0`` (the order does not depend on the number of workers).
    """
    changing = write_dataset(tmp_path / "changing.lance", CHANGE_ROWS, fragment_rows=150)
    unchanged = write_dataset(tmp_path / "unchanged.lance", CHANGE_ROWS, fragment_rows=150)
    changes = ChangeDataset(
        changing, at_steps={3: _append, 10: _delete, 40: _overwrite, 52: _append}, at_epoch_end={0: _delete}
    )
    dm = _changing_module(changing, num_workers)
    run = fit(tmp_path, dm, name="changing", max_epochs=2, callbacks=[changes])
    baseline = fit(tmp_path, _changing_module(unchanged, 0), name="unchanged", max_epochs=2)

    assert changes.done == ["step 3", "step 10", "end of epoch 0", "step 40", "step 52"]
    assert lance.dataset(changing).version == 6, "every change wrote a new version"
    assert dm.plans["train"].source.version == 1
    assert run.seen_epochs == baseline.seen_epochs and len(set(run.seen_epochs)) == 2
    assert run.seen == baseline.seen, "the run read rows of a version written during training"
    assert max(flat(run.seen)) < CHANGE_ROWS and all(i % 10 < 8 for i in flat(run.seen))


@pytest.mark.timeout(240)
def test_resume_after_the_dataset_moved_on_repins_the_checkpoint_version(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", CHANGE_ROWS, fragment_rows=150)
    k = 50  # mid second epoch (steps 31..60)
    whole = fit(tmp_path, _changing_module(uri, 0), name="whole", max_epochs=2)
    first = fit(tmp_path, _changing_module(uri, 0), name="first", max_epochs=2, max_steps=k, ckpt_every=k)
    assert first.seen == whole.seen[:k]
    for change in (_overwrite, _append, _delete):
        change(uri)
    latest = lance.dataset(uri)
    assert latest.version == 4 and latest.count_rows() < CHANGE_ROWS
    dm = _changing_module(uri, 0)
    rest = fit(tmp_path, dm, name="rest", max_epochs=2, ckpt_path=ckpt_file(tmp_path, "first", k))
    assert dm.plans["train"].source.version == 1, "the checkpoint's version was not re-pinned"
    assert first.seen + rest.seen == whole.seen, "the resumed run did not train exactly the rest"
    assert rest.seen_epochs == whole.seen_epochs[k:]
