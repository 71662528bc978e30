"""The reader and transform threads of a process, and ordered read-ahead on them.

Guarantees:
- `ReaderThreads` keeps one pool per stage (read, transform) from epoch to epoch, so RSS stays
  flat; each thread runs torch with one intra-op thread under ``SCHED_BATCH`` (Linux), so it never
  preempts the training loop's thread, which keeps its own intra-op thread count. Pickling or
  forking leaves the threads behind.
- `ReadAhead` hands results out in the order the work items went in, whatever thread finished
  first, with at most ``depth`` items in flight or waiting (memory is bounded by ``depth`` results).
  With ``inline_first`` the first item runs on the consuming thread before any is submitted: a
  small first item (a filtered plan's one-batch first group) then waits for no thread to start
  (3 ms each on a loaded 2-core machine) or wake.
- ``stop()`` (also run when the consumer stops iterating early) cancels its own queued work, never
  the shared threads, and never blocks on a running item; an exception raised by the work is
  re-raised to the consumer.
- Lance reads and torchvision decoding release the GIL, so threads overlap them with the
  training step without the cost of shipping batches between processes.
- With a clock (given, or the ``clock`` of ``work``), each hand-off adds how many items were
  ready ahead to ``prefetch_ready``, the queue's ``depth`` to ``prefetch_slots`` and one to
  ``prefetch_polls``: the queue depth the consumer saw.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch

In = TypeVar("In")
Out = TypeVar("Out")


class ReadAhead(Generic[In, Out]):
    """Runs ``work`` on upcoming items on ``pool``, ``depth`` items ahead (inline without a pool)."""

    def __init__(
        self,
        work: Callable[[In], Out],
        items: Iterable[In],
        pool: ThreadPoolExecutor | None,
        depth: int,
        clock: Any = None,
        inline_first: bool = False,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got depth={depth}")
        self._inline_first = inline_first
        self._work = work
        self._items = iter(items)
        self._pool = pool
        self._depth = depth
        self._pending: deque[Future[Out]] = deque()
        clock = clock if clock is not None else getattr(work, "clock", None)
        self._clock = clock if clock is not None and getattr(clock, "enabled", False) else None

    @property
    def pending(self) -> int:
        """Items submitted and not yet handed out (running, queued or finished); at most ``depth``."""
        return len(self._pending)

    @property
    def ready(self) -> int:
        """Items finished and waiting to be handed out."""
        return sum(1 for future in self._pending if future.done())

    def stop(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def __iter__(self) -> Iterator[Out]:
        pool = self._pool
        if pool is None:
            yield from map(self._work, self._items)
            return
        try:
            if self._inline_first:
                # The first item on this thread: its result waits for no thread to start or wake.
                try:
                    item = next(self._items)
                except StopIteration:
                    return
                result = self._work(item)
                if self._clock is not None:
                    self._clock.merge({"prefetch_ready": 0, "prefetch_slots": self._depth, "prefetch_polls": 1})
                yield result
            self._fill(pool)
            while self._pending:
                if self._clock is not None:
                    self._clock.merge(
                        {"prefetch_ready": self.ready, "prefetch_slots": self._depth, "prefetch_polls": 1}
                    )
                result = self._pending.popleft().result()
                self._fill(pool)
                yield result
        finally:
            self.stop()

    def _fill(self, pool: ThreadPoolExecutor) -> None:
        while len(self._pending) < self._depth:
            try:
                item = next(self._items)
            except StopIteration:
                return
            self._pending.append(pool.submit(self._work, item))


class ReaderThreads:
    """The reader and transform threads of one process, kept from epoch to epoch (start/stop).

    Fresh threads every epoch would each get a fresh malloc arena that keeps what it freed, so
    the process's RSS would grow with every epoch; the same threads keep it flat.
    """

    STAGES = ("read", "transform")

    def __init__(self, reader_threads: int) -> None:
        self.reader_threads = reader_threads
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._pid = os.getpid()

    def start(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's threads do not exist here
            self._pools, self._pid = {}, os.getpid()
        if self.reader_threads and not self._pools:
            # A thread that never set its intra-op thread count takes the one set last in the
            # process: without this, the reader threads' 1 would become the training thread's.
            torch.set_num_threads(torch.get_num_threads())
            self._pools = {
                stage: ThreadPoolExecutor(
                    self.reader_threads, thread_name_prefix=f"lance-{stage}", initializer=_background_thread
                )
                for stage in self.STAGES
            }

    def stop(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def ahead(
        self,
        stage: str,
        work: Callable[[Any], Any],
        items: Iterable[Any],
        depth: int,
        clock: Any = None,
        inline_first: bool = False,
    ) -> ReadAhead:
        """A `ReadAhead` of ``work`` over ``items`` on this process's ``stage`` threads (the first
        item on the calling thread with ``inline_first``)."""
        if not self.reader_threads:
            return ReadAhead(work, items, None, depth, clock=clock)
        self.start()
        return ReadAhead(work, items, self._pools[stage], depth, clock=clock, inline_first=inline_first)

    def __getstate__(self) -> dict[str, Any]:
        return {"reader_threads": self.reader_threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ReaderThreads.__init__(self, state["reader_threads"])


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
