"""Transforms that report from inside DataLoader worker processes (light: no Lightning import).

DataLoader workers started with ``forkserver`` import the module of the transform; this module
imports only the standard library and torch, so whatever else a worker has imported came with the
objects pickled to it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import get_worker_info


def imported_here(name: str) -> bool:
    """Whether this process or the stock fork server it came from imported module ``name``: it is
    loaded and was not inherited from the training process by a forked server
    (`lance_lightning.load.forked_server.INHERITED`: those cost it no import)."""
    from lance_lightning.load.forked_server import INHERITED

    return name in sys.modules and name not in INHERITED


class RecordModules:
    """Adds ``lightning_imported`` (1 per row if the process imported Lightning: `imported_here`),
    ``forked`` (1 if its fork server was forked from the training process) and ``pid``."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from lance_lightning.load.forked_server import INHERITED

        rows = len(batch["id"])
        imported = any(imported_here(name) for name in list(sys.modules) if name.split(".")[0] == "lightning")
        batch["forked"] = torch.full((rows,), int(bool(INHERITED)))
        batch["lightning_imported"] = torch.full((rows,), int(imported))
        batch["pid"] = torch.full((rows,), os.getpid())
        return batch


class KillOnRow:
    """SIGKILLs its own process when a batch holds row id ``row``, unless it is ``main_pid``."""

    def __init__(self, row: int, main_pid: int) -> None:
        self.row = row
        self.main_pid = main_pid

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if os.getpid() != self.main_pid and self.row in batch["id"].tolist():
            os.kill(os.getpid(), signal.SIGKILL)
        return batch


class ToTuple:
    """Returns ``(x, id, pid)`` instead of a dict: a transform may change the batch type."""

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return batch["x"], batch["id"], torch.full((len(batch["id"]),), os.getpid())


