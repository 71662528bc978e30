"""`DataCursorCheckpoint`: the train data cursor counts exactly the training steps that finished.

Guarantees:
- With the callback, the cursor counts only batches whose training step ended
  (``on_train_batch_end``), so batches fetched ahead by workers, ``prefetch_factor`` or Lightning
  itself never count, whatever fetches ahead (`lance_lightning.cursor.loop.LoopCounters`).
- It saves and restores nothing itself (its public name is kept from when it did: configs name
  ``lance_lightning.DataCursorCheckpoint``): the data module's checkpoint state
  (``ckpt["LanceDataModule"]["train_cursor"]``, `lance_lightning.cursor`) is the one saved
  copy of the cursor, restored once and strictly. A copy that checkpoints of earlier versions keep
  under ``ckpt["callbacks"]["DataCursorCheckpoint"]`` is ignored (it equals the data module's).
- Resume does not depend on ``loader.load_state_dict`` being called: Lightning skips it when
  ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` (#20550).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lance_lightning.errors import ConfigError


class DataCursorCheckpoint(Callback):
    """Makes the `LanceDataModule` train cursor count the training steps that finished, so that the
    cursor Lightning's checkpoints hold is exact."""

    def __init__(self) -> None:
        self._datamodule: Any = None
        self._restored: dict[str, Any] | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lance_lightning.datamodule import LanceDataModule

        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # Lightning sets it outside the class body
        if not isinstance(datamodule, LanceDataModule):
            raise ConfigError(
                "callbacks",
                "DataCursorCheckpoint",
                f"needs a LanceDataModule, the trainer has {type(datamodule).__name__}",
                "pass `datamodule=LanceDataModule(...)` to the trainer",
            )
        self._datamodule = datamodule

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        cursor = self._datamodule.train_cursor
        if cursor is not None:
            cursor.loop.count_finished_steps()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._datamodule.train_cursor.loop.on_step_end()
