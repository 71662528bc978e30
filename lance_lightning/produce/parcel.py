"""Batches leaving a DataLoader worker process as one message each, not one shared-memory handle per tensor.

Guarantees:
- `Parcel` wraps a finished batch in a worker process. Pickled (torch sends worker results through
  a pipe), its tensors travel as NumPy arrays inside the one message and the training process
  unpickles a plain batch: a dict of the same keys, values, dtypes and shapes (`Ragged` columns
  as a `Ragged`), each tensor over the array NumPy unpickled (the bytes are copied into the
  message once and out of it once).
- Why: torch sends each tensor as a shared-memory file descriptor, which costs the receiving
  process a socket connection and several system calls per tensor: with three columns and
  256-row batches it took about 4 ms a batch (60k rows/s through 2 workers against 1.5M in
  process). Copying a batch through the pipe costs microseconds per 100 KB.
- Only batches whose tensors hold at most `PARCEL_MAX_BYTES` travel this way; larger ones go
  through the worker's reused shared-memory slabs (`lance_lightning.produce.slabs`: no copy on
  receipt), or, when none is free, torch's shared memory. A worker's run of small batches sent as
  one message (`slab_run`) shares one slab when a tensor of it would arrive as a view of it
  (`VIEW_BYTES`): one copy into shared memory per batch, none on receipt, one slot per message.
  Tensors NumPy cannot hold (bfloat16) or pinned ones keep torch's way. Lists and other values travel as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lance_lightning.produce.convert import Ragged
from lance_lightning.produce.slabs import NUMPY_DTYPES, VIEW_BYTES, unpack, worker_ring
from lance_lightning.vocabulary import Shipment

#: Batches of at most this many tensor bytes travel inside their message (larger: shared memory,
#: whose per-tensor handshake, about 1 ms, costs less than copying a megabyte through the pipe).
PARCEL_MAX_BYTES = 1 << 20


class Parcel:
    """A worker's finished batch, unpickled in the training process as the plain batch."""

    __slots__ = ("batch",)

    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpack, (_pack(self.batch),))


def parcel(batch: Any) -> Any:
    """``batch`` as a `Parcel` when it is a dict whose tensors fit `PARCEL_MAX_BYTES` and can all
    travel as NumPy arrays; a larger one as a `SlabParcel` where a slab is free; else ``batch``."""
    tensors = _tensors(batch)
    if tensors is None:
        return batch
    if sum(tensor.numel() * tensor.element_size() for tensor in tensors) <= PARCEL_MAX_BYTES:
        return Parcel(batch)
    ring = worker_ring()
    return (ring.pack(batch, tensors) if ring is not None else None) or batch


def slab_run(shipments: list[Shipment]) -> list[Shipment]:
    """A worker's run of consecutive batches (one message), its `Parcel`s copied together into one
    free slab when one of their tensors would arrive as a view (`VIEW_BYTES`): then no batch of
    the run is copied on receipt. Else, or with no slab free, the run as it is."""
    ring = worker_ring()
    small = [i for i, shipment in enumerate(shipments) if isinstance(shipment.batch, Parcel)]
    if ring is None or not small:
        return shipments
    items = []
    for i in small:
        batch = shipments[i].batch.batch
        tensors = _tensors(batch)
        if tensors is None:  # `parcel` makes a Parcel only of a batch whose tensors all travel
            raise RuntimeError("a Parcel holds a tensor that cannot travel as a NumPy array")
        items.append((batch, tensors))
    if not any(t.numel() * t.element_size() >= VIEW_BYTES for _, tensors in items for t in tensors):
        return shipments
    packed = ring.pack_run(items)
    if packed is None:
        return shipments
    run = list(shipments)
    for i, slab in zip(small, packed):
        run[i] = Shipment(slab, run[i].stats, run[i].positions)
    return run


def _tensors(batch: Any) -> list[torch.Tensor] | None:
    """The tensors of a dict batch, Ragged columns' two each, or None when one cannot travel as a
    NumPy array (or ``batch`` is no dict)."""
    if not isinstance(batch, dict):
        return None
    tensors = []
    for value in batch.values():
        for tensor in (value.values, value.offsets) if isinstance(value, Ragged) else (value,):
            if isinstance(tensor, torch.Tensor):
                if not _travels(tensor):
                    return None
                tensors.append(tensor)
    return tensors


def _travels(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and not tensor.is_pinned() and tensor.dtype in NUMPY_DTYPES


def _pack(batch: dict[str, Any]) -> list[tuple[str, str, Any]]:
    items: list[tuple[str, str, Any]] = []
    for key, value in batch.items():
        if isinstance(value, Ragged):
            items.append((key, "ragged", (_array(value.values), _array(value.offsets))))
        elif isinstance(value, torch.Tensor):
            items.append((key, "tensor", _array(value)))
        else:
            items.append((key, "value", value))
    return items


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().resolve_conj().resolve_neg().numpy()


def _unpack(items: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return unpack(items, _tensor)


def _tensor(array: np.ndarray) -> torch.Tensor:
    if not array.flags.writeable:  # unpickled over a read-only buffer: torch wants a writable one
        array = np.array(array)
    return torch.from_numpy(array)
