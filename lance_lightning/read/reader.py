"""Reading planned batches from Lance.

Guarantees:
- ``PlanReader.read_group(group)`` returns ``(step, table)`` for each batch of a group, in the
  group's order; each table holds exactly the batch's rows, in the planned order.
- Consecutive batches are read together in groups (``PlanReader.groups``): about
  ``GROUP_BYTES`` of rows, at most ``MAX_GROUP_ROWS``, for scan plans (never fewer rows than one batch or, for a buffer
  shuffle, than one buffer window; a whole number of groups per shard when shards are large),
  for take plans, a first group of at most 16 batches (a quick first batch, after a resume too),
  then each group twice the last, up to ``TAKE_GROUP_BYTES`` of rows (never fewer than the
  first); a take chosen for a selective filter (not for a row shuffle) reads groups of one
  ``TAKE_CALL_ROWS``-row Lance call. With a filter, whatever the method, the first group of an
  iteration is one batch, read on the consuming thread, and the next ones full size: a group of
  filtered rows spans ``1 / selectivity`` times as many rows of the table, and the first batch
  should wait neither for them nor for a reader thread to start (growing groups by doubling
  instead cost 5-10% of an epoch's time at 1% and 50% of 400,000 rows: more Lance calls).
- A scan group of one or two ranges of consecutive rows is one offset/limit scan per range, read
  in the group's order; a filtered group whose rows fill at least `SPAN_READ_DENSITY` of the rows
  they span is read as that span, in offset/limit windows whose other rows are dropped (the
  groups of a 50% filter of 400,000 rows: 106 ms of CPU, against 141 ms restricted to the rows,
  in one run); a group of more ranges is otherwise one call whatever its positions, a scan
  restricted to the wanted rows (``row_addr_allowlist``), so a group of many short ranges (small
  shards) costs one call, not one per range.
- Reads only touch the pinned dataset version, with only the planned columns. Blob columns
  (`lance_lightning.read.blobs`) are read as bytes with ``read_blobs``, one call per column per read.
- Each read is retried through transient storage errors (`lance_lightning.read.retry.RetryPolicy`);
  one that fails for good raises `DataReadError` naming the URI, version, rows and columns.
- Lance's I/O statistics of each read (bytes, requests) go to the `StageClock` measuring the
  reading thread (see `lance_lightning.metrics.clock.record_io`); I/O done on the process's dataset
  handle before an epoch's reads (planning, validation) is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa

from lance_lightning.metrics.clock import active_clock
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.read import lance_io
from lance_lightning.read.lance_io import read_positions, read_ranges, read_span
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy

#: A scan plan's read group holds about this many bytes of rows (from the plan's row estimate).
GROUP_BYTES = 8 << 20
#: ... and at most this many rows (unless a buffer window is larger).
MAX_GROUP_ROWS = 16384
#: A take plan's first read group of an iteration holds this many batches (and at most
#: ``GROUP_BYTES``): a Lance call has a fixed cost, which 4-batch groups of 64-row clumps paid every
#: 1024 rows (the RowShuffle(clump_rows=64) row of benchmarks/results/read.md).
TAKE_GROUP_BATCHES = 16
#: Each next take group doubles, up to this many bytes of rows by default (the data module's
#: ``take_group_bytes``), sorted before the take: Lance
#: decodes about one chunk per row taken when rows are sparse in the file, and neighbours in a
#: large sorted group share chunks. Memory grows with it (10^8 int64 rows: 16-batch groups read
#: 124k rows/s and grow RSS 23 MB, 1 MiB groups 729k and 62 MB, 2 MiB 1.0M and 100 MB;
#: benchmarks/results/take_groups.md).
TAKE_GROUP_BYTES = 1 << 20
#: Arrow batches inside a read hold about this many bytes (a power of two of rows, see
#: `read_batch_rows`): Lance decodes wide binary columns several times slower per row in its
#: default 8192-row batches, and narrow rows (a 128-float vector) slower in 1024-row ones
#: (``python benchmarks/probes/probe_ranges.py`` times both).
READ_BATCH_BYTES = 2 << 20
#: A scan read of at most this many ranges of consecutive rows is one offset/limit scan per range,
#: in the group's order (no sort, no allowlist); more ranges are one scan restricted to the rows.
MAX_RANGE_SCANS = 2
#: A filtered scan group whose rows fill at least this share of the rows they span is read as that
#: span (offset/limit scans, the other rows dropped: `lance_io.read_span`), else by a scan restricted
#: to its rows.
SPAN_READ_DENSITY = 0.3
#: A batch made of at most this many contiguous pieces of its group is sliced; else gathered.
MAX_SLICED_PIECES = 4


@dataclass(frozen=True)
class BatchSpec:
    """One batch to read: its index in the rank's epoch and its dataset positions, in order."""

    step: int
    positions: np.ndarray


#: The batch spec a reader's groups hold (`BatchSpec`, or a `MixtureSpec` of a mixture's reader).
Spec = TypeVar("Spec", bound=BatchSpec)


