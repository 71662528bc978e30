"""Paired timing: the one home of every study's back-to-back ratio, with CPU time and quiet repetitions.

Guarantees:
- Every ratio the studies report is of two measurements taken back to back in this process (the
  machines are shared and noisy): `paired` interleaves a candidate and its baseline, alternating
  which goes first, and repeats the pair. Each side is one function returning the rows it read,
  run whole (an epoch, or a fixed number of batches) until at least ``min_seconds`` have passed
  (`rate`); both its rows per wall second and per CPU second of this process (all threads) are
  recorded, the second being less disturbed by other processes than the first.
- `Paired` holds the medians of each side and the median of the per-repetition ratios (which
  cancels slow drifts in machine load better than a ratio of medians), or, with ``blocks``, the
  median over blocks of two repetitions (one in each order) of their ratios' geometric mean;
  `Paired.cpu` is the same summary of the CPU rates.
- Quiet repetitions: `OtherLoad` measures the share of the CPUs other processes (and the
  hypervisor) used during a block; with ``quiet=N`` a repetition during which they used `QUIET` or
  more is measured again (`quiet_reps`, up to ``N * reps`` measurements); the others' share of each
  repetition kept is in `Paired.loads`.
- `iterate` makes an epoch (or its first batches) of a loader into such a function.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

#: A measurement repeats its function until it has run at least this long (short reads are noise).
MIN_SECONDS = 0.5
#: A measurement counts as quiet when others used less than this share of the CPUs during it.
QUIET = 0.05


def rate(fn: Callable[[], int], min_seconds: float = MIN_SECONDS) -> tuple[float, float]:
    """Run ``fn`` (which returns the rows it read) until ``min_seconds`` have passed: rows per wall
    second and rows per CPU second of this process (all threads)."""
    rows, started, cpu_started = 0, time.perf_counter(), time.process_time()
    while True:
        rows += fn()
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return rows / elapsed, rows / max(1e-9, time.process_time() - cpu_started)


@dataclass
class Paired:
    """Medians of a candidate and its baseline measured back to back, and the summary of their ratios."""

    rows_per_s: float
    base_rows_per_s: float
    ratio: float
    raw: list[tuple[float, float]] = field(default_factory=list)  # (candidate, baseline) rows/s
    cpu_raw: list[tuple[float, float]] = field(default_factory=list)  # the same per CPU second
    loads: list[float] = field(default_factory=list)  # others' CPU share of each repetition kept (quiet runs)
    tried: int = 0  # repetitions measured, those measured again included
    blocks: bool = False

    def raw_text(self) -> str:
        """The raw rows/s per repetition, ``candidate / baseline, ...``, as the result files list them."""
        return ", ".join(f"{c:,.0f} / {b:,.0f}" for c, b in self.raw)

    @property
    def cpu(self) -> Paired:
        """The same summary of the rows per CPU second."""
        return summary(self.cpu_raw, self.blocks)


def summary(raw: list[tuple[float, float]], blocks: bool = False, **extra: Any) -> Paired:
    """Medians of each side of ``raw`` and the median of the per-repetition ratios; with ``blocks``,
    the median over blocks of two repetitions of their ratios' geometric mean.

    Repetition ``2k`` measures the candidate first and ``2k + 1`` the baseline first, so a block
    cancels what the position in a pair costs (on a loaded machine the second measurement of a pair
    ran up to 4% slower whichever side it was, which split the per-repetition ratios into two
    clusters and left their median between them).
    """
    ratios = [c / b for c, b in raw]
    if blocks:
        ratios = [math.sqrt(ratios[i] * ratios[i + 1]) for i in range(0, len(ratios) - 1, 2)] or ratios
    return Paired(
        statistics.median(c for c, _ in raw),
        statistics.median(b for _, b in raw),
        statistics.median(ratios),
        raw,
        blocks=blocks,
        **extra,
    )


def paired(
    candidate: Callable[[], int],
    baseline: Callable[[], int],
    reps: int,
    min_seconds: float = MIN_SECONDS,
    *,
    warm: bool = False,
    quiet: int = 0,
    only_quiet: bool = False,
    blocks: bool = False,
) -> Paired:
    """``candidate`` and ``baseline`` measured back to back (`rate`) ``reps`` times, alternating which
    goes first.

    ``warm``: one untimed call before each timed side (it wakes its threads and warms its caches,
    so a side does not pay for the switch from the other). ``quiet``: repetitions measured while
    others used `QUIET` or more of the CPUs are measured again (`quiet_reps` with ``tries=quiet``;
    ``only_quiet`` keeps only the quiet ones). ``blocks``: the ratio of `summary`.
    """

    def pair(rep: int) -> tuple[tuple[float, float], tuple[float, float]]:
        order = (candidate, baseline) if rep % 2 == 0 else (baseline, candidate)
        rates = {}
        for fn in order:
            if warm:
                fn()
            rates[fn] = rate(fn, min_seconds)
        (c, c_cpu), (b, b_cpu) = rates[candidate], rates[baseline]
        return (c, b), (c_cpu, b_cpu)

    if quiet:
        results, loads, tried = quiet_reps(pair, reps, quiet, only_quiet)
    else:
        results, loads, tried = [pair(rep) for rep in range(reps)], [], reps
    wall = [w for w, _ in results]
    return summary(wall, blocks, cpu_raw=[c for _, c in results], loads=loads, tried=tried)


class OtherLoad:
    """Context manager: the share of the machine's CPUs others used while the block ran.

    Others are every other process and the hypervisor (steal time): the busy time of all CPUs
    (``/proc/stat``) minus the CPU time of this process and its children (DataLoader workers).
    ``share`` is 0 where ``/proc`` is missing.
    """

    share = 0.0

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        try:
            with open("/proc/stat") as stat:
                ticks = [int(v) for v in stat.readline().split()[1:]]
        except OSError:
            ticks = [0, 0, 0, 0, 0]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
        me = psutil.Process()
        own = 0.0
        for process in (me, *me.children(recursive=True)):
            try:
                times = process.cpu_times()
            except psutil.Error:  # a child that just exited
                continue
            own += times.user + times.system
        return time.perf_counter(), busy, own

    def __enter__(self) -> OtherLoad:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: Any) -> None:
        (w0, b0, o0), (w1, b1, o1) = self._start, self._sample()
        self.share = max(0.0, ((b1 - b0) - (o1 - o0)) / ((w1 - w0) * (os.cpu_count() or 1)))


def quiet_reps(
    measure: Callable[[int], Any], reps: int, tries: int = 2, only_quiet: bool = False
) -> tuple[list[Any], list[float], int]:
    """``measure(rep)`` for ``reps`` repetitions measured while other processes used < `QUIET` of the CPUs.

    A repetition during which they used more is measured again (keeping its ``rep``, and so its
    order of the two sides), until ``tries * reps`` measurements in all; after that every
    repetition is kept. With ``only_quiet``, ``rep`` counts the measurements, which stop at
    ``reps`` quiet ones or ``tries * reps`` in all, and only the quiet ones are kept (all of them
    when none was). Returns the results kept, the others' CPU share of each, and the number measured.
    """
    measured: list[tuple[Any, float]] = []  # every measurement and the others' share during it
    kept: list[tuple[Any, float]] = []
    while len(kept) < reps and not (only_quiet and len(measured) >= tries * reps):
        with OtherLoad() as load:
            result = measure(len(measured) if only_quiet else len(kept))
        measured.append((result, load.share))
        if load.share < QUIET or (not only_quiet and len(measured) >= tries * reps):
            kept.append((result, load.share))
    if only_quiet and not kept:
        kept = measured
    return [result for result, _ in kept], [share for _, share in kept], len(measured)


def iterate(loader: Any, batches: int | None = None) -> Callable[[], int]:
    """A function that reads one whole epoch (or its first ``batches`` batches) of ``loader`` and
    returns the rows it read (the length of each batch's first column: a dict's first value, a
    tuple's first item)."""

    def run() -> int:
        rows = 0
        it = iter(loader)
        for batch in itertools.islice(it, batches):
            rows += len(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
        if hasattr(it, "close"):
            it.close()  # stops the read-ahead threads when only the first batches were read
        return rows

    return run
