"""The two public dataset styles, usable with a plain ``torch.utils.data.DataLoader``.

Guarantees:
- `LanceIterableDataset` yields ready batches (dicts of column -> tensor/list) of one rank, for
  the epoch and start row set with ``set_epoch``. DataLoader worker ``w`` of ``K`` yields the
  rank's batches ``w, w+K, ...`` so the round-robin DataLoader keeps the planned order. A
  `LanceDataLoader`'s worker instead sends runs of one read group's consecutive batches as one
  `Bundle` (worker ``w`` takes runs ``w, w+K, ...``), which the loader unpacks in order: each
  worker reads whole ranges, and the training process receives one message per run. The epoch
  lives in shared memory, so persistent workers see each new epoch.
- Iterated directly, or by any DataLoader, it yields batches. Only a `LanceDataLoader` receives
  `Shipment`s (a batch with its worker's stage totals and its rows' positions beside it): from
  ``produce`` in its own process, and from the copies its worker processes hold
  (`ship_from_worker`), where an error of the package's own arrives as a `WorkerError` the loader
  raises again, whole. A loader reads its own copy (``for_loader``); the dataset a user built is
  never changed.
- Batches are prepared ahead on background threads (`lance_lightning.produce.producer`). The same
  threads serve every epoch (`lance_lightning.produce.threads`) and finished epochs return the
  heap's free pages to the OS (`lance_lightning.produce.heap`), so RSS stays flat.
- `LanceMapDataset` maps index ``i`` to the ``i``-th matching row of a pinned source (planned by
  `lance_lightning.plan.split.plan_split`, as every split is); its batched ``__getitems__`` reads
  a whole batch with one planned read, never row by row.
- Both read only the pinned version and convert per batch (see `lance_lightning.produce.convert`).
- With ``row_identity``, each batch of `LanceIterableDataset` carries its rows' identity keys
  (`lance_lightning.produce.identity`: ``_rowaddr``, ``_rowid``, ``_position``, ``_epoch``), the same
  for a row whatever the rank, worker or thread; a plan identity cannot describe is refused when
  the dataset is made.
- Blob columns a transform names in its ``blob_files`` attribute (or one of a `Compose`'s) are not
  read as bytes: each batch carries them as lists of seekable ``lance.BlobFile`` objects
  (`lance_lightning.read.blobs`); a name that is not a blob column of the split is refused when the
  dataset is made.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import itertools
import multiprocessing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from lance_lightning.errors import ConfigError
from lance_lightning.load import shared  # noqa: F401 - shares row sets with worker processes
from lance_lightning.metrics.clock import StageClock
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.rowset import RowSet
from lance_lightning.plan.split import plan_split
from lance_lightning.plan.strategies import BufferShuffle, FilterRead, NoShuffle
from lance_lightning.produce.badrows import BadRowPolicy, RaiseOnBadRow
from lance_lightning.produce.heap import HEAP
from lance_lightning.produce.identity import RowIdentity, check_identity
from lance_lightning.produce.parcel import slab_run
from lance_lightning.produce.producer import BatchProducer
from lance_lightning.produce.threads import ReaderThreads
from lance_lightning.produce.transform import TransformStep
from lance_lightning.read.blobs import reading_without
from lance_lightning.read.factory import plan_reader
from lance_lightning.read.lance_io import read_positions
from lance_lightning.read.reader import TAKE_GROUP_BYTES, BatchReader
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.source import LanceSource, PinnedSource, pin_source
from lance_lightning.vocabulary import Batch, BatchTransform


class EpochControl:
    """Epoch and start row of the next iteration, shared with worker processes."""

    def __init__(self, context: Any | None = None) -> None:
        self._values = (context or multiprocessing).RawArray("q", 2)

    def set(self, epoch: int, start: int) -> None:
        self._values[0], self._values[1] = epoch, start

    def get(self) -> tuple[int, int]:
        return int(self._values[0]), int(self._values[1])


@dataclass(frozen=True)
class Shipping:
    """What a dataset's batches carry beside them to a `LanceDataLoader`, as `Shipment`s: the stage
    totals a worker process measured since its previous batch, the dataset positions of the rows."""

    stats: bool
    positions: bool


class WorkerError(NamedTuple):
    """An error of the package's own, raised in a loader's worker process: it travels to the
    training process as an object (the exceptions pickle with their fields), not as the message
    string torch would rebuild it from (which loses the type of one whose constructor needs more)."""

    error: Exception


def ship_from_worker(shipping: Shipping) -> None:
    """In a `LanceDataLoader`'s worker process: its copy of the dataset yields `Shipment`s."""
    info = get_worker_info()
    if info is None:
        raise RuntimeError("ship_from_worker runs in a DataLoader worker process (torch gives no worker info here)")
    if not isinstance(info.dataset, LanceIterableDataset):
        raise TypeError(f"ship_from_worker: the worker's dataset is a {type(info.dataset).__name__}")
    info.dataset._worker_shipping = shipping


