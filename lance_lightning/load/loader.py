"""The DataLoader the data module returns: planned batches, a length, and a resumable cursor.

Guarantees:
- ``len(loader)`` is the exact number of batches the next (or current) ``iter`` of this rank
  yields, equal on every rank (predict may end one batch earlier on some ranks: it does not pad).
  After a restore it is the rest of the epoch. With a ``trainer`` (the data module's train loader)
  it is the batch index Lightning gives the epoch's first batch plus those batches, so Lightning
  stops the epoch exactly at its last batch, also after a restart, and ``limit_train_batches``
  scales a whole epoch's count (`lance_lightning.cursor.progress`). Both are read from the cursor
  and the trainer each time Lightning asks; the data module builds a new loader for each trainer.
  Because the length is known, Lightning does not fetch a batch ahead, so the cursor counts only
  batches handed to the training loop.
- Lightning may rebuild the loader from its constructor arguments (``Trainer.predict`` does, to
  inject ``sampler``/``batch_sampler``): the rebuilt loader reads the same dataset and cursor.
- Each ``iter(loader)`` reads the trainer's current epoch (without a trainer: the loader counts its
  own iterations), starting where a restored cursor left off, then continues normally. The data epoch it reads is
  the cursor's: the same epoch, unless a restore continues a data epoch that a stop cut short
  (see `lance_lightning.cursor.tracker`).
- Worker processes never import Lightning (their ``worker_init_fn`` seeds them as Lightning's
  would), and never fork a process that has used Lance: the default start method is
  ``forkserver``; ``fork`` with workers is refused (`ConfigError`) before any worker starts.
  They die with their parent, and their files live in this process's one temp folder, removed
  however this process ends (`lance_lightning.lifetime`). Workers that die after the trainer
  received SIGTERM died of it too (a scheduler such as SLURM signals every process of a job): the
  train loader then stops the fit as Lightning stops it on SIGTERM (its ``SIGTERMException``,
  after ``on_exception`` checkpoints), not with `WorkerDiedError`. Workers killed by SIGTERM before
  the trainer received it are reported only once `SIGTERM_GRACE_S` passed without it.
- ``state_dict``/``load_state_dict`` round-trip the cursor (plain types) for loops without a trainer
  (a plain torch loop, or a loader built without ``trainer``). A trainer's loader saves nothing: its
  data module's checkpoint state is the one copy of the cursor, restored once.
- Its ``device_path`` (`DevicePath`, decided by the data module before the loader is built) is the
  one way its batches reach the device: on CUDA they arrive already copied and device-transformed,
  prepared a few batches ahead in a background thread, else the data module's hooks do that work;
  either way each batch's row positions go with it through that path to the device bad-row guard.
  The cursor still advances only when a batch is yielded.
- Without worker processes, batches come straight from the dataset's reader threads (pinned
  there with ``pin_memory``): torch's single-process iterator would only add per-batch bookkeeping.
  With workers that are not running yet, this process reads the epoch's first batches the same
  way while they start, then hands them the rest (`lance_lightning.load.handoff`) unless a measured
  race finds them no faster than this process: then this process reads on, the same rows in the
  same order (`lance_lightning.load.race`; ``describe()`` and the end-of-fit report state it).
- The loader reads its own copy of the dataset (`LanceIterableDataset.for_loader`): the dataset
  passed in is never changed, and iterating ``loader.dataset`` yields batches, never `Shipment`s.
- An error of the package's own raised in a worker process (a bad row, a null, a read that failed
  for good) is raised in the training process as it was raised there: same type, message and
  attributes, not torch's re-wrapped traceback.
- With ``metrics=True`` (the default) the loader measures, per process, what the consumer waited
  for and what each pipeline stage cost (`lance_lightning.metrics`); figures measured in worker
  processes arrive beside the batches (a `Shipment` from the dataset, unpacked here), never inside
  them, so a transform may return any type. ``metrics_snapshot()`` returns the cumulative totals that
  `DataLoadingMonitor`, the report and ``lance-lightning profile`` read.
"""

from __future__ import annotations

