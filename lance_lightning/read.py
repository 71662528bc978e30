"""Reading planned batches from Lance.

Guarantees:
- ``PlanReader.batches(steps)`` yields ``(step, table)`` for the given batch indices of one rank,
  in the order given; each table holds exactly the batch's rows, in the planned order.
- Consecutive batches are read together in groups of about ``group_rows`` rows: their positions
  are sorted and split into runs; long runs (and runs with short gaps, in scan mode) are read
  with offset/limit scans, which Lance pushes down, and the rest with one ``take`` per group.
- Reads only touch the pinned dataset version, with only the planned columns.
- Each read is retried through transient storage errors (`lance_lightning.retry.RetryPolicy`);
  one that fails for good raises `DataReadError` naming the URI, version, rows and columns.
- Lance's I/O statistics of each read (bytes, requests) go to the `StageClock` measuring the
  reading thread (see `lance_lightning.metrics.record_io`); I/O done on the process's dataset
  handle before an epoch's reads (planning, validation) is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lance_lightning.metrics import active_clock, record_io
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.retry import DEFAULT_POLICY, RetryPolicy, describe_rows
from lance_lightning.source import PinnedSource

#: Runs at least this long are scanned even in take mode.
SCAN_MIN_ROWS = 512
#: In scan mode, runs of at least this many wanted rows are scanned.
SCAN_SMALL_RUN = 64
#: In scan mode, runs separated by at most this many unwanted rows are read as one range.
SCAN_MERGE_GAP = 256


@dataclass(frozen=True)
class BatchSpec:
    """One batch to read: its index in the rank's epoch and its dataset positions, in order."""

    step: int
    positions: np.ndarray


class PlanReader:
    """Reads one rank's batches of one epoch of a `ReadPlan`."""

    def __init__(self, plan: ReadPlan, epoch: int, world_size: int, rank: int, start: int,
                 group_rows: int = 16384, retry: RetryPolicy = DEFAULT_POLICY) -> None:
        self.plan = plan
        self.retry = retry
        self.rank = rank
        self.layout = plan.layout(world_size, start)
        self.order = plan.order(epoch)
        self.group_rows = group_rows if plan.method == "scan" else min(group_rows, 4 * plan.batch_size)
        if active_clock() is None:  # not inside a measured read: drop I/O done before this epoch
            try:
                plan.source.open().io_stats_incremental()
            except AttributeError:
                pass

    def spec(self, step: int) -> BatchSpec:
        seq = self.layout.batch_rows(self.rank, step)
        return BatchSpec(step, self.plan.row_positions(self.order.matched_indices(seq)))

    def groups(self, steps: Iterable[int]) -> Iterator[list[BatchSpec]]:
        """Consecutive batches bundled into read groups of about ``group_rows`` rows."""
        group: list[BatchSpec] = []
        rows = 0
        for step in steps:
            spec = self.spec(step)
            group.append(spec)
            rows += len(spec.positions)
            if rows >= self.group_rows:
                yield group
                group, rows = [], 0
        if group:
            yield group

    def read_group(self, group: list[BatchSpec]) -> list[tuple[int, pa.Table]]:
        """Read every batch of ``group`` with as few Lance calls as the positions allow."""
        wanted = np.unique(np.concatenate([spec.positions for spec in group]))
        table = read_positions(self.plan.source, wanted, scan_mode=self.plan.method == "scan", retry=self.retry)
        out = []
        for spec in group:
            index = np.searchsorted(wanted, spec.positions)
            if len(index) and index[-1] - index[0] == len(index) - 1 and np.all(np.diff(index) == 1):
                out.append((spec.step, table.slice(int(index[0]), len(index))))
            else:
                out.append((spec.step, table.take(pa.array(index))))
        return out


def read_positions(source: PinnedSource, positions: np.ndarray, scan_mode: bool,
                   retry: RetryPolicy = DEFAULT_POLICY) -> pa.Table:
    """Rows at the sorted, unique ``positions`` of the pinned version, in that order (retried)."""
    what = describe_rows(positions, "scan" if scan_mode else "take", source.columns)
    return retry.call(lambda: _read_positions(source, positions, scan_mode), what=what, uri=source.uri,
                      version=source.version)


def _read_positions(source: PinnedSource, positions: np.ndarray, scan_mode: bool) -> pa.Table:
    dataset = source.open()
    columns = list(source.columns)
    breaks = np.flatnonzero(np.diff(positions) > (SCAN_MERGE_GAP if scan_mode else 0) + 1) + 1
    runs = np.split(positions, breaks)
    scanned = [len(run) >= (SCAN_SMALL_RUN if scan_mode else SCAN_MIN_ROWS) for run in runs]
    taken_runs = [run for run, scan in zip(runs, scanned) if not scan]
    taken = dataset.take(np.concatenate(taken_runs), columns=columns) if taken_runs else None
    pieces, cursor = [], 0
    for run, scan in zip(runs, scanned):
        if scan:
            first, span = int(run[0]), int(run[-1] - run[0] + 1)
            ranged = dataset.scanner(columns=columns, offset=first, limit=span).to_table()
            pieces.append(ranged if span == len(run) else ranged.take(pa.array(run - first)))
        else:
            pieces.append(taken.slice(cursor, len(run)))
            cursor += len(run)
    record_io(dataset)
    return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
