"""Resident memory as the studies measure it: this process, and with ``children`` its descendants.

Guarantees:
- `rss` is the resident set size in bytes of this process, plus, with ``children``, every process
  below it (DataLoader workers, the fork server); a child that exits while it is read counts 0.
- `RssSampler` samples `rss` on a daemon thread every ``interval`` seconds and keeps the peak since
  its last `RssSampler.reset`, which takes one sample itself, so a window's peak includes its two
  ends.
"""

from __future__ import annotations

import threading

import psutil

#: How the samplers read memory (a result file says it).
SOURCE = "psutil"


def rss(children: bool = True) -> int:
    """Resident bytes of this process and, with ``children``, of every process below it."""
    process = psutil.Process()
    total = process.memory_info().rss
    if children:
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:  # a worker that just exited
                pass
    return total


class RssSampler:
    """Samples `rss` on a thread; keeps the peak since `reset`."""

    source = SOURCE

    def __init__(self, interval: float, children: bool) -> None:
        self.interval = interval
        self.children = children
        self.peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def rss(self) -> int:
        return rss(self.children)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            value = self.rss()
            with self._lock:
                self.peak = max(self.peak, value)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self) -> int:
        """The peak since the last reset (including one sample now); starts a new window."""
        value = self.rss()
        with self._lock:
            peak, self.peak = max(self.peak, value), value
        return peak
