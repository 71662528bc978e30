"""The two public dataset styles, usable with a plain ``torch.utils.data.DataLoader``.

Guarantees:
- `LanceIterableDataset` yields ready batches (dicts of column -> tensor/list) of one rank, for
  the epoch and start row set with ``set_epoch``. DataLoader worker ``w`` of ``K`` yields the
  rank's batches ``w, w+K, ...`` so the round-robin DataLoader keeps the planned order. The epoch
  lives in shared memory, so persistent workers see each new epoch.
- Batches are prepared ahead on background threads (`BatchProducer`): read groups on one pool,
  convert + transform (decoding) per batch on another, in order. Memory is bounded per process
  by ``prefetch_groups`` read groups of raw Arrow rows plus ``prefetch_batches`` finished
  (decoded) batches, in flight or waiting; ``threads=0`` turns prefetching off. The same
  threads serve every epoch (`ReaderThreads`) and finished epochs return the heap's free pages
  to the OS (`HeapTrimmer`), so RSS stays flat from epoch to epoch.
- A row the transform rejects is handled by the bad-row policy (`lance_lightning.badrows`):
  raise naming the dataset row, or replace it deterministically; batch sizes never change.
- `LanceMapDataset` maps index ``i`` to the ``i``-th matching row of a pinned source; its
  batched ``__getitems__`` reads a whole batch with one planned read, never row by row.
- Both read only the pinned version and convert per batch (see `lance_lightning.convert`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from lance_lightning.badrows import POSITIONS_KEY, BadRowGuard, BadRowPolicy, RaiseOnBadRow
from lance_lightning.device import pin_batch
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.rowset import RowSet, scan_matches
from lance_lightning.prefetch import ReadAhead
from lance_lightning.metrics import STATS_KEY, StageClock, batch_size_and_bytes, row_bytes
from lance_lightning.read import BatchSpec, PlanReader, read_positions
from lance_lightning.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.source import LanceSource, PinnedSource, pin_source

Batch = dict[str, Any]
BatchTransform = Callable[[Batch], Batch]
#: A finished batch with its rows and payload bytes (zeros when metrics are off).
SizedBatch = tuple[Batch, int, int]

class EpochControl:
    """Epoch and start row of the next iteration, shared with worker processes."""

    def __init__(self, context: Any | None = None) -> None:
        self._values = (context or multiprocessing).RawArray("q", 2)

    def set(self, epoch: int, start: int) -> None:
        self._values[0], self._values[1] = epoch, start

    def get(self) -> tuple[int, int]:
        return int(self._values[0]), int(self._values[1])

class ReaderThreads:
    """The reader and transform threads of one process, kept from epoch to epoch (start/stop).

    Fresh threads every epoch would each get a fresh malloc arena that keeps what it freed, so
    the process's RSS would grow with every epoch; the same threads keep it flat. Each thread runs
    torch ops with one intra-op thread (the threads themselves are the parallelism) and under
    ``SCHED_BATCH`` on Linux, so it never preempts the training loop's thread. Pickling (to
    a worker process) or forking leaves the threads behind: each process starts its own.
    """

    STAGES = ("read", "transform")

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._pid = os.getpid()

    def start(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's threads do not exist here
            self._pools, self._pid = {}, os.getpid()
        if self.threads and not self._pools:
            self._pools = {stage: ThreadPoolExecutor(self.threads, thread_name_prefix=f"lance-{stage}",
                                                     initializer=_background_thread) for stage in self.STAGES}

    def stop(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def ahead(self, stage: str, work: Callable[[Any], Any], items: Iterable[Any], depth: int,
              clock: StageClock | None = None) -> ReadAhead:
        """A `ReadAhead` of ``work`` over ``items`` on this process's ``stage`` threads."""
        if not self.threads:
            return ReadAhead(work, items, 0, depth, name=f"lance-{stage}", clock=clock)
        self.start()
        return _PooledReadAhead(work, items, self._pools[stage], self.threads, depth, stage, clock)

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"])


