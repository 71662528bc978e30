"""A pace for the fork server's imports, for diagnosis (#51).

Guarantees:
- Inside `ImportPacer(share)`, before the thread that entered it looks up each module to import,
  it sleeps until that thread's CPU time since entering is at most ``share`` of the wall time
  since entering; other threads' imports are never delayed. On leaving, nothing of it is left in
  ``sys.meta_path``. It finds no module itself. A share of 1 paces nothing (it is not entered into
  ``sys.meta_path`` at all).
- `import_share` reads ``LANCE_LIGHTNING_FORKSERVER_IMPORT_SHARE``: a share of one core in (0, 1]
  that the fork server's yielding imports may use (`lance_lightning.load._forkserver`); unset or
  anything else 1, no pace (the default). Why it exists: with the race reading a GIL-holding
  transform in process while its server imported, a pace of 0.05 kept every epoch at 0.90x or
  more of ``num_workers=0`` where the unpaced imports cost up to 0.71x
  (benchmarks/results/worker_gate_gil_reps5.md, worker_gate_gil_share005.md); the imports then
  take at least twenty times their CPU time, so the workers take over that much later.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import Any

#: The share of one core the fork server's yielding imports may use (`import_share`).
IMPORT_SHARE_ENV = "LANCE_LIGHTNING_FORKSERVER_IMPORT_SHARE"


def import_share() -> float:
    """`IMPORT_SHARE_ENV` as a share in (0, 1]; 1 where it is unset or not such a number."""
    try:
        share = float(os.environ.get(IMPORT_SHARE_ENV, "1"))
    except ValueError:
        return 1.0
    return share if 0 < share <= 1 else 1.0


class ImportPacer:
    """A ``sys.meta_path`` entry, while entered, that paces the entering thread's imports to ``share``."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.slept = 0.0
        self._thread = threading.get_ident()
        self._cpu = self._wall = 0.0

    def __enter__(self) -> ImportPacer:
        self._thread = threading.get_ident()
        self._cpu, self._wall = time.thread_time(), time.monotonic()
        if self.share < 1:
            sys.meta_path.insert(0, self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self.share < 1:
            sys.meta_path.remove(self)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self._thread:
            delay = self._wall + (time.thread_time() - self._cpu) / self.share - time.monotonic()
            if delay > 0:
                time.sleep(delay)
                self.slept += delay
        return None
