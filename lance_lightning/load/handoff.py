"""Worker processes start while the training process reads the epoch's first batches.

Guarantees:
- When a `LanceDataLoader`'s iteration needs worker processes that are not running (its first
  iteration, every iteration without persistent workers), it does not wait for them: it reads the
  epoch's batches in its own process, as with ``num_workers=0``, while `WorkerStart` waits on a
  background thread for the fork server to finish its imports (about 2.3 s on a 2-core VM:
  longer than a 10^5-row epoch read in process).
- Once the server is ready, the loader starts the workers itself (a fork each) with the sequence
  row of the first batch it will not read (`handover_step`: after the batches it has read ahead,
  and with a buffer shuffle at the start of a buffer, since workers that began inside one would
  read it again and every later buffer in two pieces), and hands them the rest of the epoch.
  Each batch is read once, by this process before that row and by the workers from it, in the
  plan's order: the same batches a restore from a cursor at that batch reads
  (`lance_lightning.cursor.tracker`).
- The loader looks whether the server is ready after each batch it yields, never before the
  first. An epoch this process finishes first ends by starting the workers (handing them
  nothing), so a worker that cannot start is raised there, at the latest, as it would have been
  at the first batch (`ConfigError`, `WorkerDiedError`), and the next epoch finds them running.
- Every process is started by the loader's own thread (the fork server in `WorkerStart.start`, the
  workers at the hand-over): a process started by a thread that then ends would lose its death
  signal (`lance_lightning.lifetime`). The background thread only starts an empty process through
  the fork server (the server's child, not this process's): it returns once the server has forked it.
- ``LANCE_LIGHTNING_WORKER_HANDOFF=off`` makes every iteration wait for its workers and read
  nothing in this process (for transforms that must run only in workers, and for tests that
  follow one worker).
"""

from __future__ import annotations

import os
import threading
from multiprocessing import forkserver
from typing import Any

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
    """Waits, on a background thread, until worker processes of ``context`` start without delay:
    for ``forkserver``, until the fork server has finished its imports (it forks an empty process
    then); other start methods are ready at once."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._thread = threading.Thread(target=self._wait, name="lance-lightning-worker-start", daemon=True)

    def start(self) -> WorkerStart:
        if self._forkserver:
            forkserver.ensure_running()  # on this thread (see the module docstring)
        self._thread.start()
        return self

    @property
    def _forkserver(self) -> bool:
        return self._context is not None and self._context.get_start_method() == "forkserver"

    def _wait(self) -> None:
        if not self._forkserver:
            return
        empty = self._context.Process(target=os.getpid, daemon=True)  # nothing to import
        try:
            empty.start()  # returns once the server has forked it: the server is ready
        except Exception:  # the workers' own start reports what is wrong
            return

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