class WidenRows:
    """Adds ``wide``: float32 per row, each the row's id, at least ``min_width`` per row and enough
    that every batch passes ``batch_bytes``: by default 1 MiB (each batch leaves a worker through a
    shared-memory slab of its own); ``WidenRows(98304, 1)`` makes batches of about 96 KiB, whose
    runs share a slab (`lance_lightning.produce.parcel.slab_run`)."""

    def __init__(self, batch_bytes: int = 1 << 20, min_width: int = 1200) -> None:
        self.batch_bytes = batch_bytes
        self.min_width = min_width

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["id"])
        width = max(self.min_width, -(-self.batch_bytes // (4 * max(1, rows))) + 1)
        batch["wide"] = batch["id"].to(torch.float32)[:, None].expand(-1, width).contiguous()
        return batch


def hold_gil(seconds: float) -> None:
    """Run Python (holding the GIL, as a user's per-row loop does) for ``seconds`` of wall time."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class RecordProcess:
    """Adds ``pid``: the process that made the batch; outside DataLoader workers runs Python that
    holds the GIL for ``main_delay_s`` a batch (`hold_gil`), so a training process reading while
    its workers start is slower than they are, and the race counts that time as its transform's
    (`lance_lightning.load.race.Rates.gil_share`: a sleep would count nothing)."""

    def __init__(self, main_delay_s: float = 0.0) -> None:
        self.main_delay_s = main_delay_s

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.main_delay_s and get_worker_info() is None:
            hold_gil(self.main_delay_s)
        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch


class DiesOnArrival(RecordProcess):
    """`RecordProcess` that makes the process that unpickles it, unless it is the one that made it,
    exit with code 3: a DataLoader worker that dies as it starts, before it sends anything. (Each
    DDP rank of a CLI fit makes its own from the config; a copy made in the same process lives on.)"""

    def __init__(self, main_delay_s: float = 0.0) -> None:
        super().__init__(main_delay_s)
        self.made_in = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.made_in:
            os._exit(3)


class KilledOnRank(RecordProcess):
    """`RecordProcess` whose DataLoader worker on DDP rank ``rank`` SIGKILLs itself as it makes its
    ``after``-th batch, as the out-of-memory killer ends one worker on one node."""

    def __init__(self, rank: int = 1, after: int = 3) -> None:
        super().__init__()
        self.rank, self.after, self.made = rank, after, 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        info = get_worker_info()
        if info is not None and getattr(info.dataset, "rank", 0) == self.rank:
            self.made += 1
            if self.made >= self.after:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


class SlowInWorkers(RecordProcess):
    """`RecordProcess` running Python that holds the GIL ``main_s`` a batch outside DataLoader
    workers (`hold_gil`), and sleeping ``worker_s`` a batch in them, so that the workers lose every
    trial of the race whatever the load. The race weighs the transform's CPU seconds against the
    loop thread's (`lance_lightning.load.race.Rates.gil_share`), so with ``main_s`` well above a
    step's CPU time the share opens the gate (40% or above for 2 workers,
    `lance_lightning.load.race.START_GAIN`) even where a loaded machine gives the spin a fraction
    of a core, while the workers, at ``worker_s / num_workers`` a batch, deliver slower than this
    process by far more than `lance_lightning.load.race.MARGIN`: the spin ends at its wall-clock
    deadline and a sleep does not stretch with the load as a step's do, so both sides' rates are
    bounded by the same training loop, and two workers at 100 ms a batch never deliver 1.15x a
    process at 40 ms. Sleeping costs the workers no core on a loaded machine. `worker_trials` and
    `check_retrial_schedule` read the trials off a fit's steps."""

    def __init__(self, main_s: float = 0.04, worker_s: float = 0.2, wait_for_server: bool = False) -> None:
        super().__init__(main_delay_s=main_s)
        self.worker_s = worker_s
        #: On its first call in the training process, wait for the fork server the data module
        #: started at ``setup`` (seconds of imports), so that a short fit's race still runs its
        #: trials (a test's model may wait at ``on_train_start`` instead).
        self.wait_for_server = wait_for_server

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if get_worker_info() is not None:
            time.sleep(self.worker_s)
        elif self.wait_for_server:
            from lance_lightning.load.handoff import WorkerStart  # in the training process only
            from lance_lightning.load.lean_start import worker_context

            WorkerStart(worker_context("forkserver", self)).start().wait()
            self.wait_for_server = False
        return super().__call__(batch)


class PythonRows:
    """A transform that holds the GIL as users' pure-Python ones do: a loop per row (a checksum of
    its ``vec`` values, ``rounds`` times; about 25 ms a batch of 8 on an idle core) adding
    ``checksum``, and ``pid``: the process that made the batch."""

    def __init__(self, rounds: int = 2000) -> None:
        self.rounds = rounds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        sums = []
        for row in batch["vec"].tolist():
            total = 0.0
            for _ in range(self.rounds):
                for value in row:
                    total = (total * 31 + value) % 1_000_003
            sums.append(total)
        batch["checksum"] = torch.tensor(sums)
        batch["pid"] = torch.full((len(sums),), os.getpid())
        return batch


class RecordImports:
    """Adds ``imported``: per row, one flag per module of ``names`` (1 if the process imported it:
    `imported_here`), and ``pid``: the process that made the batch."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["id"])
        flags = [int(imported_here(name)) for name in self.names]
        batch["imported"] = torch.tensor(flags, dtype=torch.int64).expand(rows, -1).clone()
        batch["pid"] = torch.full((rows,), os.getpid())
        return batch


def worker_trials(steps: Iterable[tuple[int, bool]]) -> list[tuple[int, int]]:
    """The workers' trials in a fit's steps, given in order as (epoch, made by a worker): each run
    of consecutive steps made by workers, as (the epoch of its first step, the epoch of its last:
    the one its trial was lost in, when this process made the steps after it)."""
    trials: list[tuple[int, int]] = []
    previous = False
    for epoch, by_worker in steps:
        if by_worker and not previous:
            trials.append((epoch, epoch))
        elif by_worker:
            trials[-1] = (trials[-1][0], epoch)
        previous = by_worker
    assert not previous, "a worker made the fit's last batch: the workers won a trial made to be lost"
    return trials


def check_retrial_schedule(trials: list[tuple[int, int]], last_epoch: int) -> None:
    """Each trial after the first begins ``2**i`` whole epochs after the epoch in which trial ``i``
    (from 0) was lost (after 1, 2, 4, ... epochs read in process:
    `lance_lightning.load.race.Race.retrial_due`), and none that was due by ``last_epoch`` is missing."""
    assert trials, "the workers never had a trial"
    for i, ((_, lost), (begun, _)) in enumerate(zip(trials, trials[1:])):
        assert begun == lost + 1 + 2**i, f"trial {i + 2} began in epoch {begun}, not {lost + 1 + 2**i}: {trials}"
    due = trials[-1][1] + 1 + 2 ** (len(trials) - 1)
    assert due > last_epoch, f"a trial due in epoch {due} never ran: {trials}"


def report_priority(connection: Any) -> None:
    """Sends, from a process the fork server forked, its own nice value, the one the server's
    imports ran at and the seconds their pace slept (`lance_lightning.load._forkserver.IMPORT_NICE`,
    ``IMPORT_SLEPT``, inherited with its memory)."""
    server = sys.modules.get("lance_lightning.load._forkserver")
    connection.send(
        {
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "import_nice": getattr(server, "IMPORT_NICE", None),
            "import_slept": getattr(server, "IMPORT_SLEPT", None),
        }
    )
    connection.close()


def _multiprocessing_locks() -> list[Any]:
    """The locks ``multiprocessing`` takes to start a process through its fork server."""
    from multiprocessing import forkserver, resource_tracker

    return [forkserver._forkserver._lock, resource_tracker._resource_tracker._lock]  # type: ignore[attr-defined]


def _free(lock: Any) -> bool:
    """Whether ``lock`` can be taken within 10 s (it is released again)."""
    if not lock.acquire(timeout=10):
        return False
    lock.release()
    return True


class ReportServer:
    """Adds ``report``: a list of one JSON object describing the process that made the batch: its
    pid, its parent, whether it holds modules from a forked server (`lance_lightning.load.forked_server`),
    its handlers of SIGTERM, SIGUSR1 and SIGINT, and whether ``multiprocessing``'s locks are free."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from lance_lightning.load.forked_server import INHERITED

        def handler(sig: signal.Signals) -> str:
            found = signal.getsignal(sig)
            if found == signal.SIG_DFL:
                return "default"
            return "KeyboardInterrupt" if found is signal.default_int_handler else repr(found)

        report = {
            "pid": os.getpid(),
            "parent": os.getppid(),
            "inherited": bool(INHERITED),
            "sigterm": handler(signal.SIGTERM),
            "sigusr1": handler(signal.SIGUSR1),
            "sigint": handler(signal.SIGINT),
            "locks_free": all(_free(lock) for lock in _multiprocessing_locks()),
        }
        batch["report"] = [json.dumps(report, sort_keys=True)]
        return batch
