"""Worker processes start while the training process reads the epoch's batches; a race decides who reads on.

Guarantees:
- When a `LanceDataLoader`'s iteration needs worker processes that are not running (its first
  iteration, every iteration without persistent workers), it does not wait for them: it reads the
  epoch's batches in its own process, as with ``num_workers=0``, measuring its rate and the CPU
  time of a transform that may hold the GIL against its loop's (`lance_lightning.load.race`).
  Only once the race finds that workers could pay (`Race.may_start_workers`: at once when its
  outcome is forced) does `WorkerStart` wait on a background thread for the fork server's imports
  (4.3 s on a 2-core VM: longer than a 10^5-row epoch read in process), starting the server
  unless `start_server_early` did at ``setup`` (it does where the transform may hold the GIL); a
  read without such a transform never starts it. Started for the race, the server's imports
  yield the CPU to this process (`server_yields`): they run on the CPU the read in process leaves
  idle, not on its share.
- Once the server is ready (and a window of batches was measured in process), the loader
  starts the workers itself (a fork each) with the sequence row of the first batch it will not
  read (`handover_step`: after the batches it has read ahead, and with a buffer shuffle at the
  start of a buffer, since workers that began inside one would read it again and every later
  buffer in two pieces), and takes the rest of the epoch from them. While racing it measures their
  delivered rate over a trial; if they are not faster by `lance_lightning.load.race.MARGIN` it
  stops them (on a background thread, `WorkerStop`: it does not wait for them to exit) and reads
  on in process from the first batch they did not deliver (and tries them
  again at a later epoch: `lance_lightning.load.race.Race.retrial_due`). Each batch is
  read once, in the plan's order, whichever side reads it: the same batches a restore from a
  cursor at that batch reads (`lance_lightning.cursor.tracker`).
- The loader looks whether the server is ready after each batch it yields, never before the
  first (nor before `lance_lightning.load.race.WINDOW_BATCHES` batches were measured here), and
  hands over only where the workers have batches left to read. An epoch this process finishes
  first does not wait for the server: the next epoch looks again and starts the workers there,
  raising a worker that cannot start (`ConfigError`, `WorkerDiedError`) when their batches are
  needed. With the outcome forced to ``workers`` the loader waits for the server once the
  epoch's first batch is yielded and hands over there (`handover_step`: after what it has read
  ahead), in every epoch of more than one batch. Where that leaves the workers nothing they start
  all the same, and their empty read runs before this process yields its last batches: a worker
  that cannot start is raised to a loop that stops at the epoch's last batch, as Lightning's does
  (it never asks for the batch after it).
- Every process is started by the loader's own thread (the fork server in `WorkerStart.start`, the
  workers at the hand-over): a process started by a thread that then ends would lose its death
  signal (`lance_lightning.lifetime`). The background thread only starts an empty process through
  the fork server (the server's child, not this process's): it returns once the server has forked it.
  The server's temp folder has its janitor before the server starts (`ensure_server`), so a
  training process killed before any worker starts leaves no ``pymp-*`` folder.
- ``LANCE_LIGHTNING_WORKER_HANDOFF=off`` makes every iteration wait for its workers and read
  nothing in this process (for transforms that must run only in workers, and for tests that
  follow one worker); ``LANCE_LIGHTNING_WORKER_CHOICE`` forces the race's outcome.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from lance_lightning.checks import env_switch
from lance_lightning.load.dataset import Bundle, WorkerError
from lance_lightning.load.forked_server import forked_running
from lance_lightning.load.lean_start import ensure_server, start_worker_server
from lance_lightning.load.race import forced_choice, may_hold_gil
from lance_lightning.plan.layout import Layout

ENV_SWITCH = "LANCE_LIGHTNING_WORKER_HANDOFF"


def handoff_enabled() -> bool:
    """Whether loaders read in process while their workers start (``LANCE_LIGHTNING_WORKER_HANDOFF``)."""
    return env_switch(ENV_SWITCH)


def start_server_early(num_workers: int, method: str, transform: Any) -> None:
    """At the data module's set-up, before it opens a dataset, start the fork server (a fork of
    this process where that is safe, `lance_lightning.load.forked_server`; else the stock one, whose
    imports, seconds, overlap planning, the model's set-up and the first batches) where workers are
    sure to start (an outcome forced by
    ``LANCE_LIGHTNING_WORKER_CHOICE``, the hand-over off) or may pay (a transform that may hold the
    GIL: the race then finds the server ready when its measured share opens the gate). A read
    without such a transform never starts it."""
    racing = server_yields()
    if not racing or may_hold_gil(transform):
        start_worker_server(num_workers, method, transform, yield_cpu=racing)


def server_yields() -> bool:
    """Whether the fork server's imports yield the CPU to this process: where the race reads in
    process while the server starts (neither outcome forced, the hand-over on)."""
    return forced_choice() == "race" and handoff_enabled()


def handover_step(layout: Layout, least: int, window_rows: int | None) -> int:
    """The step the workers begin at: ``least``, or with windows of ``window_rows`` sequence rows
    (a buffer shuffle's) the first step from ``least`` that starts a window, when one does within a
    window's steps."""
    if not window_rows:
        return least
    last = min(layout.steps, least + window_rows // layout.step_rows + 1)
    for step in range(least, last + 1):
        if (layout.start + layout.rows_after(step)) % window_rows == 0:
            return step
    return least


class WorkerStart:
    """Waits, on a background thread, until worker processes of ``context`` start without delay:
    for the stock ``forkserver``, until the fork server has finished its imports (it forks an
    empty process then); a forked server and other start methods are ready at once."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._thread = threading.Thread(target=self._wait, name="lance-lightning-worker-start", daemon=True)

    def start(self) -> WorkerStart:
        if self._forkserver:
            ensure_server(server_yields())  # on this thread (see the module docstring)
        self._thread.start()
        return self

    @property
    def _forkserver(self) -> bool:
        return self._context is not None and self._context.get_start_method() == "forkserver"

    def _wait(self) -> None:
        if not self._forkserver or forked_running():  # a forked server imports nothing: ready once forked
            return
        empty = self._context.Process(target=os.getpid, daemon=True)  # nothing to import
        try:
            empty.start()  # returns once the server has forked it: the server is ready
        except Exception:  # the workers' own start reports what is wrong
            return

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()


class WorkerStop:
    """Shuts down the workers of a lost trial on a background thread (``shutdown``: torch's
    iterator's): this process reads on at once while they finish their messages and exit (the
    shutdown waits for each worker's message in progress). ``wait`` joins it: at the next epoch's
    start, and before workers start again."""

    def __init__(self, shutdown: Any) -> None:
        self._thread = threading.Thread(target=shutdown, name="lance-lightning-worker-stop", daemon=True)

    def start(self) -> WorkerStop:
        self._thread.start()
        return self

    def wait(self) -> None:
        self._thread.join()


class GilTimed:
    """``transform``, each call's CPU seconds on its thread (not its waits: a sleep, I/O, the GIL
    held by another thread) added to ``record`` (the race's GIL share); its other attributes are
    the transform's."""

    def __init__(self, transform: Any, record: Any) -> None:
        self.transform = transform
        self.record = record

    def __call__(self, batch: Any) -> Any:
        started = time.thread_time()
        try:
            return self.transform(batch)
        finally:
            self.record(time.thread_time() - started)

    def __getattr__(self, name: str) -> Any:
        transform = self.__dict__.get("transform")  # absent while a copy is being made
        if transform is None:
            raise AttributeError(name)
        return getattr(transform, name)


def timed_for_race(transform: Any, race: Any) -> Any:
    """``transform`` as this process runs it while racing: timed when it may hold the GIL."""
    if race is None or not race.racing or not may_hold_gil(transform):
        return transform
    return GilTimed(transform, race.rates.add_gil_seconds)


def _batches_in(item: Any) -> int:
    """Batches in one item a loader reads: a worker's run of them, an error (none) or one."""
    if isinstance(item, Bundle):
        return len(item.shipments)
    return 0 if isinstance(item, WorkerError) else 1


def _timed(items: Iterator[Any], race: Any, rows: int) -> Iterator[Any]:
    """``items`` read in this process, recorded in ``race`` with the seconds from the arrival of
    the one before (the loop's whole cycle: its step, its wait) and the CPU seconds the loop's
    thread ran in them (its step); the first item only starts the clocks."""
    last = None
    for item in items:
        got, ran = time.perf_counter(), time.thread_time()
        if last is not None:
            batches = _batches_in(item)
            race.in_process(batches, batches * rows, got - last[0], ran - last[1])
        last = got, ran
        yield item


def read_epoch(loader: Any, layout: Layout) -> Iterator[Any]:
    """The epoch's items of ``loader`` (a `LanceDataLoader` with workers), from whichever side the
    race has chosen, starting the workers while reading in process when it needs them."""
    race = loader.race
    loader.workers_stopped()  # those of a trial lost in the last epoch
    running = loader.workers_running
    if loader.worker_start is None and (not handoff_enabled() or (running and race.choice == "workers")):
        return loader.from_workers(loader.start_workers())  # torch starts them, or resets running ones
    if race.retrial_due():
        race.retry()
    if race.choice == "in_process":
        race.epoch_read_in_process()  # counted here: a loop that stops at the last batch never ends the generator
        return _in_process_epoch(loader)
    if running and loader.worker_start is None:  # undecided, persistent workers up: their trial
        return _trial(loader, loader.start_workers(), layout, 0)
    return _handing_over(loader, layout)


def _in_process_epoch(loader: Any) -> Iterator[Any]:
    """The rest of the epoch (from the dataset's start row) read in process; the choice re-checked
    at its end."""
    race = loader.race
    yield from _timed(loader.in_process(), race, loader.dataset.plan.batch_size)
    race.decide()


def _handing_over(loader: Any, layout: Layout) -> Iterator[Any]:
    """This process's batches until workers can start without delay (`WorkerStart`), then theirs;
    the fork server starts once the race finds room for workers (`Race.may_start_workers`)."""
    race, dataset = loader.race, loader.dataset
    epoch, _ = dataset.control.get()
    steps = layout.rank_steps(dataset.rank)
    own = loader.in_process()
    read, handed = 0, steps
    _start_if_room(loader)
    try:
        for item in _timed(own, race, dataset.plan.batch_size):
            yield item
            read += 1
            at = _hand_over_at(loader, layout, read)
            if at is not None:
                handed = at
                break
        else:  # the epoch is done before the server: the next one looks at it again
            race.decide()
            return
        loader.worker_start.wait()
        dataset.set_epoch(epoch, layout.start + layout.rows_after(handed))
        workers = loader.start_workers()
        loader.worker_start = None
        race.new_workers()
        if handed >= steps:
            # Handed nothing (forced to them): their empty read runs before this process's last
            # batches, so a worker that cannot start is raised to a loop that stops at the last batch.
            yield from _trial(loader, workers, layout, handed)
        yield from itertools.islice(own, handed - read)
    finally:
        own.close()
    if handed < steps:
        yield from _trial(loader, workers, layout, handed)


def _start_if_room(loader: Any) -> WorkerStart | None:
    """The loader's `WorkerStart`, started here once the race finds room for workers."""
    if loader.worker_start is None and loader.race.may_start_workers():
        loader.worker_start = WorkerStart(loader.multiprocessing_context).start()
    return loader.worker_start


def _hand_over_at(loader: Any, layout: Layout, read: int) -> int | None:
    """The step the workers begin at, once ``read`` batches were read here, or None to read on.
    Racing: once the fork server is ready (started when the race finds room for workers) and the
    in-process window is measured, where the workers would have batches left to race on. Forced
    to the workers: at once, waiting for the server (its workers read every later batch)."""
    race, dataset = loader.race, loader.dataset
    starting = _start_if_room(loader)
    forced = race.forced == "workers"
    if starting is None or not (forced or (starting.ready() and race.rates.in_process is not None)):
        return None
    window = getattr(getattr(dataset.plan, "strategy", None), "window_rows", None)
    handed = handover_step(layout, read + dataset.prefetch_batches, window)
    return handed if forced or handed < layout.rank_steps(dataset.rank) else None


def _trial(loader: Any, raw: Iterator[Any], layout: Layout, step: int) -> Iterator[Any]:
    """The workers' items from ``step`` (``raw``: torch's iterator); racing, until the trial decides:
    the workers keep reading, or they stop and this process reads on from their first batch not
    delivered."""
    race, dataset = loader.race, loader.dataset
    workers = loader.from_workers(raw)
    if race.choice == "workers":
        yield from workers
        return
    rows = dataset.plan.batch_size
    epoch, _ = dataset.control.get()
    last = time.perf_counter()
    decided = None
    try:
        for item in workers:
            got = time.perf_counter()
            decided = race.worker_item(_batches_in(item) * rows, got - last)
            last = got
            yield item
            step += _batches_in(item)
            if decided is not None:
                break
        else:
            return
    finally:
        if decided == "in_process":
            workers.close()
            loader.stop_workers(raw)
    if decided == "workers":
        yield from workers
        return
    dataset.set_epoch(epoch, layout.start + layout.rows_after(step))
    yield from _in_process_epoch(loader)
