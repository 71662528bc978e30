"""``Trainer.predict`` in real 2-process CPU DDP (gloo), and a writer that records what each rank predicted.

Run by tests/scenarios/test_user_paths.py as ``python tests/predict_worker.py OUT_DIR URI BATCH_SIZE``;
Lightning's ``ddp`` strategy re-runs the same command for rank 1. `IdsWriter` is also named by
the CLI predict test's YAML (``trainer.callbacks``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from lightning.pytorch.callbacks import BasePredictionWriter  # noqa: E402


class IdsWriter(BasePredictionWriter):
    """Writes ``<out_dir>/predict.rank<r>.json``: the ids predicted per batch, in order."""

    def __init__(self, out_dir: str) -> None:
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self.batches: list[list[int]] = []

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.batches.append([int(i) for i in prediction])

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "batches": self.batches}
        (self.out_dir / f"predict.rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main(out_dir: str, uri: str, batch_size: int) -> None:
    import lightning.pytorch as pl

    from lance_lightning import LanceDataModule, LanceSource
    from tests.helpers import RecordingModel

    dm = LanceDataModule(predict=LanceSource(uri, columns=["id", "x"]), batch_size=batch_size)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out_dir,
        callbacks=[IdsWriter(out_dir)],
    )
    trainer.predict(RecordingModel(), datamodule=dm, return_predictions=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
