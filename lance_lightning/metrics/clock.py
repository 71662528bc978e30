"""Reader-side measurements: time, rows and bytes per pipeline stage, in any process.

Guarantees:
- `StageClock` is safe to update from many reader threads at once (one lock, tiny critical
  sections) and costs two ``perf_counter`` calls per measured block: a read group, or a batch
  when a transform runs per batch. A disabled clock (``enabled=False``) measures nothing, and
  stays disabled in worker processes.
- ``drain()`` returns the totals since the previous drain and resets them, so figures measured in
  a DataLoader worker can travel to the main process with the batches and be merged there
  without double counting.
- While a thread is inside ``clock.measure(...)``, `record_io` adds Lance's I/O statistics to that
  clock: bytes and requests read are attributed to the loader that read them, in any process.
- Rows and payload bytes of each batch are measured on the reader threads and counted as
  delivered (the clock's ``delivered_rows``/``delivered_bytes``) by the thread iterating the
  dataset as it hands the batch on. In a worker process they travel beside that batch, so the main
  process counts them as the batch arrives.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

_NULL = nullcontext()
_STAGE_KEYS: dict[str, tuple[str, str, str]] = {}
_ACTIVE = threading.local()  # the clock whose `measure` block the current thread is in


class StageClock:
    """Accumulates ``<stage>_seconds``, ``<stage>_rows`` and ``<stage>_bytes`` totals.

    Other totals (``io_bytes``, ``io_requests``, ``prefetch_ready``, ...) are added by name. The
    ``delivered_rows`` and ``delivered_bytes`` counters are updated, without the lock, only by the
    thread that iterates the dataset, which is also the only one to read or drain them.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._totals: defaultdict[str, float] = defaultdict(float)
        self.delivered_rows = 0
        self.delivered_bytes = 0

    def __getstate__(self) -> dict:
        return {"enabled": self.enabled}  # a copy sent to a worker process starts from zero

    def __setstate__(self, state: dict) -> None:
        StageClock.__init__(self, state.get("enabled", True))

    def measure(self, stage: str, rows: int = 0, nbytes: int = 0) -> Any:
        """Context manager adding the block's duration, ``rows`` and ``nbytes`` to ``stage``."""
        if not self.enabled:
            return _NULL
        return _Measure(self, stage, rows, nbytes)

    def _add_stage(self, stage: str, elapsed: float, rows: int, nbytes: int) -> None:
        keys = _STAGE_KEYS.get(stage) or _STAGE_KEYS.setdefault(
            stage, (f"{stage}_seconds", f"{stage}_rows", f"{stage}_bytes")
        )
        with self._lock:
            totals = self._totals
            totals[keys[0]] += elapsed
            totals[keys[1]] += rows
            totals[keys[2]] += nbytes

    def add(self, name: str, value: float) -> None:
        with self._lock:
            self._totals[name] += value

    def merge(self, totals: Mapping[str, float]) -> None:
        with self._lock:
            for name, value in totals.items():
                self._totals[name] += value

    def drain(self) -> dict[str, float]:
        with self._lock:
            totals, self._totals = dict(self._totals), defaultdict(float)
        self._add_delivered(totals)
        self.delivered_rows = self.delivered_bytes = 0
        return totals

    def peek(self) -> dict[str, float]:
        with self._lock:
            totals = dict(self._totals)
        self._add_delivered(totals)
        return totals

    def _add_delivered(self, totals: dict[str, float]) -> None:
        if self.delivered_rows:
            totals["delivered_rows"] = totals.get("delivered_rows", 0.0) + self.delivered_rows
            totals["delivered_bytes"] = totals.get("delivered_bytes", 0.0) + self.delivered_bytes


class _Measure:
    """One measured block (a class, not a generator: this runs per batch on the reader threads)."""

    __slots__ = ("clock", "stage", "rows", "nbytes", "outer", "start")

    def __init__(self, clock: StageClock, stage: str, rows: int, nbytes: int) -> None:
        self.clock, self.stage, self.rows, self.nbytes = clock, stage, rows, nbytes

    def __enter__(self) -> None:
        self.outer = getattr(_ACTIVE, "clock", None)
        _ACTIVE.clock = self.clock
        self.start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        elapsed = time.perf_counter() - self.start
        _ACTIVE.clock = self.outer
        self.clock._add_stage(self.stage, elapsed, self.rows, self.nbytes)


def active_clock() -> StageClock | None:
    """The enabled clock measuring the current thread's stage, if any."""
    clock = getattr(_ACTIVE, "clock", None)
    return clock if clock is not None and clock.enabled else None


def record_io(dataset: Any) -> None:
    """Add the I/O ``dataset`` did since the last call to the clock measuring this thread.

    Uses ``io_stats_incremental()``, which counts scans and takes alike. It is per dataset handle,
    and reader threads share one handle per process: a delta may include another thread's reads,
    but every byte is counted exactly once, so the totals are right. Without an active clock it
    does nothing (the I/O is counted by the next measured read on the handle).
    """
    clock = active_clock()
    if clock is None:
        return
    try:
        stats = dataset.io_stats_incremental()
    except AttributeError:  # not a Lance dataset
        return
    clock.merge({"io_bytes": stats.read_bytes, "io_requests": stats.read_iops})
