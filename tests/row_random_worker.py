"""A fit whose transform draws per-row randomness, recording each trained row's draw and identity.

Guarantees: `fit_draws` runs one real ``Trainer.fit`` (``ckpt_path=`` resumes) of a
`LanceDataModule` with ``row_identity=True`` and the `Draws` transform, and returns this rank's
records ``[epoch, position, id, rowaddr, draw, flipped]``, one per trained row. Run as a script
(``python tests/row_random_worker.py SPEC.json``) it does the same under DDP (gloo, CPU; Lightning
starts the other ranks from this file) and writes ``<out>.rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.row_draws import Draws  # noqa: E402


class DrawRecorder(pl.LightningModule):
    """Records ``[epoch, position, id, rowaddr, draw, flipped]`` of every trained row."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.records: list[list[Any]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        flipped = (batch["vec"][:, 0] != batch["id"].float() * 8).tolist()
        for row in zip(
            batch["_epoch"].tolist(),
            batch["_position"].tolist(),
            batch["id"].tolist(),
            batch["_rowaddr"].tolist(),
            batch["draw"].tolist(),
            flipped,
        ):
            self.records.append(list(row))
        x = batch["x"].float().reshape(-1, 1)
        return (self.layer(x) - x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_draws(spec: dict[str, Any]) -> tuple[int, list[list[Any]]]:
    """(rank, records) of the fit ``spec`` names: uri, root, name, shuffle, batch_size, devices,
    num_workers, max_epochs, max_steps, ckpt_every, ckpt_path, filter."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lance_lightning import DataCursorCheckpoint, LanceDataModule, LanceSource
    from tests.resume_worker import make_shuffle

    root = Path(spec["root"])
    dm = LanceDataModule(
        train=LanceSource(spec["uri"], columns=["id", "x", "vec"], filter=spec.get("filter")),
        batch_size=spec["batch_size"],
        shuffle=make_shuffle(spec["shuffle"]),
        num_workers=spec["num_workers"],
        reader_threads=2,
        transform=Draws(),
        row_identity=True,
    )
    callbacks: list[Any] = [DataCursorCheckpoint()]
    if spec.get("ckpt_every"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=root / f"ckpt_{spec['name']}",
                filename="{step}",
                every_n_train_steps=spec["ckpt_every"],
                save_top_k=-1,
            )
        )
    devices = spec.get("devices", 1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=spec["max_epochs"],
        max_steps=spec.get("max_steps", -1),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_checkpointing=bool(spec.get("ckpt_every")),
        default_root_dir=str(root / f"root_{spec['name']}"),
        callbacks=callbacks,
    )
    model = DrawRecorder()
    trainer.fit(model, datamodule=dm, ckpt_path=spec.get("ckpt_path"))
    return trainer.global_rank, model.records


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, records = fit_draws(spec)
    Path(f"{spec['out']}.rank{rank}.json").write_text(json.dumps(records))