class HeapTrimmer:
    """Returns the heap pages malloc holds free to the OS (glibc ``malloc_trim``; elsewhere nothing).

    Batches are allocated on the reader threads and freed by the consumer, in another order: the
    holes they leave in the threads' malloc arenas stay resident, so the peak RSS crept up from
    epoch to epoch (+8% over 8 epochs with 16 decoded batches in flight, in the memory rows of
    benchmarks/bench_transforms.py before this trimmer). ``after_epoch()`` trims
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


def _background_thread() -> None:
    # The reader threads are the parallelism: torch ops inside them running their own OpenMP
    # teams would oversubscribe the cores (and spin), starving the training loop's thread. Torch
    # does the same in DataLoader worker processes. The setting is per thread.
    torch.set_num_threads(1)
    # SCHED_BATCH (Linux, no privileges needed): a reader thread woken for new work never
    # preempts the training loop's thread; without it, on a 2-core machine the loop lost its core
    # for ~3 ms on every other batch hand-off. The threads still get their fair share of the CPU.
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or a sandbox that forbids it
        pass


class _PooledReadAhead(ReadAhead):
    """`ReadAhead` on a long-lived pool: stopping cancels its own work, never the shared threads."""

    def __init__(self, work: Callable[[Any], Any], items: Iterable[Any], pool: ThreadPoolExecutor, threads: int,
                 depth: int, stage: str, clock: StageClock | None) -> None:
        super().__init__(work, items, threads, depth, name=f"lance-{stage}", clock=clock)
        self._shared = pool

    def start(self) -> None:
        self._pool = self._shared

    def stop(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool = None


class LanceIterableDataset(IterableDataset):
    """Batches of one rank of a `ReadPlan`.

    Args:
        plan: The split's read plan.
        world_size, rank: The rank's place in the job; each rank reads a disjoint share.
        transform: Called on each converted batch, in the reader threads.
        fill_nulls: Per-column values for nulls (else a null is an error naming the column).
        threads: Reader threads per process (0 reads on the iterating thread: no prefetch).
        prefetch_groups: Read groups kept ready ahead of the consumer, per process.
        prefetch_batches: Finished (transformed) batches in flight or ready, per process.
        bad_rows: What to do with rows the transform rejects (default `RaiseOnBadRow`).
        pin_memory: Pin finished batches in page-locked memory, on the reader threads.
        retry: How reads ride out transient storage errors.
    """

    def __init__(self, plan: ReadPlan, *, world_size: int = 1, rank: int = 0,
                 transform: BatchTransform | None = None, fill_nulls: Mapping[str, Any] | None = None,
                 threads: int = 2, prefetch_groups: int = 2, prefetch_batches: int = 4,
                 bad_rows: BadRowPolicy | None = None, pin_memory: bool = False,
                 retry: RetryPolicy = DEFAULT_POLICY) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.plan = plan
        self.world_size = world_size
        self.rank = rank
        self.transform = transform
        self.fill_nulls = dict(fill_nulls or {})
        self.threads = threads
        self.prefetch_groups = prefetch_groups
        self.prefetch_batches = prefetch_batches
        self.bad_rows = bad_rows or RaiseOnBadRow()
        self.pin_memory = pin_memory
        self.retry = retry
        self.pools = ReaderThreads(threads)
        self.control = EpochControl()
        self.clock = StageClock()
        self.ship_stats = False  # set by LanceDataLoader, which takes the figures off the batches
        self.ship_positions = False  # set by LanceDataModule when a device_transform applies the bad-row policy

    def use_context(self, context: Any) -> None:
        """Put the epoch control in memory that workers of ``context`` share."""
        epoch, start = self.control.get()
        self.control = EpochControl(context)
        self.control.set(epoch, start)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Read epoch ``epoch`` from sequence row ``start`` (a resumed cursor) on the next iteration."""
        self.control.set(epoch, start)

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self.control.get()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        reader = PlanReader(self.plan, epoch, self.world_size, self.rank, start, retry=self.retry)
        steps = reader.layout.worker_steps(worker, workers, self.rank)
        producer = BatchProducer(reader, self.transform, self.fill_nulls, self.clock,
                                 ship_stats=info is not None and self.ship_stats, bad_rows=self.bad_rows,
                                 pin_memory=self.pin_memory, ship_positions=self.ship_positions)
        yield from producer.run(reader.groups(steps), self.pools, self.prefetch_groups, self.prefetch_batches)
        HEAP.after_epoch()


