"""Large worker batches handed to the training process through reused shared memory.

Guarantees:
- In a `LanceDataLoader`'s worker process, a batch too large to travel inside its message
  (`lance_lightning.produce.parcel`), or a run of small batches sent as one message
  (`SlabRing.pack_run`), is copied once into one of the worker's shared-memory slabs and travels
  as `SlabParcel`s: the slab's handle the first time the slab is used, then only its slot, with
  each tensor's key, dtype, shape and offset. A slab is made once and reused, so no
  batch costs a fresh shared-memory allocation, its page faults, or torch's per-tensor handshake.
- The training process unpickles a plain batch (same keys, values, dtypes, shapes; `Ragged`
  columns as `Ragged`) whose large tensors (`VIEW_BYTES` and more) are views of the slab: no copy
  on receipt; smaller ones are copied out, so a loop that keeps a batch's ids does not keep its
  slab. The slab returns to its worker only when the last view of it is freed (a finalizer on each
  batch's buffer, counting down the batches of its message), so a batch the training loop keeps
  is never overwritten.
- A worker whose slots are all held (the loop keeps many batches), or whose slabs would pass
  `MAX_SLAB_BYTES`, sends the batch the way torch does (fresh shared memory per tensor): slower,
  never blocked, never wrong.
- Slabs are torch's anonymous (file-descriptor) shared memory: nothing is left behind in
  ``/dev/shm`` however the processes end.
"""

from __future__ import annotations

import ctypes
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from lance_lightning.produce.convert import Ragged

#: Slabs per worker process (a slot is held from the copy until the batch's tensors are freed).
SLOTS = 64
#: A worker's slabs hold at most this many bytes together.
MAX_SLAB_BYTES = 1 << 29
#: Offsets of tensors in a slab are multiples of this.
ALIGN = 64
#: Tensors of at least this many bytes arrive as views of the slab; smaller ones are copied out.
VIEW_BYTES = 1 << 16
#: Slabs grow in steps of this many bytes (batches of similar size reuse one slab).
GRAIN = 1 << 20


@dataclass
class SlabChannel:
    """What a loader's workers and the training process share: a token naming the loader and one
    byte per (worker, slot), 1 while the slot's batch is in flight or held. Made by the loader."""

    token: str
    held: Any  # a multiprocessing RawArray("b", workers * SLOTS) of the loader's start method
    storages: dict[tuple[int, int], torch.UntypedStorage] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, context: Any, workers: int) -> SlabChannel:
        channel = cls(uuid.uuid4().hex, context.RawArray("b", workers * SLOTS))
        _CHANNELS[channel.token] = channel
        return channel

    def close(self) -> None:
        """Forget this loader's slabs (those under live tensors stay mapped until they are freed)."""
        _CHANNELS.pop(self.token, None)
        self.storages.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self.token, "held": self.held, "storages": {}}


#: The training process's open channels, by token.
_CHANNELS: dict[str, SlabChannel] = {}
#: This worker process's ring, if it is a loader's worker.
_RING: SlabRing | None = None


def start_worker_ring(channel: SlabChannel, worker: int) -> None:
    """In a loader's worker process, at its start: batches may leave through ``channel``'s slabs."""
    global _RING
    _RING = SlabRing(channel, worker)


def worker_ring() -> SlabRing | None:
    return _RING


