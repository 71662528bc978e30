"""Loader-side measurements: time, rows and bytes per pipeline stage.

Guarantees:
- `StageClock` is safe to update from many reader threads at once (one lock, tiny critical
  sections) and costs two ``perf_counter`` calls per measured stage and batch.
- ``drain()`` returns the totals since the previous drain and resets them, so figures measured in
  a DataLoader worker can travel to the main process with the batches and be merged there
  without double counting.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: Reserved batch key under which worker processes send their stage totals to the main process.
STATS_KEY = "_lance_lightning_stats"


class StageClock:
    """Accumulates ``<stage>_seconds``, ``<stage>_rows`` and ``<stage>_bytes`` totals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: defaultdict[str, float] = defaultdict(float)

    def __getstate__(self) -> dict:
        return {}  # a copy sent to a worker process starts from zero

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    @contextmanager
    def measure(self, stage: str, rows: int = 0, nbytes: int = 0) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._totals[f"{stage}_seconds"] += elapsed
                self._totals[f"{stage}_rows"] += rows
                self._totals[f"{stage}_bytes"] += nbytes

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
        return totals

    def peek(self) -> dict[str, float]:
        with self._lock:
            return dict(self._totals)
