"""Consumer-side measurements: what the process iterating the loader saw.

Guarantees: `LoaderMeter` lives in the process that iterates the loader. It measures time blocked
waiting for each batch, time spent with each batch (the training step), time to the first batch.
Per batch it records one wait and one time stamp, nothing else; the totals are derived when read.
Its memory is constant (`LatencyHistogram`). A `Snapshot` is its cumulative totals at one moment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class LatencyHistogram:
    """Counts of durations in log-spaced bins: constant memory, percentiles within about ±7.5%.

    Bins span 1 µs to 10⁴ s with 16 bins per decade; shorter or longer durations go to the
    first or last bin. Recording one costs a list append (``pending``, which the recorder may
    append to directly): durations are buffered (at most `FOLD_EVERY`) and binned when the
    counts are read, in plain Python (NumPy's ufuncs release the GIL, and a busy reader thread
    then kept the training loop waiting at every read). ``counts`` is a plain list, so the
    histogram of a span is the difference of two snapshots; ``total_s`` is the sum of all durations.
    """

    PER_DECADE = 16
    LOW_EXP = -6
    BINS = 10 * PER_DECADE
    FOLD_EVERY = 4096

    def __init__(self) -> None:
        self._counts = [0] * self.BINS
        self._total_s = 0.0
        self._folded = 0
        self.pending: list[float] = []

    def record(self, seconds: float) -> None:
        self.pending.append(seconds)
        if len(self.pending) >= self.FOLD_EVERY:
            self.fold()

    @property
    def counts(self) -> list[int]:
        self.fold()
        return list(self._counts)

    @property
    def recorded(self) -> int:
        """Durations recorded so far."""
        return self._folded + len(self.pending)

    @property
    def total_s(self) -> float:
        self.fold()
        return self._total_s

    def fold(self) -> None:
        """Bin the pending durations."""
        pending = self.pending
        counts, last, shortest = self._counts, self.BINS - 1, 10.0**self.LOW_EXP
        offset, scale, log10 = -self.LOW_EXP, self.PER_DECADE, math.log10
        for seconds in pending:
            index = int((log10(seconds) + offset) * scale) if seconds > shortest else 0
            counts[index if index < last else last] += 1
        self._total_s += math.fsum(pending)
        self._folded += len(pending)
        pending.clear()

    @classmethod
    def percentile(cls, counts: list[int], q: float) -> float:
        """The ``q``-th percentile (0..100) in seconds of ``counts``; 0.0 when empty."""
        total = sum(counts)
        if total == 0:
            return 0.0
        rank = max(1, math.ceil(q / 100 * total))
        seen = 0
        for index, count in enumerate(counts):
            seen += count
            if seen >= rank:
                return 10 ** (cls.LOW_EXP + (index + 0.5) / cls.PER_DECADE)
        return 10 ** (cls.LOW_EXP + cls.BINS / cls.PER_DECADE)  # unreachable


@dataclass
class Snapshot:
    """Cumulative loader totals at one moment: meter counters, stage clock totals, fetch histogram."""

    totals: dict[str, float]
    fetch_counts: list[int] = field(default_factory=lambda: [0] * LatencyHistogram.BINS)

    def minus(self, earlier: Snapshot | None) -> Snapshot:
        """The span from ``earlier`` to this snapshot (this snapshot itself when ``earlier`` is None)."""
        return self._combine(earlier, -1)

    def plus(self, other: Snapshot | None) -> Snapshot:
        """Two spans added (of two loaders, or consecutive spans)."""
        return self._combine(other, 1)

    def _combine(self, other: Snapshot | None, sign: int) -> Snapshot:
        if other is None:
            return self
        keys = self.totals.keys() | other.totals.keys()
        return Snapshot(
            {k: self.totals.get(k, 0.0) + sign * other.totals.get(k, 0.0) for k in keys},
            [a + sign * b for a, b in zip(self.fetch_counts, other.fetch_counts)],
        )


class LoaderMeter:
    """The consumer's side of one loader, updated by the iterating thread only (no locks).

    The loader calls ``start_iteration`` when an epoch's iteration begins, ``delivered`` when it
    hands a batch over and ``end_iteration`` when the consumer asks for a batch after the last.
    ``step_end`` (called by `DataLoadingMonitor` at the end of each training step) marks when the
    step holding the latest batch ended: it closes the last step of an iteration the consumer
    left before its end (e.g. ``limit_train_batches``).

    Per batch only the wait is recorded (in the `fetch` histogram) and the hand-off time kept.
    The loop time of an iteration runs from its start to its end (or, while it runs, to the
    step's end or now); the time spent holding batches is that loop time less the waits.
    """

    def __init__(self) -> None:
        self.fetch = LatencyHistogram()  # waits for batches, first batch of each iteration excluded
        self.iterations = 0  # iterations that delivered a first batch
        self.first_s = 0.0  # waiting for the first batch of each iteration (startup)
        self.last_first_s = 0.0
        self.ready_sum = 0
        self.ready_samples = 0
        self._loop_s = 0.0  # loop time of the ended iterations
        self._start = 0.0  # the running iteration's start
        self._running = False
        self._first = False  # the next batch is the running iteration's first
        self._handoff = 0.0  # when the latest batch was handed over
        self._mark = 0.0
        self._waits = self.fetch.pending

    def start_iteration(self, now: float) -> None:
        self._close(self._mark if self._mark > self._handoff else self._handoff)
        self._start = now
        self._running = True
        self._first = True

    def end_iteration(self, now: float) -> None:
        """The consumer asked for a batch at ``now`` and the iteration had none left."""
        self._close(now)

    def _close(self, end: float) -> None:
        if self._running and not self._first:
            self._loop_s += end - self._start
        self._running = False

    def delivered(self, asked: float, now: float) -> None:
        """A batch asked for at ``asked`` reached the consumer at ``now``."""
        if self._first:
            self._first = False
            self.first_s += now - asked
            self.last_first_s = now - asked
            self.iterations += 1
        else:
            self._waits.append(now - asked)
            if len(self._waits) >= LatencyHistogram.FOLD_EVERY:
                self.fetch.fold()
        self._handoff = now

    def workers_ready(self, batches: int) -> None:
        self.ready_sum += batches
        self.ready_samples += 1

    def step_end(self, now: float) -> None:
        self._mark = now

    def totals(self, now: float) -> dict[str, float]:
        loop = self._loop_s
        if self._running and not self._first:
            loop += (self._mark if self._mark > self._handoff else now) - self._start
        wait = self.fetch.total_s
        return {
            "batches": self.iterations + self.fetch.recorded,
            "wait_s": wait,
            "step_s": max(0.0, loop - wait - self.first_s),
            "first_s": self.first_s,
            "iterations": self.iterations,
            "workers_ready_sum": self.ready_sum,
            "workers_ready_samples": self.ready_samples,
        }