class BatchReader(Protocol[Spec]):
    """What the producer asks of a reader, whatever its plan's kind (`PlanReader`, its packed and
    clip kinds, `lance_lightning.read.mixture_reader.MixtureReader`)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def rank(self) -> int: ...

    def groups(self, steps: Iterable[int]) -> Iterator[list[Spec]]: ...

    def read_group(self, group: list[Spec]) -> list[tuple[int, pa.Table]]: ...


class PlanReader:
    """Reads one rank's batches of one epoch of a `ReadPlan`."""

    def __init__(
        self,
        plan: ReadPlan,
        epoch: int,
        world_size: int,
        rank: int,
        start: int,
        retry: RetryPolicy = DEFAULT_POLICY,
        take_group_bytes: int = TAKE_GROUP_BYTES,
    ) -> None:
        self.plan = plan
        self.retry = retry
        self.rank = rank
        self.layout = plan.layout(world_size, start)
        self.order = plan.order(epoch)
        self.group_rows = group_rows(plan, take_group_bytes)
        self.first_group_rows = iteration_first_rows(plan, self.group_rows)
        #: The first group is read on the consuming thread (`ReadAhead`'s ``inline_first``).
        self.first_inline = plan.matches is not None and self.first_group_rows < self.group_rows
        self.batch_rows = read_batch_rows(plan.row_bytes)
        opened = plan.source.opened(reads=True)
        if opened is not None and active_clock() is None:  # not inside a measured read: drop earlier I/O
            opened.io_stats_incremental()

    def spec(self, step: int) -> BatchSpec:
        return self.specs([step])[0]

    def specs(self, steps: list[int]) -> list[BatchSpec]:
        """The batches at ``steps``, their positions computed together `TAKE_GROUP_BATCHES` at a
        time (one pass over the order each: its temporaries stay small in a large group)."""
        specs: list[BatchSpec] = []
        for first in range(0, len(steps), TAKE_GROUP_BATCHES):
            block = steps[first : first + TAKE_GROUP_BATCHES]
            seqs = [self.layout.batch_rows(self.rank, step) for step in block]
            positions = self.positions(self.order.matched_indices(np.concatenate(seqs)))
            bounds = np.cumsum([len(seq) for seq in seqs])[:-1]
            specs.extend(BatchSpec(step, part) for step, part in zip(block, np.split(positions, bounds)))
        return specs

    def positions(self, matched: np.ndarray) -> np.ndarray:
        """What a batch spec holds for the matching-row indices ``matched``: dataset positions."""
        return self.plan.row_positions(matched)

    def groups(self, steps: Iterable[int]) -> Iterator[list[BatchSpec]]:
        """Consecutive batches bundled into read groups of about ``first_group_rows`` rows, each
        next group twice the last up to ``group_rows`` rows (with a filter, the second group
        ``group_rows`` rows: every Lance call costs)."""
        group: list[int] = []
        rows, limit = 0, self.first_group_rows
        for step in steps:
            group.append(step)
            rows += self.layout.batch_len(self.rank, step)
            if rows >= limit:
                yield self.specs(group)
                group, rows = [], 0
                limit = self.group_rows if self.first_inline else min(2 * limit, self.group_rows)
        if group:
            yield self.specs(group)

    def read_group(self, group: list[BatchSpec]) -> list[tuple[int, pa.Table]]:
        """Read every batch of ``group`` with one Lance call (or one per range, see
        `MAX_RANGE_SCANS`), then cut the batches out of it."""
        positions = np.concatenate([spec.positions for spec in group])
        bounds = np.cumsum([0, *(len(spec.positions) for spec in group)])
        ranges = contiguous_ranges(positions, MAX_RANGE_SCANS) if self.plan.method == "scan" else None
        if ranges is not None:
            table, index = read_ranges(self.plan.source, ranges, self.retry, self.batch_rows), None
        else:
            wanted, index = storage_index(positions)
            if self.plan.method == "scan" and self.plan.matches is not None and dense(wanted):
                table = read_span(self.plan.source, wanted, self.retry, self.batch_rows)
            else:
                table = read_positions(
                    self.plan.source,
                    wanted,
                    scan_mode=self.plan.method == "scan",
                    retry=self.retry,
                    batch_rows=self.batch_rows,
                )
        if index is not None and scattered(index, bounds):
            # A shuffle buffer: one gather puts the whole group in planned order.
            table, index = table.take(index), None
        return [
            (spec.step, cut(table, index, int(first), int(end)))
            for spec, first, end in zip(group, bounds[:-1], bounds[1:])
        ]


