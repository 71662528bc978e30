"""Returning the heap's free pages to the OS after an epoch, so RSS stays flat from epoch to epoch.

Guarantees: `HEAP.after_epoch()` calls glibc ``malloc_trim`` at most once per interval; where there
is no glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from typing import Any


class HeapTrimmer:
    """Returns the heap pages malloc holds free to the OS (glibc ``malloc_trim``; elsewhere nothing).

    Batches are allocated on the reader threads and freed by the consumer, in another order: the
    holes they leave in the threads' malloc arenas stay resident, so the peak RSS crept up from
    epoch to epoch (+8% over 8 epochs with 16 decoded batches in flight, in the memory rows of
    the transforms study, ``python -m benchmarks run transforms``, before this trimmer). ``after_epoch()`` trims
    at most once per `interval_s`: the pages a trim returns are faulted in again by the next
    epoch, which costs a few percent of a sub-second epoch but nothing measurable of a long one.
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()
        self._libc = _load_libc()

    def after_epoch(self) -> None:
        now = time.monotonic()
        if self._libc is not None and now - self._last >= self.interval_s:
            self._libc.malloc_trim(0)
            self._last = now


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


#: The heap trimmer of this process (the heap is per process).
HEAP = HeapTrimmer()
