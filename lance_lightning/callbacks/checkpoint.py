"""`DataCursorCheckpoint`: saves the train data cursor in every checkpoint and restores it.

Guarantees:
- The cursor counts only batches whose training step ended (``on_train_batch_end``), so batches
  fetched ahead by workers, ``prefetch_factor`` or Lightning itself never count.
- The saved state is the data module's cursor (plain types, see `lance_lightning.plan.cursor`); on
  restore it is validated strictly against the current plan, before training starts.
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
    """Keeps the `LanceDataModule` train cursor in Lightning checkpoints, exactly."""

    def __init__(self) -> None:
        self._datamodule: Any = None
        self._restored: dict[str, Any] | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lance_lightning.datamodule import LanceDataModule

        datamodule = trainer.datamodule
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
        if cursor is not None and cursor.consumed is None:
            cursor.consumed = 0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._datamodule.train_cursor.on_step_end()

    @override
    def state_dict(self) -> dict[str, Any]:
        cursor = self._datamodule.train_cursor if self._datamodule is not None else None
        return cursor.state() if cursor is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._datamodule is not None:
            self._datamodule.restore_cursor(state_dict)