class SlabRing:
    """One worker's slabs: copies a batch into a free one (`pack`)."""

    def __init__(self, channel: SlabChannel, worker: int) -> None:
        self.channel, self.worker = channel, worker
        self.slabs: list[torch.UntypedStorage | None] = [None] * SLOTS
        self.sent = [False] * SLOTS

    def pack(self, batch: dict[str, Any], tensors: list[torch.Tensor]) -> SlabParcel | None:
        """``batch`` copied into a free slab, or None when no slot is free (or the bound is reached)."""
        parcels = self.pack_run([(batch, tensors)])
        return parcels[0] if parcels else None

    def pack_run(self, batches: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> list[SlabParcel] | None:
        """Consecutive ``(batch, tensors)`` copied into one free slab, one `SlabParcel` each (sent in
        one message: the slot returns when the last of them is freed), or None as for ``pack``."""
        offsets, end = [], 0
        for _, tensors in batches:
            for tensor in tensors:
                offsets.append(end)
                end += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
        slot = self._slot(max(end, ALIGN))
        if slot is None:
            return None
        storage = self.slabs[slot]
        if storage is None:  # `_slot` hands out only slots that hold a slab
            raise RuntimeError(f"slab slot {slot} has no slab")
        whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        specs = iter(zip((tensor for _, tensors in batches for tensor in tensors), offsets))
        first = not self.sent[slot]
        self.sent[slot] = True
        parcels = []
        for part, (batch, _) in enumerate(batches):
            layout: list[tuple[str, str, Any]] = []
            for key, value in batch.items():
                if isinstance(value, Ragged):
                    layout.append((key, "ragged", (_copy_in(whole, *next(specs)), _copy_in(whole, *next(specs)))))
                elif isinstance(value, torch.Tensor):
                    layout.append((key, "tensor", _copy_in(whole, *next(specs))))
                else:
                    layout.append((key, "value", value))
            shared = storage if first and part == 0 else None
            parcels.append(SlabParcel(self.channel.token, self.worker, slot, shared, layout, len(batches) - part))
        return parcels

    def _slot(self, nbytes: int) -> int | None:
        held, base = self.channel.held, self.worker * SLOTS
        free = [slot for slot in range(SLOTS) if not held[base + slot]]
        fits = [slot for slot in free if (slab := self.slabs[slot]) is not None and slab.nbytes() >= nbytes]
        if fits:
            slot = fits[0]
        else:
            empty = [slot for slot in free if self.slabs[slot] is None] or free
            if not empty:
                return None
            slot = empty[0]
            size = -(-nbytes // GRAIN) * GRAIN
            kept = sum(s.nbytes() for i, s in enumerate(self.slabs) if s is not None and i != slot)
            if kept + size > MAX_SLAB_BYTES:
                return None
            self.slabs[slot] = torch.UntypedStorage._new_shared(size)
            self.sent[slot] = False
        held[base + slot] = 1
        return slot


def _copy_in(whole: torch.Tensor, tensor: torch.Tensor, offset: int) -> tuple[str, tuple[int, ...], int]:
    nbytes = tensor.numel() * tensor.element_size()
    whole[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset


class SlabParcel:
    """A batch in a slab, unpickled in the training process as the plain batch over the slab.
    ``left``: this batch and those after it in the same slab and message (the first one counts
    them all)."""

    __slots__ = ("token", "worker", "slot", "storage", "layout", "left")

    def __init__(self, token: str, worker: int, slot: int, storage: Any, layout: list, left: int = 1) -> None:
        self.token, self.worker, self.slot, self.storage, self.layout = token, worker, slot, storage, layout
        self.left = left

    def __reduce__(self) -> tuple[Any, ...]:
        return (_receive, (self.token, self.worker, self.slot, self.storage, self.layout, self.left))


#: Batches of a slot's message still alive in the training process, by (token, worker, slot).
_LIVE: dict[tuple[str, int, int], int] = {}


def _receive(token: str, worker: int, slot: int, storage: Any, layout: list, left: int = 1) -> dict[str, Any]:
    channel = _CHANNELS[token]
    if storage is not None:
        channel.storages[(worker, slot)] = storage
    storage = channel.storages[(worker, slot)]
    key = (token, worker, slot)
    _LIVE.setdefault(key, left)  # the message's first batch counts them all
    buffer = _buffer_type(storage.nbytes()).from_address(storage.data_ptr())
    # The slot is freed when the last tensor over the last of its batches' buffers is; the
    # finalizer keeps the slab mapped.
    weakref.finalize(buffer, _release_one, key, channel.held, worker * SLOTS + slot, storage)

    def tensor(spec: tuple[str, tuple[int, ...], int]) -> torch.Tensor:
        dtype, shape, offset = spec
        torch_dtype = getattr(torch, dtype)
        count = int(np.prod(shape, dtype=np.int64))
        # numpy's stub (before Python 3.12's Buffer) lists bytes-like types; a ctypes array is a buffer too.
        array: np.ndarray = np.frombuffer(buffer, dtype=NUMPY_DTYPES[torch_dtype], count=count, offset=offset)  # type: ignore[call-overload]
        if array.nbytes < VIEW_BYTES:  # a small column kept (ids to log) must not keep the slab
            array = array.copy()
        return torch.from_numpy(array.reshape(shape))

    return unpack(layout, tensor)


def unpack(items: list[tuple[str, str, Any]], tensor: Any) -> dict[str, Any]:
    """A batch from ``(key, kind, payload)`` items: ``tensor(payload)`` for each tensor ("tensor",
    and the values and offsets of "ragged"), other values as they are."""
    batch: dict[str, Any] = {}
    for key, kind, payload in items:
        if kind == "ragged":
            batch[key] = Ragged(tensor(payload[0]), tensor(payload[1]))
        elif kind == "tensor":
            batch[key] = tensor(payload)
        else:
            batch[key] = payload
    return batch


def _release_one(key: tuple[str, int, int], held: Any, index: int, storage: Any) -> None:
    _LIVE[key] -= 1
    if not _LIVE[key]:
        del _LIVE[key]
        held[index] = 0


_BUFFER_TYPES: dict[int, type[ctypes.Array[ctypes.c_char]]] = {}


def _buffer_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    """A ctypes byte-array type of ``nbytes`` that takes weak references (one per slab size)."""
    if nbytes not in _BUFFER_TYPES:
        # type() returns a plain `type` to the checker; here it is a subclass of c_char * nbytes.
        _BUFFER_TYPES[nbytes] = cast(
            "type[ctypes.Array[ctypes.c_char]]", type("SlabBuffer", (ctypes.c_char * nbytes,), {})
        )
    return _BUFFER_TYPES[nbytes]


#: Tensor dtypes NumPy holds, and their NumPy types.
NUMPY_DTYPES = {
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}
