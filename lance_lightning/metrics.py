"""Loader-side measurements: time, rows and bytes per pipeline stage, and what the consumer saw.

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
  dataset as it hands the batch on. In a worker process they travel with that batch, so the main
  process counts them as the batch arrives.
- `LoaderMeter` lives in the process that iterates the loader. It measures the consumer's side:
  time blocked waiting for each batch, time spent with each batch (the training step), time to
  the first batch. Per batch it records one wait and one time stamp, nothing else; the totals
  are derived when read. Its memory is constant (`LatencyHistogram`).
- `figures(later.minus(earlier))` turns two cumulative `Snapshot`s into named, always finite
  figures (`FIGURES`); the same names are logged by `DataLoadingMonitor` and read by the report.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

#: Reserved batch key under which worker processes send their stage totals to the main process.
STATS_KEY = "_lance_lightning_stats"

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
        self.__init__(state.get("enabled", True))

    def measure(self, stage: str, rows: int = 0, nbytes: int = 0) -> Any:
        """Context manager adding the block's duration, ``rows`` and ``nbytes`` to ``stage``."""
        if not self.enabled:
            return _NULL
        return _Measure(self, stage, rows, nbytes)

    def _add_stage(self, stage: str, elapsed: float, rows: int, nbytes: int) -> None:
        keys = _STAGE_KEYS.get(stage) or _STAGE_KEYS.setdefault(
            stage, (f"{stage}_seconds", f"{stage}_rows", f"{stage}_bytes"))
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
        counts, last, shortest = self._counts, self.BINS - 1, 10.0 ** self.LOW_EXP
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
        return Snapshot({k: self.totals.get(k, 0.0) + sign * other.totals.get(k, 0.0) for k in keys},
                        [a + sign * b for a, b in zip(self.fetch_counts, other.fetch_counts)])


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
            "batches": self.iterations + self.fetch.recorded, "wait_s": wait,
            "step_s": max(0.0, loop - wait - self.first_s), "first_s": self.first_s,
            "iterations": self.iterations, "workers_ready_sum": self.ready_sum,
            "workers_ready_samples": self.ready_samples,
        }


def batch_size_and_bytes(batch: Any) -> tuple[int, int]:
    """Rows and payload bytes of a batch: tensors, lists of bytes/str, tensor-like pairs."""
    from torch import Tensor as _Tensor  # imported by whoever made the batch (materialize never does)

    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else (batch,)
    rows = nbytes = 0
    for value in values:
        if isinstance(value, _Tensor):
            nbytes += value.nbytes
            if not rows and value.ndim:
                rows = value.shape[0]
        elif isinstance(value, list):
            rows = rows or len(value)
            try:
                nbytes += sum(map(len, value))
            except TypeError:
                pass
        elif isinstance(getattr(value, "values", None), _Tensor):  # e.g. a Ragged column
            nbytes += value.values.nbytes + getattr(value, "offsets", value.values).nbytes
            rows = rows or len(value)
    return rows, nbytes


def row_bytes(batch: Mapping[str, Any]) -> int | None:
    """Payload bytes per row of ``batch`` when every value is a tensor with one row per first-dim
    entry (then any batch converted from the same columns has ``rows * row_bytes`` bytes); else None."""
    from torch import Tensor as _Tensor

    nbytes = rows = 0
    for value in batch.values():
        if not isinstance(value, _Tensor) or not value.ndim or (rows and value.shape[0] != rows):
            return None
        rows = value.shape[0]
        nbytes += value.nbytes
    return nbytes // rows if rows and nbytes % rows == 0 else None


