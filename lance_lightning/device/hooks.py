"""The data module's device stage: how each loader's batches reach the accelerator, and the work its
Lightning hooks do.

Guarantees:
- `DeviceStage.path` decides once per loader, when the data module builds it, how its batches
  reach the device (`lance_lightning.device.ahead.DevicePath`): on CUDA (unless ``depth`` is 0 or
  the model overrides ``transfer_batch_to_device``) they are prepared ahead, the copy and the
  device transform (under the bad-row policy) running in a background thread on their own stream,
  and the hooks pass them through untouched. Elsewhere the hooks do the same work between steps:
  `DeviceStage.to_device` copies without blocking (str/bytes lists and the device transform's host
  columns stay on the host), `DeviceStage.after_transfer` runs the device transform under the
  bad-row guard with the row positions the batch was delivered with (`InHand`).
- A model's own ``transfer_batch_to_device`` replaces ours; its ``on_after_batch_transfer`` runs
  after ours.
- Everything the stage uses is given to its constructor or to each call: it holds no data module,
  trainer or loader, so a data module is freed without the cyclic GC.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from lance_lightning.device.ahead import DevicePath, InHand
from lance_lightning.device.guard import DeviceRowGuard
from lance_lightning.device.transfer import DeviceTransfer
from lance_lightning.plan.contract import Plan
from lance_lightning.produce.badrows import BadRowPolicy
from lance_lightning.vocabulary import BatchTransform


class DeviceStage:
    """The device side of `LanceDataModule` (see the module docstring).

    Args:
        transfer: The data module's copy to the device.
        device_transform: Runs on each device batch (``None``: none).
        depth: ``device_ahead``: batches prepared ahead on CUDA (0: in the hooks).
        bad_rows, transform, fill_nulls: The data module's bad-row policy, host transform and null
            fills, which the device bad-row guard applies to replacement rows as the host does.
    """

    def __init__(
        self,
        transfer: DeviceTransfer,
        device_transform: BatchTransform | None,
        depth: int,
        bad_rows: BadRowPolicy,
        transform: BatchTransform | None,
        fill_nulls: Mapping[str, Any],
    ) -> None:
        self.transfer = transfer
        self.device_transform = device_transform
        self.depth = depth
        self.bad_rows = bad_rows
        self.transform = transform
        self.fill_nulls = fill_nulls
        #: The batch the training loop holds, as the path of its loader delivered it.
        self.in_hand = InHand()

    def path(self, plan: Plan, device: torch.device | None, model: pl.LightningModule | None) -> DevicePath:
        """How the batches of a loader of ``plan`` reach ``device`` (the trainer's; ``None``
        without one): ahead on CUDA unless ``depth`` is 0 or ``model`` moves batches itself (its
        ``transfer_batch_to_device`` must see host batches), else in the hooks."""
        ahead = bool(self.depth) and device is not None and device.type == "cuda" and not moves_batches(model)
        guard = None
        if self.device_transform is not None:  # its bad-row policy needs the rows' positions
            guard = functools.partial(
                DeviceRowGuard,
                self.bad_rows,
                plan,
                self.transform,
                self.fill_nulls,
                self.device_transform,
                _no_device if device is None else functools.partial(self.transfer, device=device),
            )
        return DevicePath(self.transfer, device, self.device_transform, self.depth if ahead else 0, guard, self.in_hand)

    # -- the hooks' work (main process, training loop thread) ---------------------------------
    def to_device(
        self,
        batch: Any,
        device: torch.device,
        dataloader_idx: int,
        model: pl.LightningModule | None,
        generic: Callable[[Any], Any],
    ) -> Any:
        """Non-blocking copies of the batch's tensors (side CUDA stream); str/bytes lists stay on host.
        A ``model`` that moves batches itself does; a batch prepared ahead passes; a batch that is
        not a dict (a transform changed its type) goes to ``generic``, Lightning's own transfer."""
        if moves_batches(model):
            return model.transfer_batch_to_device(batch, device, dataloader_idx)
        if self.in_hand.prepared:
            return batch
        if not isinstance(batch, dict):
            return generic(batch)
        return self.transfer(batch, device)

    def after_transfer(self, batch: Any, dataloader_idx: int, model: pl.LightningModule | None) -> Any:
        """The device transform on the device batch (a batch prepared ahead has had it), under the
        bad-row guard when the batch came with its rows' positions, then ``model``'s own hook."""
        hand = self.in_hand
        if self.device_transform is not None and not hand.prepared:
            if hand.guard is None or hand.positions is None:
                batch = self.device_transform(batch)
            else:
                batch = hand.guard(batch, hand.positions)
        if model is not None and is_overridden("on_after_batch_transfer", model, pl.LightningModule):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch


def moves_batches(model: pl.LightningModule | None) -> TypeGuard[pl.LightningModule]:
    """Whether ``model`` overrides ``transfer_batch_to_device`` (it then moves batches itself)."""
    return model is not None and is_overridden("transfer_batch_to_device", model, pl.LightningModule)


def _no_device(batch: Any) -> Any:
    # Without a trainer there is no device and no hook or ahead thread runs the guard.
    raise RuntimeError("the device transform's bad-row guard ran without a device (no trainer)")