import copy as _copy
import functools
import random
import signal
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from lance_lightning.cursor.position import finished
from lance_lightning.cursor.progress import TrainerProgress
from lance_lightning.cursor.tracker import CursorTracker
from lance_lightning.device.ahead import DevicePath
from lance_lightning.errors import ConfigError, WorkerDiedError
from lance_lightning.lifetime import shared_temp_dir, watch_parent
from lance_lightning.load.dataset import Bundle, LanceIterableDataset, Shipping, WorkerError, ship_from_worker
from lance_lightning.load.forked_server import ended_server, running_server
from lance_lightning.load.handoff import WorkerStart, WorkerStop, read_epoch, timed_for_race
from lance_lightning.load.lean_start import check_worker_launch, worker_context
from lance_lightning.load.race import Race
from lance_lightning.load.workers import STARTING_HINT, WatchedWorkersIterator, guard_workers, how_it_ended
from lance_lightning.metrics.meter import LoaderMeter, Snapshot
from lance_lightning.plan.layout import Layout
from lance_lightning.produce.slabs import SlabChannel, start_worker_ring
from lance_lightning.produce.threads import ReaderThreads
from lance_lightning.source import StoreEnvironment
from lance_lightning.vocabulary import Batch


def check_start_method(method: str, num_workers: int) -> None:
    """Raise `ConfigError` unless worker processes can start with ``method``."""
    if method not in ("forkserver", "spawn", "fork"):
        raise ConfigError("multiprocessing_context", method, "unknown start method", 'use "forkserver" or "spawn"')
    if method == "fork" and num_workers > 0:
        raise ConfigError(
            "multiprocessing_context",
            method,
            "Lance is not fork-safe: forked DataLoader workers of "
            "a process that has opened a Lance dataset segfault or hang (9 of 9 trials)",
            'use "forkserver" (the default) or "spawn"',
        )


def _start_method(context: Any) -> str:
    """The start method named by ``context``: a name, a multiprocessing context or None (default)."""
    if context is None:
        return "forkserver"
    return context if isinstance(context, str) else context.get_start_method()


def seed_worker(worker_id: int) -> None:
    """Seed torch, ``random`` and NumPy in a worker from (torch's base seed, worker id, rank).

    Set as the loader's ``worker_init_fn``, so that Lightning, under ``seed_everything(workers=True)``
    (LightningCLI's default), does not add its own, whose import makes every worker load Lightning.
    """
    info = get_worker_info()
    rank = getattr(info.dataset, "rank", 0) if info is not None else 0
    base_seed = torch.initial_seed() - worker_id
    sequence = np.random.SeedSequence([base_seed, worker_id, rank])
    torch_seed, random_seed, numpy_seed = sequence.generate_state(3, dtype=np.uint64).tolist()
    torch.manual_seed(torch_seed)
    random.seed(random_seed)
    np.random.seed(np.random.SeedSequence(numpy_seed).generate_state(4))


def init_worker(worker_id: int, shipping: Shipping, environment: StoreEnvironment, slabs: SlabChannel) -> None:
    """A worker's start: it dies with its parent (`watch_parent`), takes the object-store variables
    the loader's process had when the loader was made (``environment``: a forkserver started
    earlier has older ones), its copy of the dataset ships what the loader unpacks (``shipping``),
    large batches through the loader's shared-memory slabs (``slabs``), then it is seeded (`seed_worker`)."""
    watch_parent(worker_id)
    environment.adopt()
    ship_from_worker(shipping)
    start_worker_ring(slabs, worker_id)
    seed_worker(worker_id)


def _passthrough(batch: Any) -> Any:
    return batch


def _queue_size(queue: Any) -> int:
    """Batches waiting in the workers' output queue (0 where the platform cannot tell)."""
    try:
        return queue.qsize()
    except (NotImplementedError, OSError):
        return 0


def _polling_workers(batches: Iterator[Batch], queue: Any, meter: LoaderMeter) -> Iterator[Batch]:
    """``batches``, recording before each one how many the workers had finished and not yet sent."""
    while True:
        meter.workers_ready(_queue_size(queue))
        try:
            batch = next(batches)
        except StopIteration:
            return
        yield batch