class LanceIterableDataset(IterableDataset):
    """Batches of one rank of a `Plan`.

    Args:
        plan: The split's read plan.
        world_size, rank: The rank's place in the job; each rank reads a disjoint share.
        transform: Called on each converted batch, in the reader threads.
        fill_nulls: Per-column values for nulls (else a null is an error naming the column).
        reader_threads: Reader threads per process (0 reads on the iterating thread: no prefetch).
        prefetch_groups: Read groups kept ready ahead of the consumer, per process.
        prefetch_batches: Finished (transformed) batches in flight or ready, per process.
        take_group_bytes: A take plan's read groups grow to about this many bytes of rows.
        bad_rows: What to do with rows the transform rejects (default `RaiseOnBadRow`).
        pin_memory: Pin finished batches in page-locked memory, on the reader threads.
        retry: How reads ride out transient storage errors.
        row_identity: Add the rows' identity keys to each batch, before the transform
            (`lance_lightning.produce.identity`).
        position_shifts: With ``row_identity``: ``(start, offset)`` pairs added to the rows'
            ``_position`` (a restricted read keeping a wider read's positions, `RowIdentity`).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        world_size: int = 1,
        rank: int = 0,
        transform: BatchTransform | None = None,
        fill_nulls: Mapping[str, Any] | None = None,
        reader_threads: int = 2,
        prefetch_groups: int = 2,
        prefetch_batches: int = 4,
        take_group_bytes: int = TAKE_GROUP_BYTES,
        bad_rows: BadRowPolicy | None = None,
        pin_memory: bool = False,
        retry: RetryPolicy = DEFAULT_POLICY,
        row_identity: bool = False,
        position_shifts: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if row_identity:
            check_identity(plan.split, plan)
        self.row_identity = bool(row_identity)
        self.position_shifts = [(start, offset) for start, offset in position_shifts] if position_shifts else None
        self.blob_files = blob_files_of(transform)
        self.plan = reading_plan(plan, self.blob_files)
        self.world_size = world_size
        self.rank = rank
        self.transform = transform
        self.fill_nulls = dict(fill_nulls or {})
        self.reader_threads = reader_threads
        self.prefetch_groups = prefetch_groups
        self.prefetch_batches = prefetch_batches
        self.take_group_bytes = take_group_bytes
        self.bad_rows = bad_rows or RaiseOnBadRow()
        self.pin_memory = pin_memory
        self.retry = retry
        self.pools = ReaderThreads(reader_threads)
        self.control = EpochControl()
        self.clock = StageClock()
        #: Set only on a `LanceDataLoader` worker process's own copy (`ship_from_worker`).
        self._worker_shipping: Shipping | None = None

    def for_loader(self, context: Any | None, metrics: bool, pin_memory: bool) -> LanceIterableDataset:
        """A copy for a loader: its epoch control in memory that workers of ``context`` share, its
        own clock (off without ``metrics``), pinning its batches itself when ``pin_memory``.
        ``self`` is left as it is."""
        copy = _copy.copy(self)
        copy.control = EpochControl(context)
        copy.control.set(*self.control.get())
        copy.clock = StageClock()
        copy.clock.enabled = metrics
        copy.pin_memory = self.pin_memory or pin_memory
        return copy

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Read epoch ``epoch`` from sequence row ``start`` (a resumed cursor) on the next iteration."""
        self.control.set(epoch, start)

    def __iter__(self) -> Iterator[Any]:
        """This rank's (and DataLoader worker's) batches of the epoch set with ``set_epoch``."""
        return self.produce(self._worker_shipping)

    def produce(self, shipping: Shipping | None = None) -> Iterator[Any]:
        """As ``iter``, each batch as a `Shipment` carrying what ``shipping`` names (a loader's
        own path; ``None``: plain batches). In a loader's worker process an error of the
        package's own, from planning the epoch's reads to the last batch, is yielded as a
        `WorkerError`."""
        if get_worker_info() is None or shipping is None:
            yield from self._produce(shipping)
            return
        try:
            yield from self._produce(shipping)
        except Exception as error:
            if not type(error).__module__.startswith("lance_lightning."):
                raise  # torch reports other errors with the worker's traceback
            yield WorkerError(error)  # pickled whole, raised again by the loader

    def _produce(self, shipping: Shipping | None) -> Iterator[Any]:
        epoch, start = self.control.get()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        reader: BatchReader[Any] = plan_reader(  # its spec type depends on the plan's kind
            self.plan,
            epoch,
            self.world_size,
            self.rank,
            start,
            retry=self.retry,
            take_group_bytes=self.take_group_bytes,
            bad_rows=self.bad_rows,
        )
        # A loader's worker sends runs of consecutive batches, one message each: its reads stay
        # whole ranges (interleaved single batches made each worker read every other batch).
        chunk = message_steps(reader, workers) if info is not None and shipping is not None else 1
        # Runs ramp up to `chunk` (the first batches wait for one batch, not a run), but not where
        # every worker holding part of a read group reads all of it: a buffer shuffle's buffer.
        ramp = not isinstance(getattr(reader.plan, "strategy", None), BufferShuffle)
        runs = reader.layout.worker_steps(worker, workers, self.rank, chunk, ramp)
        steps = [step for run in runs for step in run]
        producer = BatchProducer(
            reader,
            self.transform,
            self.fill_nulls,
            self.clock,
            ship_stats=shipping is not None and shipping.stats,
            bad_rows=self.bad_rows,
            pin_memory=self.pin_memory,
            ship_positions=shipping is not None and shipping.positions,
            shipments=shipping is not None,
            identity=RowIdentity(self.plan.source, epoch, self.retry, self.position_shifts)
            if self.row_identity
            else None,
            blob_files=self.blob_files,
            parcels=info is not None and shipping is not None,
        )
        batches = producer.run(reader.groups(steps), self.pools, self.prefetch_groups, self.prefetch_batches)
        if chunk == 1:
            yield from batches
        else:
            for run in runs:
                yield Bundle(slab_run(list(itertools.islice(batches, len(run)))))
        HEAP.after_epoch()


