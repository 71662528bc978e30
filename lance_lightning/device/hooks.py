"""The data module's device stage: the Lightning hooks that copy batches to the accelerator and run
the device transform, in the training loop's hooks or ahead of the step.

Guarantees:
- On CUDA (unless ``device_ahead`` is 0 or the model overrides ``transfer_batch_to_device``), each
  loader prepares its batches ahead (`lance_lightning.device.ahead.DeviceAhead`): the copy and the
  device transform (under the bad-row policy) run in a background thread on their own stream, and
  the hooks below pass those batches through untouched. Elsewhere the hooks do the same work
  between steps: ``transfer_batch_to_device`` copies without blocking (str/bytes lists and the
  device transform's host columns stay on the host), ``on_after_batch_transfer`` runs the device
  transform.
- A model's own ``transfer_batch_to_device`` replaces ours; its ``on_after_batch_transfer`` runs
  after ours.
- `DeviceStage` is a mixin of `LanceDataModule` and reads its settings (``trainer``,
  ``device_ahead``, ``device_transfer``, ``device_transform``, ``bad_rows``, ``plans``,
  ``transform``, ``fill_nulls``, ``_loaders``) and keeps each split's device bad-row guard in
  ``_device_guards`` (built once per loader and device, not per batch).
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.model_helpers import is_overridden

from lance_lightning.device.ahead import DeviceAhead, DevicePreparation
from lance_lightning.device.guard import DeviceRowGuard
from lance_lightning.metrics.clock import StageClock
from lance_lightning.vocabulary import Split


class DeviceStage:
    """Device hooks and the ahead preparation of `LanceDataModule` (see the module docstring)."""

    def _device_ahead(self, split: Split, clock: StageClock) -> DeviceAhead | None:
        """Batches prepared on the GPU ahead of the step: on CUDA, unless ``device_ahead`` is 0 or
        the model moves batches itself (its ``transfer_batch_to_device`` must see host batches)."""
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        model = self.trainer.lightning_module if self.trainer is not None else None
        if not self.device_ahead or device is None or device.type != "cuda" or _moves_batches(model):
            return None
        guard = self._row_guard(split, device, clock) if self.device_transform is not None else None
        prepare = DevicePreparation(self.device_transfer, device, self.device_transform, guard)
        return DeviceAhead(prepare, device, self.device_ahead)

    def _row_guard(self, split: Split, device: torch.device, clock: StageClock) -> DeviceRowGuard:
        return DeviceRowGuard(
            self.bad_rows,
            self.plans[split],
            self.transform,
            self.fill_nulls,
            self.device_transform,
            functools.partial(self.device_transfer, device=device),
            clock,
        )

    def _prepared_ahead(self) -> bool:
        """Whether the running split's batches arrive already prepared on the device."""
        split = _RUNNING_SPLITS.get(self.trainer.state.stage) if self.trainer is not None else None
        _, loader = self._loaders.get(split, (None, None))
        return loader is not None and loader.device_ahead is not None

    # -- batch transfer (main process, training loop thread) ----------------------------------
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Non-blocking copies of the batch's tensors (side CUDA stream); str/bytes lists stay on host."""
        model = self.trainer.lightning_module if self.trainer is not None else None
        if _moves_batches(model):
            return model.transfer_batch_to_device(batch, device, dataloader_idx)
        if self._prepared_ahead():
            return batch
        if not isinstance(batch, dict):  # a transform changed the batch type: Lightning's generic transfer
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        return self.device_transfer(batch, device)

    def _device_transform(self, batch: Any) -> Any:
        """The device transform, under the bad-row policy when the loader kept the batch's row positions."""
        split = _RUNNING_SPLITS.get(self.trainer.state.stage) if self.trainer is not None else None
        _, loader = self._loaders.get(split, (None, None))
        if loader is None or loader.positions is None:
            return self.device_transform(batch)
        return self._guard_of(split, loader)(batch, loader.positions)

    def _guard_of(self, split: Split, loader: Any) -> DeviceRowGuard:
        """The bad-row guard of ``loader`` on the trainer's device, built once per loader and device."""
        device = self.trainer.strategy.root_device
        built = self._device_guards.get(split)
        if built is None or built[0] is not loader or built[1] != device:
            built = (loader, device, self._row_guard(split, device, loader.dataset.clock))
            self._device_guards[split] = built
        return built[2]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Runs ``device_transform`` on the device batch, then the model's hook if it has one."""
        if self.device_transform is not None and not self._prepared_ahead():
            batch = self._device_transform(batch)
        model = self.trainer.lightning_module if self.trainer is not None else None
        if model is not None and is_overridden("on_after_batch_transfer", model, pl.LightningModule):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch


_RUNNING_SPLITS = {
    RunningStage.TRAINING: "train",
    RunningStage.SANITY_CHECKING: "val",
    RunningStage.VALIDATING: "val",
    RunningStage.TESTING: "test",
    RunningStage.PREDICTING: "predict",
}


def _moves_batches(model: pl.LightningModule | None) -> bool:
    """Whether ``model`` overrides ``transfer_batch_to_device`` (it then moves batches itself)."""
    return model is not None and is_overridden("transfer_batch_to_device", model, pl.LightningModule)