def _raise_worker_errors(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, raising the error a worker process shipped (`WorkerError`) as it was raised there,
    a worker's `Bundle` unpacked into its batches, in order."""
    for item in items:
        if isinstance(item, WorkerError):
            raise item.error
        if isinstance(item, Bundle):
            yield from item.shipments
        else:
            yield item


def _stopping_on_sigterm(batches: Iterator[Batch], progress: TrainerProgress) -> Iterator[Batch]:
    try:
        yield from batches
    except WorkerDiedError as died:
        stop = progress.sigterm_stop()
        if stop is None and -signal.SIGTERM in died.exitcodes:
            stop = _await_sigterm(progress, SIGTERM_GRACE_S)
        if stop is None:
            raise
        raise stop from died


def _await_sigterm(progress: TrainerProgress, seconds: float) -> BaseException | None:
    """The trainer's SIGTERM stop, waiting up to ``seconds`` for the trainer to receive SIGTERM."""
    deadline = time.monotonic() + seconds
    while (stop := progress.sigterm_stop()) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return stop


#: Seconds a train loader whose workers died of SIGTERM waits for the trainer to receive it too (a
#: scheduler signals every process of a job, not all at the same instant) before it reports them.
SIGTERM_GRACE_S = 5.0


class LanceDataLoader(DataLoader):
    """A DataLoader over a `LanceIterableDataset` with an exact length and a resumable cursor.

    Args:
        dataset: The rank's planned batches.
        cursor: Tracks the epoch position (created from the dataset's plan if not given).
        trainer: The Lightning Trainer that trains on this loader: its epoch is read at each
            ``iter``, and ``len`` follows its batch indices (see the module docstring). Without
            one the loader counts its own completed iterations (``set_epoch`` overrides).
        num_workers, persistent_workers, pin_memory, prefetch_factor: As for DataLoader.
        multiprocessing_context: Start method for workers: "forkserver" (default) or "spawn"
            (or such a context); "fork" with workers is refused (`ConfigError`).
        metrics: Measure waits, stages and I/O (a wait and a time stamp per batch on the training
            thread, the rest on the reader threads). ``False`` turns every measurement off, in
            the workers too.
        device_path: How batches reach the accelerator (`DevicePath`: prepared ahead in a
            background thread, or by the data module's hooks, with their rows' positions when a
            device bad-row guard needs them); ``None`` yields host batches.
        sampler, batch_sampler: Accepted so that Lightning can rebuild the loader; they must be
            ``None`` (the plan decides the batches).
    """

    #: The loader's dataset (torch's DataLoader types it as any Dataset).
    dataset: LanceIterableDataset

    def __init__(
        self,
        dataset: LanceIterableDataset,
        *,
        cursor: CursorTracker | None = None,
        trainer: Any = None,
        num_workers: int = 0,
        persistent_workers: bool = True,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: str | Any = "forkserver",
        metrics: bool = True,
        device_path: DevicePath | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
    ) -> None:
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ConfigError(
                    name,
                    value,
                    "a LanceDataLoader yields the batches its plan lays out",
                    f"leave `{name}` unset; shuffle with LanceDataModule(shuffle=...)",
                )
        method = _start_method(multiprocessing_context)
        check_start_method(method, num_workers)
        if num_workers > 0:
            check_worker_launch(dataset.transform, method)
        context = worker_context(method, dataset.transform) if num_workers > 0 else None
        slabs = SlabChannel.open(context, num_workers) if num_workers > 0 else None
        ship_positions = device_path is not None and device_path.ships_positions
        # In this process the dataset pins its own batches; with workers the DataLoader pins them.
        dataset = dataset.for_loader(context, metrics, pin_memory and num_workers == 0)
        super().__init__(
            dataset,
            batch_size=None,
            collate_fn=_passthrough,
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            pin_memory=pin_memory and num_workers > 0,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            multiprocessing_context=context,
            worker_init_fn=functools.partial(
                init_worker,
                shipping=Shipping(True, ship_positions),
                environment=StoreEnvironment.capture(),
                slabs=slabs,
            )
            if slabs is not None
            else None,
        )
        #: What this process waits on, reading, before it starts its workers (`WorkerStart`), if any.
        self.worker_start: WorkerStart | None = None
        #: Workers of a lost trial shutting down on a background thread (`WorkerStop`), if any.
        self.worker_stop: WorkerStop | None = None
        #: Who reads the batches, the workers or this process (`lance_lightning.load.race`).
        self.race = Race(num_workers, prefetch_factor) if num_workers > 0 else None
        #: The dataset this process reads with when it has workers (`in_process`).
        self._own_reader: LanceIterableDataset | None = None
        #: Whether worker processes were ever started (`start_workers`): the race may keep every
        #: batch in this process, and the report then shows no worker figures.
        self.workers_started = False
        if slabs is not None:  # the slabs are this loader's: forgotten with it
            weakref.finalize(self, slabs.close)
        self.cursor = cursor or CursorTracker(dataset.plan)
        # Public under the constructor's names: Lightning rebuilds a loader from its attributes.
        self.trainer = trainer
        self.progress = TrainerProgress(trainer) if trainer is not None else None
        self.metrics = metrics
        self.device_path = device_path
        self._ship_positions = ship_positions
        self._own_epoch = 0
        self.meter = LoaderMeter() if metrics else None

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` on the next iteration (for loops without a Trainer)."""
        self._own_epoch = epoch

    def _next_epoch(self) -> int:
        return self.progress.epoch() if self.progress is not None else self._own_epoch

    def __len__(self) -> int:
        epoch, dataset = self._next_epoch(), self.dataset
        batches = self.cursor.length(epoch, dataset.world_size, dataset.rank)
        if self.progress is None:
            return batches
        return self.cursor.first_index(epoch, dataset.world_size) + batches

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]  # yields the batches; torch's own iterator: `start_workers`
        epoch, dataset, progress = self._next_epoch(), self.dataset, self.progress
        planned, first = (progress.planned_steps(), progress.next_batch_index()) if progress else (None, None)
        if progress is not None:  # the trainer says which batches are in flight (again after `settle`)
            self.cursor.loop.in_flight = progress.in_flight
        layout = self.cursor.begin_epoch(epoch, dataset.world_size, dataset.rank, planned, first)
        if self.cursor.epoch is None:  # begin_epoch sets it
            raise RuntimeError("the cursor has no data epoch after begin_epoch")
        dataset.set_epoch(self.cursor.epoch, layout.start)  # the data epoch: its order
        if self.meter is None:
            on_yield = self.cursor.loop.on_yield
            for batch, _, _ in self._delivered(_raise_worker_errors(self._batches(layout))):
                on_yield()
                yield batch
        else:
            yield from self._measured_iter(layout, self.meter)
        self._own_epoch = epoch + 1

    def _measured_iter(self, layout: Layout, meter: LoaderMeter) -> Iterator[Batch]:
        clock, on_yield, now = self.dataset.clock, self.cursor.loop.on_yield, time.perf_counter
        asked = now()
        meter.start_iteration(asked)
        batches = self._batches(layout)  # starts the workers on the first epoch: part of the first wait
        for batch, shipped, _ in self._delivered(_raise_worker_errors(batches)):
            got = now()
            if shipped:
                clock.merge(shipped)
            on_yield()
            meter.delivered(asked, got)
            yield batch
            asked = now()
        meter.end_iteration(asked)  # the epoch's last step ended when the consumer asked for more

    def _guarded(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` raising `WorkerDiedError` when a worker dies (`guard_workers`), or the trainer's
        SIGTERM stop when the trainer received SIGTERM: the workers died with it."""
        guarded = guard_workers(batches)
        if guarded is batches or self.progress is None:
            return guarded
        return _stopping_on_sigterm(guarded, self.progress)

    def _delivered(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items`` through the loader's one way to the device (none: host batches)."""
        return items if self.device_path is None else self.device_path.deliver(items, self.dataset.clock)

    def _batches(self, layout: Layout) -> Iterator[Any]:
        """The dataset's `Shipment`s (or a worker's `Bundle`s of them, or its `WorkerError`): from
        running workers through torch's iterator; while workers start, from this process first,
        and from whichever side the race chose (`lance_lightning.load.handoff`); without workers
        straight from the dataset (its batches are final: torch's single-process iterator only
        added per-batch bookkeeping)."""
        if self.num_workers == 0:
            return self.in_process()
        return read_epoch(self, layout)

    @property
    def workers_running(self) -> bool:
        """Whether persistent workers are up from an earlier epoch (torch keeps their iterator)."""
        return self.persistent_workers and self._iterator is not None

    def in_process(self) -> Iterator[Any]:
        """This process's batches. With workers configured (reading while they start, or chosen by
        the race) a copy of the dataset reads, with the reader threads of all the workers (the
        cores they would use) and pinning as torch pins theirs."""
        dataset = self.dataset
        if self.num_workers > 0:
            own = self._own_reader
            if own is None:
                own = self._own_reader = _copy.copy(dataset)
                own.pin_memory = own.pin_memory or self.pin_memory
                own.reader_threads = max(1, own.reader_threads) * self.num_workers
                own.pools = ReaderThreads(own.reader_threads)
                own.transform = timed_for_race(own.transform, self.race)
            dataset = own
        return dataset.produce(Shipping(stats=False, positions=self._ship_positions))

    def from_workers(self, raw: Iterator[Any]) -> Iterator[Any]:
        """torch's iterator, guarded against dead workers, recording how many batches wait."""
        batches = self._guarded(raw)
        queue = getattr(raw, "_data_queue", None)
        return batches if self.meter is None or queue is None else _polling_workers(batches, queue, self.meter)

    def start_workers(self) -> Iterator[Any]:
        """torch's multi-process iterator (it starts the workers, or resets persistent ones)."""
        self.workers_stopped()
        shared_temp_dir()  # before torch builds the workers' Process objects, which copy it
        self.workers_started = True
        try:
            return super().__iter__()
        except (ConnectionError, EOFError) as error:  # a worker died while starting (BrokenPipeError, ...)
            ended = ended_server()
            if ended is not None:
                raise ConfigError(
                    "num_workers",
                    self.num_workers,
                    f"the fork server that starts the workers (pid {ended[0]}) {how_it_ended(ended[1])} before they "
                    f"started ({type(error).__name__}; a traceback it printed is above)",
                    "iterate again (a new fork server starts); if it ends again, its traceback or what killed it "
                    "is the cause; or set num_workers=0 (reader threads need no worker processes)",
                ) from error
            raise ConfigError(
                "num_workers",
                self.num_workers,
                f"a worker process failed while starting ({type(error).__name__}; its traceback is printed above)",
                STARTING_HINT,
            ) from error

    def _get_iterator(self) -> Any:
        """torch's iterator; with workers one that notices a dead worker promptly (`WatchedWorkersIterator`)."""
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return WatchedWorkersIterator(self)

    def stop_workers(self, raw: Iterator[Any]) -> None:
        """Shut down the workers of torch's iterator ``raw`` (the race chose this process) on a
        background thread (`WorkerStop`): this process reads on meanwhile."""
        if self._iterator is raw:
            self._iterator = None
        shutdown = getattr(raw, "_shutdown_workers", None)
        if shutdown is not None:
            self.worker_stop = WorkerStop(shutdown).start()

    def workers_stopped(self) -> None:
        """Wait until workers stopped by `stop_workers` have exited."""
        stopping, self.worker_stop = self.worker_stop, None
        if stopping is not None:
            stopping.wait()

    def metrics_snapshot(self) -> Snapshot:
        """Cumulative totals of this process: the consumer's side and every pipeline stage.

        Figures of a span are ``figures(later.minus(earlier))`` (see `lance_lightning.metrics.figures`).
        """
        meter = self.meter or LoaderMeter()
        totals = {**self.dataset.clock.peek(), **meter.totals(time.perf_counter())}
        return Snapshot(totals, meter.fetch.counts)

    def describe(self) -> dict[str, Any]:
        """The settings the report bases its advice on (plain types)."""
        dataset = self.dataset
        transform = dataset.transform
        return {
            "num_workers": self.num_workers,
            "reader_threads": dataset.reader_threads,
            "prefetch_groups": dataset.prefetch_groups,
            "prefetch_batches": getattr(dataset, "prefetch_batches", None),
            "take_group_bytes": getattr(dataset, "take_group_bytes", None),
            "batch_size": dataset.plan.batch_size,
            "method": dataset.plan.method,
            "shuffle": dataset.plan.strategy.describe(),
            "transform": type(transform).__name__ if transform is not None else None,
            "world_size": dataset.world_size,
            "rank": dataset.rank,
            "workers_choice": self.race.describe(done=True) if self.race is not None else None,
            "workers_started": self.workers_started,
            "worker_server": running_server() if self.workers_started else None,
        }

    def state_dict(self) -> dict[str, Any]:
        """The cursor, for a loop without a trainer; empty for a trainer's loader, whose data module
        saves the cursor (one copy per checkpoint)."""
        return self.cursor.state() if self.progress is None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume a loop without a trainer from `state_dict`; a trainer's loader is restored by its data
        module (Lightning skips this call in some runs: #20550)."""
        if self.progress is not None or not state:
            return
        self.cursor.restore(state)
        restored = self.cursor.state()
        self._own_epoch = restored["trainer_epoch"] + (1 if finished(restored) else 0)  # a finished one: the next
