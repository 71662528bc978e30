"""How a loader's batches reach the accelerator: one path per loader, fixed when the loader is built.

Guarantees:
- `DevicePath` is decided once, when the data module builds a loader, and passed to the loader's
  constructor: either ahead (``depth`` > 0: on CUDA, `DeviceAhead` below) or in the training
  loop's hooks (``depth`` 0). Every batch the loader yields goes through `DevicePath.deliver`,
  which hands the batch's row positions (shipped beside it in its `Shipment`) to the bad-row guard
  that needs them: the background thread's `DevicePreparation` ahead, else the data module's hooks
  through `InHand`, the record of the batch the training loop holds. Nothing decides again per
  batch, and no loader attribute changes after construction.
- `DeviceAhead` runs ``prepare`` (the copy to the device, then the device transform under the
  bad-row policy) on up to ``depth`` batches ahead of the training loop, in one thread
  (`AheadThread`, named ``lance-device-ahead``) that issues its work on its own CUDA stream, so a
  GPU decode's host work and kernels overlap the step before. The training thread receives the
  batches in order; its current stream (read when each batch is handed over) waits on an event
  recorded after the batch's work, and every CUDA tensor of the batch is marked as used by that
  stream, so its memory is not reused by a later batch while the step still reads it.
- An exception raised while reading or preparing a batch (a `BadRowError`, a decode error, a
  worker's failure) is raised on the training thread when that batch is due, after the batches
  before it: nothing is lost or reordered.
- Nothing is taken from the source more than ``depth`` batches ahead of the consumer, and the
  loader advances its cursor when it yields a batch, so a checkpoint counts only delivered batches.
- `AheadThread.stop` (also run when the consumer leaves the iteration early) ends the thread after
  the batch in hand (and at most one more being read when it was called) and waits for the work
  in flight.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lance_lightning.device.transfer import DeviceTransfer, move, record_stream
from lance_lightning.metrics.clock import StageClock

#: What the loader iterates: (batch, worker statistics or None, row positions or None).
Item = tuple[Any, Any, Any]
#: A device bad-row guard: ``guard(device batch, row positions)`` returns the device-transformed batch.
Guard = Callable[[Any, Any], Any]
_END = object()


class InHand:
    """The batch the training loop holds, as its loader's `DevicePath` delivered it: whether it is
    already prepared on the device, else the guard and row positions the device transform runs
    under in the hooks (``None``: the plain device transform). Lightning fetches no batch ahead of
    a loader with a length, so the last batch delivered is the one the hooks receive."""

    def __init__(self) -> None:
        self.prepared = False
        self.guard: Guard | None = None
        self.positions: Any = None

    def hold(self, prepared: bool, guard: Guard | None, positions: Any) -> None:
        self.prepared, self.guard, self.positions = prepared, guard, positions


class DevicePath:
    """How one loader's batches reach ``device`` (see the module docstring).

    Args:
        transfer: The copy to the device (`DeviceTransfer`).
        device: The trainer's device (``None`` without a trainer: batches stay on the host).
        device_transform: Runs on each device batch (``None``: none).
        depth: Batches prepared ahead in a background thread (`DeviceAhead`); 0: the hooks copy
            and transform each batch between steps.
        guard: ``guard(clock)`` builds the bad-row guard of the device transform, counting bad rows
            in the loader's ``clock``; ``None``: no positions are shipped, no guard runs.
        in_hand: Where each delivered batch is recorded for the hooks (``None``: no hooks read it).
    """

    def __init__(
        self,
        transfer: DeviceTransfer,
        device: torch.device | None,
        device_transform: Callable[[Any], Any] | None,
        depth: int,
        guard: Callable[[StageClock], Guard] | None = None,
        in_hand: InHand | None = None,
    ) -> None:
        self.transfer = transfer
        self.device = device
        self.device_transform = device_transform
        self.depth = depth
        self.guard = guard
        self.in_hand = in_hand
        #: The guard of the last clock delivered for (a rebuilt loader measures with a new one).
        self._guards: tuple[StageClock, Guard] | None = None

    @property
    def ships_positions(self) -> bool:
        """Whether the loader's batches carry their rows' positions (the guard needs them)."""
        return self.guard is not None

    def deliver(self, items: Iterator[Item], clock: StageClock) -> Iterator[Item]:
        """``items`` on their way to the device: prepared ahead, or recorded for the hooks."""
        guard = self._guard_of(clock)
        if self.depth:
            if self.device is None:
                raise ValueError(f"DevicePath: depth={self.depth} prepares batches ahead on a device; device is None")
            prepare = DevicePreparation(self.transfer, self.device, self.device_transform, guard)
            items = DeviceAhead(prepare, self.device, self.depth).iterate(items)
        in_hand, prepared = self.in_hand, self.depth > 0
        try:
            for batch, shipped, positions in items:
                if in_hand is not None:
                    in_hand.hold(prepared, None if prepared else guard, positions)
                yield batch, shipped, positions
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a consumer that left early stops the thread and the reads now, not at a GC

    def _guard_of(self, clock: StageClock) -> Guard | None:
        if self.guard is None:
            return None
        if self._guards is None or self._guards[0] is not clock:
            self._guards = (clock, self.guard(clock))
        return self._guards[1]


class DevicePreparation:
    """What `DeviceAhead` does to each batch: the copy to ``device``, then the device transform,
    under the bad-row ``guard`` when the rows' positions came with the batch.

    Holds no reference to the data module, so a data module is freed without the cyclic GC.
    """

    def __init__(
        self,
        transfer: DeviceTransfer,
        device: torch.device,
        device_transform: Callable[[Any], Any] | None,
        guard: Callable[[Any, Any], Any] | None,
    ) -> None:
        self.transfer = transfer
        self.device = torch.device(device)
        self.device_transform = device_transform
        self.guard = guard

    def __call__(self, batch: Any, positions: Any) -> Any:
        batch = self.transfer(batch, self.device) if isinstance(batch, dict) else move(batch, self.device)
        if self.device_transform is None:
            return batch
        if self.guard is not None and positions is not None:
            return self.guard(batch, positions)
        return self.device_transform(batch)


class DeviceAhead:
    """Prepares batches on ``device`` ahead of the consumer (see the module docstring).

    Args:
        prepare: ``prepare(batch, positions)`` returns the batch ready for the step (on the device).
        device: The device of this process (CUDA: the work runs on a side stream; elsewhere it is
            simply done ahead, in the thread). ``"cuda"`` without an index is the current device.
        depth: Batches prepared ahead (>= 1).
    """

    def __init__(self, prepare: Callable[[Any, Any], Any], device: torch.device, depth: int = 2) -> None:
        self.prepare = prepare
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # the thread's torch.cuda.set_device needs an index (torch 2.11 refuses a bare "cuda")
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.depth = depth

    def iterate(self, items: Iterator[Item]) -> Iterator[Item]:
        """``items`` with each batch prepared on the device, ``depth`` batches ahead."""
        thread = AheadThread(self, items)
        thread.start()
        try:
            yield from thread
        finally:
            thread.stop()


class AheadThread:
    """The thread behind `DeviceAhead.iterate`: pulls, prepares and queues; ``start``/``stop``."""

    def __init__(self, ahead: DeviceAhead, items: Iterator[Item]) -> None:
        self.ahead = ahead
        self.items = items
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=ahead.depth)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lance-device-ahead", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop pulling after the batch in hand, drop what is queued, wait for the thread."""
        self._stopping.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=0.05)
        self._drain()
        close = getattr(self.items, "close", None)
        if close is not None:
            close()  # the source's own cleanup (reader threads, workers) runs now, not at a later GC

    def __iter__(self) -> Iterator[Item]:
        cuda = self.ahead.device.type == "cuda"
        while True:
            entry = self._ready.get()
            if entry is _END:
                return
            if isinstance(entry, BaseException):
                raise entry
            (batch, shipped, positions), done = entry
            if cuda:
                # the consumer's stream now (it may have changed since the first batch, e.g. a
                # model that trains on a stream of its own)
                compute = torch.cuda.current_stream(self.ahead.device)
                compute.wait_event(done)
                record_stream(batch, compute)
            yield batch, shipped, positions

    def _run(self) -> None:
        try:
            stream = self._stream()
            for batch, shipped, positions in self.items:
                if self._stopping.is_set():  # the consumer left while this batch was read
                    return
                if stream is None:  # another device: the work is done when prepare returns
                    ready, done = self.ahead.prepare(batch, positions), None
                else:
                    with torch.cuda.stream(stream):
                        ready = self.ahead.prepare(batch, positions)
                        done = torch.cuda.Event()
                        done.record(stream)
                if not self._put(((ready, shipped, positions), done)):
                    return
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread, in order
            self._put(error)
            return
        self._put(_END)

    def _stream(self) -> Any:
        """This thread's CUDA stream on the device (``None`` off CUDA)."""
        device = self.ahead.device
        if device.type != "cuda":
            return None
        torch.cuda.set_device(device)
        return torch.cuda.Stream(device)

    def _put(self, entry: Any) -> bool:
        """Queue ``entry`` unless stopping; False once stopping."""
        while not self._stopping.is_set():
            try:
                self._ready.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _drain(self) -> None:
        while True:
            try:
                self._ready.get_nowait()
            except queue.Empty:
                return
