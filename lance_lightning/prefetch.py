"""Ordered read-ahead on a thread pool.

Guarantees:
- Results come out in the order the work items went in, whatever thread finished first.
- At most ``depth`` items are in flight or waiting, so memory is bounded by ``depth`` results.
- ``stop()`` (also run when the consumer stops iterating early) cancels queued work and never
  blocks on a running item; an exception raised by the work is re-raised to the consumer.
- Lance reads and torchvision decoding release the GIL, so threads overlap them with the
  training step without the cost of shipping batches between processes.
- With a clock (given, or the ``clock`` of ``work``), each hand-off adds how many items were
  ready ahead to ``prefetch_ready``, the queue's ``depth`` to ``prefetch_slots`` and one to
  ``prefetch_polls``: the queue depth the consumer saw.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class ReadAhead(Generic[In, Out]):
    """Runs ``work`` on upcoming items with ``threads`` threads, ``depth`` items ahead."""

    def __init__(self, work: Callable[[In], Out], items: Iterable[In], threads: int, depth: int,
                 name: str = "lance-read-ahead", clock: Any = None) -> None:
        if threads < 0 or depth < 1:
            raise ValueError(f"threads must be >= 0 and depth >= 1, got threads={threads}, depth={depth}")
        self._work = work
        self._items = iter(items)
        self._threads = threads
        self._depth = depth
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
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

    def start(self) -> None:
        if self._threads and self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)

    def stop(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __iter__(self) -> Iterator[Out]:
        if not self._threads:
            yield from map(self._work, self._items)
            return
        self.start()
        try:
            self._fill()
            while self._pending:
                if self._clock is not None:
                    self._clock.merge({"prefetch_ready": self.ready, "prefetch_slots": self._depth,
                                       "prefetch_polls": 1})
                result = self._pending.popleft().result()
                self._fill()
                yield result
        finally:
            self.stop()

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            item = next(self._items, _DONE)
            if item is _DONE:
                return
            self._pending.append(self._pool.submit(self._work, item))


_DONE = object()
