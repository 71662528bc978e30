"""DataLoader worker processes that die mid-epoch give a clear error, never a hang.

Guarantees:
- `guard_workers` wraps a DataLoader's multi-process iterator: when a worker process dies
  mid-epoch (e.g. SIGKILL by the out-of-memory killer), the consumer gets `WorkerDiedError`, a
  `RuntimeError` naming the worker's pid and how it died, instead of a bare
  ``ConnectionResetError``/``EOFError`` from the batch it was handing over, or PyTorch's own
  ``DataLoader worker (pid(s) ...) exited unexpectedly`` / ``is killed by signal`` errors (the
  latter raised by PyTorch's SIGCHLD handler wherever the main thread is, e.g. in a training
  step: that handler is wrapped so that it raises `WorkerDiedError` too).
- The loader never hangs. Workers forked by a fork server are its children, not this process's,
  so no SIGCHLD reaches this process when they die: the loader's iterator
  (`WatchedWorkersIterator`) checks that its workers live whenever no batch has arrived for
  `WORKER_CHECK_S` (PyTorch's own iterator checks after 5 s). The live workers' batches already
  asked for (``prefetch_factor`` messages each) are received first: a dead worker is reported
  within `WORKER_CHECK_S` of the last of them (`tests/scenarios/test_faults.py`).
- A worker that exits with an error code failed in Python before it could report the error
  (usually while starting, e.g. a script without ``if __name__ == "__main__":``): its
  `WorkerDiedError` says so and gives the fix (`STARTING_HINT`), not advice about memory.
"""

from __future__ import annotations

import signal
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from lance_lightning.errors import WorkerDiedError

T = TypeVar("T")

#: Seconds the loader waits for a batch from its workers before it checks that they live.
WORKER_CHECK_S = 0.5

#: What usually stops a worker process as it starts, and the fix.
STARTING_HINT = (
    "Each worker imports the main script: a script that runs its training code on import makes every "
    'worker try to start workers of its own. Put that code under `if __name__ == "__main__":`, or set '
    "num_workers=0 (reader threads need no worker processes)"
)

#: DataLoader iterators with worker processes, for the SIGCHLD handler to name a dead worker.
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()


def how_it_ended(exitcode: int | None) -> str:
    """A process's end from its exit code (negative: the signal that killed it), for a message."""
    if exitcode is None:
        return "exited"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the kernel's out-of-memory killer sends SIGKILL when memory runs out)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


class WatchedWorkersIterator(_MultiProcessingDataLoaderIter):
    """PyTorch's multi-process iterator, checking its workers live each `WORKER_CHECK_S` without a
    batch (PyTorch's waits 5 s; a user's ``timeout`` still bounds the whole wait, as in PyTorch)."""

    def _try_get_data(self, timeout: float = WORKER_CHECK_S) -> tuple[bool, Any]:
        return super()._try_get_data(timeout)


def dead_workers(workers: Sequence[Any], wait_s: float = 1.0) -> list[Any]:
    """The worker processes of ``workers`` that are dead (waiting up to ``wait_s`` for the kernel)."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [w for w in workers if w.exitcode is not None]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


def worker_died_error(workers: Sequence[Any], error: BaseException) -> WorkerDiedError | None:
    """A `WorkerDiedError` if one of ``workers`` died (``error`` is what the consumer got), else None."""
    dead = dead_workers(workers)
    if not dead:
        return None
    pids, exitcodes = [int(w.pid) for w in dead], [int(w.exitcode) for w in dead]
    what = "; ".join(f"pid {w.pid} {how_it_ended(w.exitcode)}" for w in dead)
    if any(w.exitcode is not None and w.exitcode > 0 for w in dead):
        return WorkerDiedError(
            f"DataLoader worker (pid {', '.join(map(str, pids))}) died: {what} ({type(error).__name__}: {error}). "
            f"A worker that exits with an error failed before it could report it here, usually while "
            f"starting: its traceback is printed above. {STARTING_HINT}",
            pids,
            exitcodes,
        )
    return WorkerDiedError(
        f"DataLoader worker (pid {', '.join(map(str, pids))}) died mid-epoch: {what}. The batch it was handing "
        f"over was lost ({type(error).__name__}: {error}). Resume from the last checkpoint: the data cursor "
        "continues exactly after the last trained batch. If memory ran out, lower num_workers, "
        "prefetch_factor, prefetch_batches or batch_size.",
        pids,
        exitcodes,
    )


def guard_workers(iterator: Iterator[T]) -> Iterator[T]:
    """``iterator`` (a DataLoader iterator), raising `WorkerDiedError` when a worker process died.

    Returns ``iterator`` itself when it has no worker processes.
    """
    workers = list(getattr(iterator, "_workers", None) or [])
    if not workers:
        return iterator
    _WATCHED.add(iterator)
    _wrap_sigchld_handler()
    return _guarded(iterator, workers)


def _about_workers(error: RuntimeError) -> bool:
    """Whether ``error`` is PyTorch's report of a worker process that exited."""
    return not isinstance(error, WorkerDiedError) and str(error).startswith("DataLoader worker")


def _wrap_sigchld_handler() -> None:
    """Make PyTorch's SIGCHLD handler (set when workers start) raise `WorkerDiedError`."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous) or getattr(previous, "_wraps_worker_errors", False):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as error:
            if not _about_workers(error):
                raise
            for iterator in list(_WATCHED):
                died = worker_died_error(list(getattr(iterator, "_workers", None) or []), error)
                if died is not None:
                    raise died from error
            raise

    handler._wraps_worker_errors = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)


def _guarded(iterator: Iterator[T], workers: list[Any]) -> Iterator[T]:
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except (OSError, EOFError, RuntimeError) as error:  # e.g. a dead worker's shared tensor, torch's check
            if isinstance(error, RuntimeError) and not _about_workers(error):
                raise
            died = worker_died_error(workers, error)
            if died is not None:
                raise died from error
            raise
        yield item
