"""Worker processes start in the background while the training process reads the first batches.

Guarantees:
- When a `LanceDataLoader`'s iteration needs worker processes that are not running (its first
  iteration, every iteration without persistent workers, or after an epoch that ended before
  they were up), it does not wait for them: `WorkerStart` builds torch's worker iterator on a
  background thread while the loader reads the epoch's batches in its own process, as with
  ``num_workers=0`` (the fork server's imports alone take about 2.3 s on a 2-core VM, longer than
  a 10^5-row epoch read in process).
- The workers wait at their dataset's gate (`EpochControl`), reading nothing, until the loader
  hands them the rest of the epoch: `hand_over` publishes the epoch and the sequence row of the
  first batch this process will not read, then opens the gate. Each batch is read once, by this
  process before that row and by the workers from it, in the plan's order: the same batches a
  restore from a cursor at that batch would read (`lance_lightning.cursor.tracker`).
- The loader looks whether the workers are up after each batch it yields, never before the
  first. It hands over after the batches it has read ahead (`handover_step`), and with a buffer
  shuffle at the start of a buffer: workers that began inside one would read it again, and every
  later buffer in two pieces. An epoch this process finishes before they are up ends by waiting for them (handing them
  nothing): a worker that failed to start is raised there, at the latest, as it would have been
  at the first batch (`ConfigError`, `WorkerDiedError`), and the next epoch finds them running.
  An iteration abandoned while they start leaves them waiting for the next one. ``release`` lets
  waiting workers go (their loader is gone), so torch shuts them down at once instead of after
  its 5 s join timeout.
- A process that exits while workers are still starting waits for them to start and stops them
  (an exit hook), so no worker is left unpickling its start-up data after the process is gone.
- ``LANCE_LIGHTNING_WORKER_HANDOFF=off`` makes every iteration wait for its workers and read
  nothing in this process (for transforms that must run only in workers, and for tests that
  follow one worker).
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from lance_lightning.load.dataset import EpochControl
from lance_lightning.plan.layout import Layout

ENV_SWITCH = "LANCE_LIGHTNING_WORKER_HANDOFF"


def handoff_enabled() -> bool:
    """Whether loaders read in process while their workers start (``LANCE_LIGHTNING_WORKER_HANDOFF``)."""
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("off", "0", "false", "no")


def handover_step(layout: Layout, least: int, window_rows: int | None) -> int:
    """The step the workers begin at: ``least``, or with windows of ``window_rows`` sequence rows
    (a buffer shuffle's) the first step from ``least`` that starts a window, when one does within a
    window's steps."""
    if not window_rows:
        return least
    last = min(layout.steps, least + window_rows // layout.step_rows + 1)
    for step in range(least, last + 1):
        if (layout.start + layout.rows_after(step)) % window_rows == 0:
            return step
    return least


class WorkerStart:
    """torch's worker iterator, built on a background thread; its workers wait at the gate.

    ``build`` makes the iterator (starting the worker processes); ``control`` is the dataset's
    epoch control that the workers read.
    """

    def __init__(self, build: Callable[[], Iterator[Any]], control: EpochControl) -> None:
        self._control = control
        self._iterator: Iterator[Any] | None = None
        self._error: BaseException | None = None
        control.close_gate()
        self._thread = threading.Thread(target=self._build, args=(build,), name="lance-lightning-worker-start")
        self._thread.daemon = True

    def start(self) -> WorkerStart:
        _PENDING.add(self)
        self._thread.start()
        return self

    def _build(self, build: Callable[[], Iterator[Any]]) -> None:
        try:
            self._iterator = build()
        except BaseException as error:  # raised again by `hand_over`, on the loader's thread
            self._error = error

    def ready(self) -> bool:
        """Whether the workers are up (or failed to start: `hand_over` raises why)."""
        return not self._thread.is_alive()

    def hand_over(self, epoch: int, start: int) -> Iterator[Any]:
        """torch's iterator, its workers reading epoch ``epoch`` from sequence row ``start``."""
        self._thread.join()
        _PENDING.discard(self)
        if self._error is not None:
            self._control.release()
            raise self._error
        self._control.open_gate(epoch, start)
        assert self._iterator is not None
        return self._iterator

    def stop(self) -> None:
        """Let waiting workers go without reading (the loader is gone)."""
        self._control.release()

    def finish(self) -> None:
        """Let the workers go, wait until they have started, and stop them (at exit)."""
        self.stop()
        self._thread.join()
        shutdown = getattr(self._iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


#: Worker starts not yet handed over, finished at exit.
_PENDING: weakref.WeakSet[WorkerStart] = weakref.WeakSet()


@atexit.register
def _finish_pending() -> None:
    for start in list(_PENDING):
        start.finish()
