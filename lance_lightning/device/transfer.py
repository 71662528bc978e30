"""Getting batches onto the accelerator before the step needs them.

Guarantees:
- Host batches arrive pinned (`lance_lightning.produce.producer.pin_batch`, on the reader threads or
  the DataLoader's pin thread), so the host-to-device copy can be asynchronous.
- `DeviceTransfer` copies a batch's tensors with ``non_blocking=True``. On CUDA (``start``ed
  with ``copy_stream=True``) the copies are issued on a side stream: batch k+1 is copied while
  the GPU still runs step k's kernels (the CPU queues kernels ahead of the GPU), the compute
  stream waits on the copy only when step k+1 starts, and each tensor is marked as used by the
  compute stream so its memory is not reused early. Lists stay on the host, and so do the
  ``host_columns`` of the device transform (`host_columns`): the encoded bytes that
  ``DecodeImage(device="cuda")`` hands to the GPU decoder, which reads them on the host.
- Without CUDA (CPU, MPS, ...) a transfer is a plain ``.to(device)``, never an error.
"""

from __future__ import annotations

from typing import Any

import torch

from lance_lightning.produce.convert import Ragged


def host_columns(transform: Any) -> tuple[str, ...]:
    """The columns ``transform`` (a device transform, or None) reads on the host: its
    ``host_columns`` attribute, e.g. ``DecodeImage(device="cuda")``'s column of encoded bytes."""
    return tuple(getattr(transform, "host_columns", ()) or ())


def move(value: Any, device: torch.device) -> Any:
    """``value`` on ``device``: tensors and `Ragged` copy without blocking; str/bytes lists stay."""
    if isinstance(value, (torch.Tensor, Ragged)):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: move(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (torch.Tensor, Ragged, dict)):
        return type(value)(move(item, device) for item in value)
    return value  # lists of str/bytes and plain values stay on the host


class DeviceTransfer:
    """Copies batches to the training device, on a side CUDA stream when there is one.

    Args:
        copy_stream: On CUDA, issue the copies on a dedicated stream so they overlap the
            previous step's kernels. ``False`` copies on the current stream (still non-blocking).
        host_columns: Columns of a batch that stay on the host (see `host_columns`).
    """

    def __init__(self, copy_stream: bool = True, host_columns: tuple[str, ...] = ()) -> None:
        self.copy_stream = bool(copy_stream)
        self.host_columns = tuple(host_columns)
        self._stream: Any = None
        self._device: torch.device | None = None

    def start(self, device: torch.device) -> None:
        """Create the side stream for ``device`` (CUDA only; a no-op elsewhere)."""
        device = torch.device(device)
        if self._stream is not None and self._device == device:
            return
        self._device = device
        self._stream = torch.cuda.Stream(device) if self.copy_stream and device.type == "cuda" else None

    def stop(self) -> None:
        """Wait for copies in flight and drop the side stream."""
        if self._stream is not None:
            self._stream.synchronize()
        self._stream = None
        self._device = None

    def __call__(self, batch: Any, device: torch.device) -> Any:
        device = torch.device(device)
        if device.type != "cuda" or not self.copy_stream:
            return self._move(batch, device)
        if self._device != device or self._stream is None:
            self.start(device)
        current = torch.cuda.current_stream(device)
        with torch.cuda.stream(self._stream):
            moved = self._move(batch, device)
        current.wait_stream(self._stream)
        record_stream(moved, current)
        return moved

    def _move(self, batch: Any, device: torch.device) -> Any:
        if not self.host_columns or not isinstance(batch, dict):
            return move(batch, device)
        return {key: value if key in self.host_columns else move(value, device) for key, value in batch.items()}

    def __getstate__(self) -> dict[str, Any]:
        return {"copy_stream": self.copy_stream, "host_columns": self.host_columns, "_stream": None, "_device": None}


def record_stream(value: Any, stream: Any) -> None:
    """Mark the device tensors of ``value`` as used by ``stream`` (allocator safety across streams)."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, Ragged):
        record_stream(value.values, stream)
        record_stream(value.offsets, stream)
    elif isinstance(value, dict):
        for item in value.values():
            record_stream(item, stream)
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], (torch.Tensor, Ragged, dict)):
        for item in value:
            record_stream(item, stream)