class BatchProducer:
    """Turns read groups into finished batches: read, then convert + transform (+ pin), in order.

    Without a transform, conversion is zero-copy and cheap, so each read group is read and
    converted by one reader thread (``prefetch_groups`` groups ahead). With a transform, reading
    and transforming are two `ReadAhead` stages: groups are read ``prefetch_groups`` ahead and
    batches transformed ``prefetch_batches`` ahead, one batch per task, so decoding spreads over
    all threads and decoded memory stays bounded by ``prefetch_batches`` batches.
    """

    def __init__(self, reader: PlanReader, transform: BatchTransform | None, fill_nulls: Mapping[str, Any],
                 clock: StageClock, ship_stats: bool, bad_rows: BadRowPolicy | None = None,
                 pin_memory: bool = False, ship_positions: bool = False) -> None:
        self.reader = reader
        self.transform = transform
        self.clock = clock
        self.ship_stats = ship_stats
        self.pin_memory = pin_memory
        plan = reader.plan
        self.guard = BadRowGuard(bad_rows or RaiseOnBadRow(), plan.source, plan.matched_rows, plan.matches,
                                 transform, dict(fill_nulls), clock, ship_positions)

    def read(self, group: list[BatchSpec]) -> list[tuple[BatchSpec, pa.Table]]:
        rows = sum(len(spec.positions) for spec in group)
        with self.clock.measure("read", rows=rows):
            tables = self.reader.read_group(group)
        return list(zip(group, (table for _, table in tables)))

    def finish(self, item: tuple[BatchSpec, pa.Table]) -> SizedBatch:
        spec, table = item
        batch = self.guard(table, spec.positions)
        if self.pin_memory:
            with self.clock.measure("pin", rows=table.num_rows):
                batch = pin_batch(batch)
        return self._sized(batch)

    def __call__(self, group: list[BatchSpec]) -> list[SizedBatch]:
        """Read, convert (and pin) a whole group: the one stage of `run` without a transform.

        No row can be bad without a transform, so each step is measured once per group, not per
        batch (on a fast scan, per-batch measurements cost several percent of the throughput).
        """
        tables = [table for _, table in self.read(group)]
        rows = sum(table.num_rows for table in tables)
        with self.clock.measure("convert", rows=rows):
            batches = [self.guard.convert(table) for table in tables]
        if self.guard.ship_positions:
            batches = [{**batch, POSITIONS_KEY: torch.from_numpy(spec.positions)}
                       for batch, spec in zip(batches, group)]
        if self.pin_memory:
            with self.clock.measure("pin", rows=rows):
                batches = [pin_batch(batch) for batch in batches]
        return self._sized_group(batches, [table.num_rows for table in tables])

    def _sized(self, batch: Batch) -> SizedBatch:
        """``batch`` with its rows and payload bytes, measured here on a reader thread (zeros when
        the clock is off): the thread handing batches on then only adds them up."""
        if not self.clock.enabled:
            return batch, 0, 0
        return (batch, *batch_size_and_bytes(batch))

    def _sized_group(self, batches: list[Batch], rows: list[int]) -> list[SizedBatch]:
        """`_sized` for a group's batches (of ``rows`` rows each). When all columns are tensors, the
        bytes per row are measured once per group: measuring holds the GIL, which the training
        thread needs too."""
        per_row = row_bytes(batches[0]) if self.clock.enabled and batches else None
        if per_row is None:
            return [self._sized(batch) for batch in batches]
        return [(batch, count, count * per_row) for batch, count in zip(batches, rows)]

    def run(self, groups: Iterator[list[BatchSpec]], pools: ReaderThreads, prefetch_groups: int,
            prefetch_batches: int) -> Iterator[Batch]:
        """The finished batches of ``groups``, in order, prepared ahead on the ``pools`` threads."""
        if self.transform is None:
            for sized in pools.ahead("read", self, groups, prefetch_groups, clock=self.clock):
                for batch, rows, nbytes in sized:
                    yield self._hand_on(batch, rows, nbytes)
            return
        reads = pools.ahead("read", self.read, groups, prefetch_groups)
        tables = (item for group in reads for item in group)
        try:
            for batch, rows, nbytes in pools.ahead("transform", self.finish, tables, prefetch_batches,
                                                   clock=self.clock):
                yield self._hand_on(batch, rows, nbytes)
        finally:
            tables.close()  # cancels the read stage's queued work too

    def _hand_on(self, batch: Batch, rows: int, nbytes: int) -> Batch:
        """Count ``batch`` as delivered; in a worker process, attach the totals measured since the
        previous batch, so that they reach the main process with this batch."""
        if rows:
            clock = self.clock
            clock.delivered_rows += rows
            clock.delivered_bytes += nbytes
        if self.ship_stats:
            totals = self.clock.drain()
            if totals:
                batch[STATS_KEY] = totals
        return batch