# -- figures ---------------------------------------------------------------------------------
#: Figure name -> meaning. Every figure is finite (0 when there is nothing to measure).
FIGURES: dict[str, str] = {
    "epochs": "iterations over the loader (epochs) started in the span",
    "batches": "batches delivered to the consumer",
    "rows": "rows delivered to the consumer",
    "seconds": "wall time of the consumer loop: waiting for batches plus holding them",
    "rows_per_s": "rows delivered per second of loop time (rows / seconds)",
    "bytes_per_s": "bytes of batch payload delivered per second of loop time",
    "wait_fraction": "share of the step cycle spent waiting for data: wait_s / (wait_s + step_s)",
    "wait_s": "time the consumer blocked waiting for batches (first batch of each epoch excluded)",
    "step_s": "time the consumer held batches (the training step and its hooks)",
    "first_batch_s": "time to the first batch of an epoch (mean over epochs started in the span)",
    "fetch_p50_ms": "median time waiting for one batch (first batch excluded)",
    "fetch_p99_ms": "99th percentile of the time waiting for one batch",
    "io_wait_s": "time reader threads spent in Lance reads (summed over threads and workers)",
    "io_bytes": "bytes read from storage (Lance I/O statistics)",
    "io_requests": "read requests to storage (Lance I/O statistics)",
    "io_mb_per_s": "effective I/O bandwidth: io_bytes / io_wait_s, in MB/s per reader thread",
    "decode_s": "time in decode/transform (summed over threads and workers)",
    "convert_s": "time converting Arrow to tensors (summed over threads and workers)",
    "other_s": "time in any other measured stage (e.g. pinning memory)",
    "prefetch_ready": "items (read groups, or batches with a transform) ready in the read-ahead queue "
                      "when the consumer asked (mean)",
    "prefetch_slots": "size of that read-ahead queue (mean)",
    "bad_rows": "rows the bad-row policy replaced",
    "workers_ready": ("batches the worker processes finished that had not reached the main process when "
                      "the consumer asked (mean): batches in transfer"),
}

#: Clock stages, by the figure they count towards.
STAGE_FIGURES = {"read": "io_wait_s", "transform": "decode_s", "decode": "decode_s", "augment": "decode_s",
                 "convert": "convert_s"}


def figures(span: Snapshot) -> dict[str, float]:
    """The `FIGURES` of a span (``after.minus(before)``): every name present, every value finite."""
    t = span.totals
    g = t.get
    batches = g("batches", 0.0)
    wait, step, first = g("wait_s", 0.0), g("step_s", 0.0), g("first_s", 0.0)
    seconds = wait + step + first
    stages = {"io_wait_s": 0.0, "decode_s": 0.0, "convert_s": 0.0, "other_s": 0.0}
    for key, value in t.items():
        if key.endswith("_seconds"):
            stages[STAGE_FIGURES.get(key[: -len("_seconds")], "other_s")] += value
    iterations = g("iterations", 0.0)
    out = {
        "epochs": iterations,
        "batches": batches,
        "rows": g("delivered_rows", 0.0),
        "seconds": seconds,
        "rows_per_s": _ratio(g("delivered_rows", 0.0), seconds),
        "bytes_per_s": _ratio(g("delivered_bytes", 0.0), seconds),
        "wait_fraction": _ratio(wait, wait + step),
        "wait_s": wait,
        "step_s": step,
        "first_batch_s": _ratio(first, iterations),
        "fetch_p50_ms": 1e3 * LatencyHistogram.percentile(span.fetch_counts, 50),
        "fetch_p99_ms": 1e3 * LatencyHistogram.percentile(span.fetch_counts, 99),
        "io_bytes": g("io_bytes", 0.0),
        "io_requests": g("io_requests", 0.0),
        "io_mb_per_s": _ratio(g("io_bytes", 0.0), stages["io_wait_s"]) / 1e6,
        **stages,
        "prefetch_ready": _ratio(g("prefetch_ready", 0.0), g("prefetch_polls", 0.0)),
        "prefetch_slots": _ratio(g("prefetch_slots", 0.0), g("prefetch_polls", 0.0)),
        "bad_rows": g("bad_rows", 0.0),
        "workers_ready": _ratio(g("workers_ready_sum", 0.0), g("workers_ready_samples", 0.0)),
    }
    return {name: float(out[name]) for name in FIGURES}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0
