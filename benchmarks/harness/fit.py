"""The studies' training runs: one quiet CPU `Trainer` and the tiny models whose steps cost next to
nothing, so that a fit measures the data path (resume, memory, metrics, materialize); and the train
loader the read studies time.

Guarantees:
- `train_loader` is the package's train loader as a user builds it (``LanceDataModule``,
  ``setup("fit")``, ``train_dataloader()``), with ``num_workers=0`` unless asked otherwise, built
  outside any timing.
- `trainer` is a real ``lightning.pytorch.Trainer`` on CPU without logger, progress bar, model
  summary, checkpointing, validation or sanity steps unless a keyword asks for them.
- `VecModel` trains on the vector table (``vec``, ``label``), `ImageModel` on decoded images
  (``image``, ``label``); both record when and which batch came first (``first_batch_at``,
  ``first_batch_idx``, ``first_ids``), the resume study's check.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lance_lightning import LanceDataModule, LanceSource, NoShuffle


def train_loader(
    uri: str,
    batch_size: int = 256,
    shuffle: Any = None,
    filter: str | None = None,
    columns: Any = ("id", "label", "vec"),
    **settings: Any,
) -> tuple[LanceDataModule, Any]:
    """The data module (set up for ``fit``) and its train loader, with data-module ``settings``."""
    dm = LanceDataModule(
        train=LanceSource(uri, columns=list(columns), filter=filter),
        batch_size=batch_size,
        shuffle=shuffle or NoShuffle(),
        **{"num_workers": 0, **settings},
    )
    dm.setup("fit")
    return dm, dm.train_dataloader()


def trainer(root: Path, callbacks: list | None = None, **overrides: Any) -> pl.Trainer:
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "default_root_dir": str(root),
    }
    return pl.Trainer(callbacks=callbacks or [], **(kwargs | overrides))


class _Recording(pl.LightningModule):
    def __init__(self, record_steps: set[int] | None = None) -> None:
        super().__init__()
        self.fit_called_at: float | None = None
        self.first_batch_at: float | None = None
        self.first_batch_idx: int | None = None
        self.first_ids: list[int] | None = None
        self.record_steps = record_steps or set()
        self.recorded: dict[int, list[int]] = {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.first_batch_at is None:
            self.first_batch_at = time.perf_counter()
            self.first_batch_idx = batch_idx
            self.first_ids = batch["id"][:8].tolist() if "id" in batch else None
        if self.trainer.global_step in self.record_steps:
            self.recorded[self.trainer.global_step] = batch["id"][:8].tolist()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class VecModel(_Recording):
    """One linear layer on the first ``width`` vector components (1: resume; 128: materialize)."""

    def __init__(self, record_steps: set[int] | None = None, width: int = 1) -> None:
        super().__init__(record_steps)
        self.width = width
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch["vec"][:, : self.width].float()
        return (self.layer(x) - x[:, :1]).pow(2).mean()


class ImageModel(_Recording):
    """Average-pool to 8x8, then one linear layer: the step is cheap, the data path dominates."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(8)
        self.head = torch.nn.Linear(3 * 8 * 8, 10)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self.head(self.pool(batch["image"]).flatten(1))
        return torch.nn.functional.cross_entropy(logits, batch["label"].long() % 10)