def group_rows(plan: ReadPlan, take_group_bytes: int = TAKE_GROUP_BYTES) -> int:
    """Rows per read group of ``plan`` (see the module docstring); a take plan's groups grow to
    ``take_group_bytes`` of rows."""
    if plan.method == "take" and plan.matches is not None and not plan.strategy.reads_by_take:
        # A selective filter's rows, in storage order: one Lance call a group, so the reader
        # threads make calls at once (a 1% filter of 400,000 rows: 33 ms an epoch, 43 ms in
        # groups of two calls, one after the other).
        return max(plan.batch_size, lance_io.TAKE_CALL_ROWS)
    if plan.method == "take":
        return max(first_group_rows(plan), take_group_bytes // max(1, plan.row_bytes))
    rows = min(MAX_GROUP_ROWS, max(plan.batch_size, GROUP_BYTES // max(1, plan.row_bytes)))
    strategy = plan.strategy
    if strategy.window_rows:
        return max(rows, strategy.window_rows)
    unit = strategy.unit_rows(plan.matched_rows)
    batches = unit // plan.batch_size
    if strategy.permute_units and rows // 4 <= unit and unit % plan.batch_size == 0:
        # Groups that tile the shards are single ranges: one offset/limit scan each.
        # A short shard comes last (`EpochOrder`), so batches before it never straddle shards.
        pieces = next(p for p in range(-(-unit // rows), batches + 1) if batches % p == 0)
        return unit // pieces
    return rows


def first_group_rows(plan: ReadPlan) -> int:
    """Rows of the first read group of an iteration of a take ``plan``: `TAKE_GROUP_BATCHES`
    batches, at most ``GROUP_BYTES`` (see the module docstring)."""
    rows = min(MAX_GROUP_ROWS, max(plan.batch_size, GROUP_BYTES // max(1, plan.row_bytes)))
    return min(rows, TAKE_GROUP_BATCHES * plan.batch_size)


def iteration_first_rows(plan: ReadPlan, rows: int) -> int:
    """Rows of the first read group of an iteration of ``plan`` (whose groups grow to ``rows``):
    one batch with a filter (a filtered group of ``n`` matches spans about ``n / selectivity``
    rows of the table, so the first batch would wait for all of them), `first_group_rows` for
    take plans, else ``rows``."""
    if plan.matches is not None:
        return min(rows, plan.batch_size)
    return first_group_rows(plan) if plan.method == "take" else rows


def read_batch_rows(row_bytes: int) -> int:
    """Rows per Arrow batch of a read: the power of two nearest `READ_BATCH_BYTES` of rows,
    between 64 and 8192."""
    rows = READ_BATCH_BYTES / max(1, row_bytes)
    return int(min(8192, max(64, 2 ** round(np.log2(rows)))))


def dense(positions: np.ndarray) -> bool:
    """Whether the sorted ``positions`` fill at least `SPAN_READ_DENSITY` of the rows they span."""
    if len(positions) == 0:
        return False
    return len(positions) >= SPAN_READ_DENSITY * (int(positions[-1]) + 1 - int(positions[0]))


def contiguous_ranges(positions: np.ndarray, most: int) -> list[tuple[int, int]] | None:
    """``positions`` as ``(first, rows)`` runs of consecutive positions, in their order; ``None``
    when there are more than ``most`` runs."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    if len(positions) == 0 or len(breaks) >= most:
        return None
    starts = [0, *breaks.tolist(), len(positions)]
    return [(int(positions[a]), b - a) for a, b in zip(starts[:-1], starts[1:])]


def storage_index(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The sorted unique ``positions`` (what to read), and where each position sits among them:
    ``None`` when ``positions`` already increase (row ``i`` of the read is position ``i``)."""
    if len(positions) < 2 or bool(np.all(positions[1:] > positions[:-1])):
        return positions, None
    order = np.argsort(positions)
    ordered = positions[order]
    repeated = ordered[1:] == ordered[:-1]
    if repeated.any():  # the padding row of a short tail can repeat a row
        wanted = ordered[np.concatenate([[True], ~repeated])]
        return wanted, np.searchsorted(wanted, positions)
    index = np.empty(len(positions), dtype=np.int64)
    index[order] = np.arange(len(positions))
    return ordered, index


def scattered(index: np.ndarray, bounds: np.ndarray) -> bool:
    """Whether some batch (rows ``bounds[i]:bounds[i+1]`` of ``index``) spans more than
    `MAX_SLICED_PIECES` runs of consecutive rows of the read."""
    breaks = np.flatnonzero(np.diff(index) != 1) + 1  # where a new run starts
    inside = np.searchsorted(breaks, bounds[1:], "left") - np.searchsorted(breaks, bounds[:-1], "right")
    return bool((inside >= MAX_SLICED_PIECES).any())


def cut(table: pa.Table, index: np.ndarray | None, first: int, end: int) -> pa.Table:
    """Rows ``first:end`` of the group out of its read ``table`` (row ``index[i]`` is group row
    ``i``; ``None``: row ``i``): one slice, or a few slices put together."""
    if index is None:
        return table.slice(first, end - first)
    rows = index[first:end]
    edges = [0, *(np.flatnonzero(np.diff(rows) != 1) + 1).tolist(), len(rows)]
    pieces = [table.slice(int(rows[a]), b - a) for a, b in zip(edges[:-1], edges[1:])]
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