class LanceMapDataset(Dataset):
    """Map-style access to the matching rows of a pinned source, in storage order.

    Use ``DataLoader(ds, batch_size=..., collate_fn=LanceMapDataset.collate)``: ``__getitems__``
    already returns a whole batch, so the collate function passes it through.

    Args:
        source: A `LanceSource` (pinned and validated here) or an already pinned source.
        transform: Called on each converted batch.
        fill_nulls: Per-column values for nulls.
        bad_rows: What to do with rows the transform rejects (default `RaiseOnBadRow`); a
            replacement is chosen among the source's matching rows, deterministically.
        retry: How reads ride out transient storage errors.
    """

    def __init__(self, source: LanceSource | PinnedSource, *, transform: BatchTransform | None = None,
                 fill_nulls: Mapping[str, Any] | None = None, bad_rows: BadRowPolicy | None = None,
                 retry: RetryPolicy = DEFAULT_POLICY) -> None:
        self.source = source if isinstance(source, PinnedSource) else pin_source(source, "source")
        self.retry = retry
        self.transform = transform
        self.fill_nulls = dict(fill_nulls or {})
        self.matches: RowSet | None = None
        self._rows = self.source.total_rows
        if self.source.filter is not None:
            self.matches = scan_matches(self.source.open(), self.source.filter, self.source.total_rows)
            self._rows = self.matches.rows
        self.clock = StageClock()
        self.guard = BadRowGuard(bad_rows or RaiseOnBadRow(), self.source, self._rows, self.matches, transform,
                                 self.fill_nulls, self.clock)

    def __len__(self) -> int:
        return self._rows

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = np.asarray(indices, dtype=np.int64)
        if len(index) and (index.min() < -self._rows or index.max() >= self._rows):
            raise IndexError(f"index out of range for {self._rows} rows: {index.min()}..{index.max()}")
        index %= self._rows
        positions = index if self.matches is None else self.matches.select(index)
        wanted, inverse = np.unique(positions, return_inverse=True)
        table = read_positions(self.source, wanted, scan_mode=False, retry=self.retry)
        if len(wanted) != len(positions) or not np.array_equal(wanted, positions):
            table = table.take(pa.array(inverse))
        return self.guard(table, positions)

    def __getitem__(self, index: int) -> Batch:
        batch = self.__getitems__([index])
        return {k: v[0] for k, v in batch.items()}

    @staticmethod
    def collate(batch: Batch) -> Batch:
        """The collate function for ``__getitems__`` batches: they are already collated."""
        return batch