class Bundle(NamedTuple):
    """Consecutive batches (`Shipment`s) a loader's worker sends as one item; the loader unpacks them."""

    shipments: list[Any]


def message_steps(reader: Any, workers: int) -> int:
    """Batches a loader's worker sends per message: one read group's, at most `MAX_MESSAGE_STEPS`,
    and few enough that every worker gets at least `MIN_WORKER_RUNS` runs of the rank's epoch (a
    short epoch keeps every worker busy: a transform's work spreads over them all)."""
    group = getattr(reader, "group_rows", 0) // max(1, reader.plan.batch_size)
    spread = reader.layout.rank_steps(reader.rank) // (max(1, workers) * MIN_WORKER_RUNS)
    return max(1, min(MAX_MESSAGE_STEPS, group, spread))


#: At most this many batches per worker message (the first batch waits for the whole message).
MAX_MESSAGE_STEPS = 32
#: Each worker gets at least this many runs of an epoch, when it has that many batches.
MIN_WORKER_RUNS = 4


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

    def __init__(
        self,
        source: LanceSource | PinnedSource,
        *,
        transform: BatchTransform | None = None,
        fill_nulls: Mapping[str, Any] | None = None,
        bad_rows: BadRowPolicy | None = None,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.source = source if isinstance(source, PinnedSource) else pin_source(source, "source")
        self.retry = retry
        self.transform = transform
        self.fill_nulls = dict(fill_nulls or {})
        self.clock = StageClock()
        # The rows by index (no order, no batches), planned as every split is; it may have none.
        planned = plan_split("map", self.source, SplitSettings(NoShuffle(), FilterRead(), 1, False), allow_empty=True)
        self.matches: RowSet | None = planned.matches
        self._rows = planned.matched_rows
        files = blob_files_of(transform)
        plan = reading_plan(planned, files)
        self.source = plan.source
        self.step = TransformStep(
            bad_rows or RaiseOnBadRow(), plan, transform, self.fill_nulls, self.clock, blob_files=files
        )

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
        return self.step(table, positions)

    def __getitem__(self, index: int) -> Batch:
        batch = self.__getitems__([index])
        return {k: v[0] for k, v in batch.items()}

    @staticmethod
    def collate(batch: Batch) -> Batch:
        """The collate function for ``__getitems__`` batches: they are already collated."""
        return batch


def blob_files_of(transform: Any) -> tuple[str, ...]:
    """The blob columns ``transform`` takes as file objects: the names in its ``blob_files``
    attribute (a `Compose` gathers its transforms')."""
    return tuple(getattr(transform, "blob_files", None) or ())


def reading_plan(plan: Any, files: tuple[str, ...]) -> Any:
    """``plan`` reading every column but the blob columns ``files``; `ConfigError` for a name that is
    not a blob column of its split, for a mixture, or when no other column would be read."""
    if not files:
        return plan
    split = plan.split
    if not isinstance(plan, ReadPlan):
        raise ConfigError(
            "blob_files", list(files), f"split '{split}' is a LanceMixture", "read blobs as bytes from a mixture"
        )
    missing = [name for name in files if name not in plan.source.blob_columns]
    if missing:
        raise ConfigError(
            "blob_files",
            missing,
            f"not blob columns read by split '{split}' (its blob columns: {list(plan.source.blob_columns)})",
            "name columns written with Lance blob encoding, and read them (LanceSource columns)",
        )
    source = reading_without(plan.source, files)
    if not source.columns:
        raise ConfigError(
            "blob_files",
            list(files),
            f"split '{split}' would read no column but its blob files",
            "read another column too (e.g. an id) in LanceSource(columns=...)",
        )
    return dataclasses.replace(plan, source=source)
