"""Read groups turned into finished batches on the reader threads, in the plan's order.

Guarantees:
- Batches are prepared ahead on background threads: read groups on one pool, convert + transform
  (decoding) per batch on another, in order. Memory is bounded per process by ``prefetch_groups``
  read groups of raw Arrow rows plus ``prefetch_batches`` finished (decoded) batches, in flight or
  waiting; ``reader_threads=0`` turns prefetching off.
- `pin_batch` pins every tensor of a batch (and `Ragged` columns) in page-locked host memory (with
  CUDA only), so the copy to the device can be asynchronous; lists (strings, bytes) stay as they
  are. It runs on the reader threads (``num_workers=0``) or the DataLoader's pin thread (worker
  processes), never on the training loop's thread.
- A row the transform rejects is handled by the bad-row policy (`lance_lightning.produce.badrows`):
  raise naming the dataset row, or replace it deterministically; batch sizes never change.
- With an ``identity``, every batch carries its rows' identity keys (`lance_lightning.produce.identity`),
  their epoch positions taken from the reader's layout, so the same row has the same ``_position``
  on every rank, worker and thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic

import numpy as np
import pyarrow as pa
import torch

from lance_lightning.metrics.clock import StageClock
from lance_lightning.metrics.figures import batch_size_and_bytes, row_bytes
from lance_lightning.produce.badrows import BadRowPolicy, RaiseOnBadRow
from lance_lightning.produce.convert import Ragged
from lance_lightning.produce.identity import RowIdentity
from lance_lightning.produce.parcel import parcel
from lance_lightning.produce.threads import ReaderThreads
from lance_lightning.produce.transform import TransformStep
from lance_lightning.read.reader import BatchReader, Spec
from lance_lightning.vocabulary import Batch, BatchTransform, Shipment

#: A finished batch, its rows' positions (None unless shipped) and its rows and payload bytes (zeros when
#: metrics are off).
SizedBatch = tuple[Any, Any, int, int]


class BatchProducer(Generic[Spec]):
    """Turns read groups into finished batches: read, then convert + transform (+ pin), in order.

    Without a transform, conversion is zero-copy and cheap, so each read group is read and
    converted by one reader thread (``prefetch_groups`` groups ahead). With a transform, reading
    and transforming are two `ReadAhead` stages: groups are read ``prefetch_groups`` ahead and
    batches transformed ``prefetch_batches`` ahead, one batch per task, so decoding spreads over
    all threads and decoded memory stays bounded by ``prefetch_batches`` batches.
    """

    def __init__(
        self,
        reader: BatchReader[Spec],
        transform: BatchTransform | None,
        fill_nulls: Mapping[str, Any],
        clock: StageClock,
        ship_stats: bool,
        bad_rows: BadRowPolicy | None = None,
        pin_memory: bool = False,
        ship_positions: bool = False,
        shipments: bool = False,
        identity: RowIdentity | None = None,
        blob_files: tuple[str, ...] = (),
        parcels: bool = False,
    ) -> None:
        self.reader = reader
        self.transform = transform
        self.clock = clock
        self.ship_stats = ship_stats
        self.ship_positions = ship_positions
        self.shipments = shipments or ship_stats or ship_positions
        self.pin_memory = pin_memory
        self.parcels = parcels
        self.step = TransformStep(
            bad_rows or RaiseOnBadRow(),
            reader.plan,
            transform,
            dict(fill_nulls),
            clock,
            identity=identity,
            blob_files=blob_files,
        )

    def read(self, group: list[Spec]) -> list[tuple[Spec, pa.Table]]:
        rows = sum(len(spec.positions) for spec in group)
        with self.clock.measure("read", rows=rows):
            tables = self.reader.read_group(group)
        if self.clock.enabled:  # what io_bytes is compared with (io_amplification)
            self.clock.add("read_row_bytes", rows * self.reader.plan.row_bytes)
        return list(zip(group, (table for _, table in tables)))

    def finish(self, item: tuple[Spec, pa.Table]) -> SizedBatch:
        spec, table = item
        batch, positions = self.step.finish(table, spec.positions, self.sequence(spec))
        if self.pin_memory:
            with self.clock.measure("pin", rows=table.num_rows):
                batch = pin_batch(batch)
        return self._sized(batch, positions)

    def __call__(self, group: list[Spec]) -> list[SizedBatch]:
        """Read, convert (and pin) a whole group: the one stage of `run` without a transform.

        No row can be bad without a transform, so each step is measured once per group, not per
        batch (on a fast scan, per-batch measurements cost several percent of the throughput).
        """
        tables = [table for _, table in self.read(group)]
        rows = sum(table.num_rows for table in tables)
        with self.clock.measure("convert", rows=rows):
            batches = [
                self.step.convert(table, spec.positions, self.sequence(spec)) for spec, table in zip(group, tables)
            ]
        if self.pin_memory:
            with self.clock.measure("pin", rows=rows):
                batches = [pin_batch(batch) for batch in batches]
        return self._sized_group(batches, [spec.positions for spec in group], [table.num_rows for table in tables])

    def sequence(self, spec: Spec) -> np.ndarray | None:
        """The epoch-order positions of the rows of ``spec`` (only with identity on)."""
        if self.step.identity is None:
            return None
        return self.reader.layout.batch_rows(self.reader.rank, spec.step)

    def _sized(self, batch: Any, positions: Any) -> SizedBatch:
        """``batch`` with its positions (when shipped) and its rows and payload bytes, measured here on
        a reader thread (zeros when the clock is off): the thread handing batches on only adds them up."""
        positions = torch.from_numpy(positions) if self.ship_positions else None
        if not self.clock.enabled:
            return batch, positions, 0, 0
        return (batch, positions, *batch_size_and_bytes(batch))

    def _sized_group(self, batches: list[Batch], positions: list[Any], rows: list[int]) -> list[SizedBatch]:
        """`_sized` for a group's batches (of ``rows`` rows each). When all columns are tensors, the
        bytes per row are measured once per group: measuring holds the GIL, which the training
        thread needs too."""
        per_row = row_bytes(batches[0]) if self.clock.enabled and batches else None
        if per_row is None:
            return [self._sized(batch, where) for batch, where in zip(batches, positions)]
        return [
            (batch, torch.from_numpy(where) if self.ship_positions else None, count, count * per_row)
            for batch, where, count in zip(batches, positions, rows)
        ]

    def run(
        self, groups: Iterator[list[Spec]], pools: ReaderThreads, prefetch_groups: int, prefetch_batches: int
    ) -> Iterator[Any]:
        """The finished batches of ``groups`` (as `Shipment`s when ``shipments``), in order, prepared
        ahead on the ``pools`` threads."""
        inline = getattr(self.reader, "first_inline", False)  # a small first group: read on this thread
        if self.transform is None:
            for sized in pools.ahead("read", self, groups, prefetch_groups, clock=self.clock, inline_first=inline):
                for item in sized:
                    yield self._hand_on(*item)
            return
        reads = pools.ahead("read", self.read, groups, prefetch_groups, inline_first=inline)
        tables = (item for group in reads for item in group)
        try:
            for item in pools.ahead(
                "transform", self.finish, tables, prefetch_batches, clock=self.clock, inline_first=inline
            ):
                yield self._hand_on(*item)
        finally:
            tables.close()  # cancels the read stage's queued work too

    def _hand_on(self, batch: Any, positions: Any, rows: int, nbytes: int) -> Any:
        """Count ``batch`` as delivered. As a `Shipment`, the batch travels with its positions and, in a
        worker process, the totals measured since the previous batch: beside the batch, never inside."""
        if rows:
            clock = self.clock
            clock.delivered_rows += rows
            clock.delivered_bytes += nbytes
        if not self.shipments:
            return batch
        if self.parcels:  # leaving a worker process: one message per batch (`lance_lightning.produce.parcel`)
            batch = parcel(batch)
        return Shipment(batch, (self.clock.drain() or None) if self.ship_stats else None, positions)


def pin_batch(batch: Batch) -> Batch:
    """The batch with its tensors (and objects with ``pin_memory``, such as `Ragged`) pinned."""
    if not torch.cuda.is_available():
        return batch  # page-locked memory needs a CUDA driver; nothing to gain without one
    return {key: _pin(value) for key, value in batch.items()}


def _pin(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.is_pinned() else value.pin_memory()
    if isinstance(value, Ragged):
        return value if value.is_pinned() else value.pin_memory()
    return value
