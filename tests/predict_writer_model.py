"""A model and data for the prediction writer's tests: outputs are a function of each row's ``id``,
so a test knows every row's expected value whatever the rank, batch or rerun.

Run as ``python tests/predict_writer_model.py URI RUN_DIR DEVICES [KILL_AFTER [SCALE]]`` by
tests/scenarios/test_prediction_writer.py (Lightning's ``ddp`` strategy re-runs the same command
for rank 1): each rank writes the ids it predicted to ``predicted.rank<r>.json`` beside
``RUN_DIR``; the columns are ``emb``, ``score``, ``name`` and ``draw`` (a seeded per-row draw of
the `AddDraw` transform, which a resumed run must draw as the uninterrupted one did). With
``KILL_AFTER`` set (not 0), rank zero SIGKILLs itself once that many batches are written; ``SCALE``
is `IdModel`'s (another scale: another model).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import lance  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

DIM = 4


def write_rows(uri: str, rows: int = 300, per_fragment: int = 50) -> None:
    """``rows`` rows (``id``, ``x``) in fragments of ``per_fragment``."""
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "x": np.arange(rows, dtype=np.float32)})
    lance.write_dataset(table, uri, max_rows_per_file=per_fragment)


def embedding_of(ids: np.ndarray) -> np.ndarray:
    """The vector the model predicts for each id."""
    return np.stack([ids * 1.0 + k for k in range(DIM)], axis=1).astype(np.float32)


class AddDraw:
    """A transform adding ``draw``: each row's first `RowRandom` uniform draw (seeded test-time
    randomness, keyed by the row's ``_position``)."""

    def __init__(self, seed: int = 7) -> None:
        from lance_lightning.transforms import RowRandom

        self.random = RowRandom(seed)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "draw": self.random.uniform(batch)}


class AugmentDraw:
    """A transform adding ``draw``: the first pixel of a 1x2x4 image made from ``id`` after a seeded
    `DeviceAugment` horizontal flip (seeded test-time augmentation, keyed by ``_position``)."""

    def __init__(self, seed: int = 7) -> None:
        from torchvision.transforms import v2

        from lance_lightning.transforms import DeviceAugment

        self.augment = DeviceAugment([v2.RandomHorizontalFlip()], column="image", seed=seed)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        image = (batch["id"].double()[:, None] * 8 + torch.arange(8, dtype=torch.float64)).reshape(-1, 1, 2, 4)
        out = self.augment({**batch, "image": image})
        return {**out, "draw": out["image"][:, 0, 0, 0]}


class RejectIds:
    """A transform that rejects (`RowError`) the rows whose ``id`` is in ``ids``."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = set(ids)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from lance_lightning.errors import RowError

        for index, value in enumerate(batch["id"].tolist()):
            if value in self.ids:
                raise RowError("id", index, f"id {value} is rejected by the test")
        return batch


class IdModel(pl.LightningModule):
    """Predicts ``{"emb": embedding_of(id), "score": id / 2, "name": "row<id>"}`` (or only ``emb``;
    ``draws``: also ``draw``, the batch's per-row draw; ``scale`` multiplies ``emb``, a model with
    other weights)."""

    def __init__(self, outputs: str = "dict", scale: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.outputs = outputs
        with torch.random.fork_rng():  # the same weights in every run: the writer compares them on a rerun
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(1, 1)
        #: The ids this process predicted, in order.
        self.predicted: list[int] = []

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        ids = batch["id"]
        self.predicted.extend(int(i) for i in ids)
        emb = torch.from_numpy(embedding_of(ids.cpu().numpy())) * float(self.hparams.scale)
        if self.outputs == "tensor":
            return emb
        if self.outputs == "empty":  # vectors of size 0: refused by the writer
            return torch.zeros(len(ids), 0)
        outputs = {"emb": emb, "score": ids.double() / 2, "name": [f"row{int(i)}" for i in ids]}
        if self.outputs == "draws":
            outputs["draw"] = batch["draw"].reshape(-1).double()
        return outputs


class KillAfter(pl.Callback):
    """SIGKILL this process (rank zero only) after ``batches`` batches were handed to the writer."""

    def __init__(self, batches: int) -> None:
        self.batches, self.seen = batches, 0

    def on_predict_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if trainer.global_rank == 0 and self.seen >= self.batches:
            os.kill(os.getpid(), signal.SIGKILL)


class TwinAtEnd(pl.Callback):
    """Before the writer commits (listed before it), runs ``lance-lightning predict --config
    CONFIG`` to its end: a twin run of the same command that commits first."""

    def __init__(self, config: str) -> None:
        self.config = config

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        import subprocess

        command = [str(Path(sys.executable).with_name("lance-lightning")), "predict", "--config", self.config]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        Path(self.config).with_suffix(".log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr[-3000:]


def main(uri: str, run_dir: str, devices: int, kill_after: int | None, scale: float = 1.0) -> None:
    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.write.predictions import LancePredictionWriter

    columns = ["emb", "score", "name", "draw"]
    writer = LancePredictionWriter(columns=columns, run_dir=run_dir, flush_rows=40)
    callbacks: list[Any] = [writer] + ([KillAfter(kill_after)] if kill_after else [])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"]), batch_size=16, transform=AddDraw())
    model = IdModel("draws", scale=scale)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    Path(run_dir).with_name(f"predicted.rank{trainer.global_rank}.json").write_text(json.dumps(model.predicted))


if __name__ == "__main__":
    kill = int(sys.argv[4]) if len(sys.argv) > 4 and int(sys.argv[4]) else None
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), kill, float(sys.argv[5]) if len(sys.argv) > 5 else 1.0)
