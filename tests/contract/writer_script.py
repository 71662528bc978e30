"""One ``Trainer.predict`` with `LancePredictionWriter`, as a user script, for `tests.contract.writer_draws`.

Run as ``python tests/contract/writer_script.py SPEC.json`` (Lightning's ``ddp`` strategy runs the
same command for rank 1), or in-process through `predict` (the uninterrupted reference run). The
spec names the dataset, ``run_dir``, ranks, workers, batch size, ``flush_rows``, filter, the per-row
random transform, the bad-row policy, the model's ``scale``, a SIGKILL (``kill_rank`` after
``kill_batch`` batches: the rank writes ``<out>.killed`` first, so the runner can end the others)
and a ``second`` predict of the same trainer after the first returns. Each rank that returns
writes ``<out>.rank<r>.json`` (whole or not at all: renamed into place): the error it raised (type and
message), if any.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from tests.contract.writer_draws import DIM, Inputs  # noqa: E402


class ScaledModel(pl.LightningModule):
    """``emb = id * scale + k`` (k < DIM), ``score = id * scale / 2``, ``extra``: the transform's
    per-row value (``draw``, the flipped ``vec`` or the augmented ``image``) or ``x``."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.layer = torch.nn.Linear(1, 1)  # the same weights in every process; another scale, other weights
        torch.nn.init.constant_(self.layer.weight, scale)
        torch.nn.init.zeros_(self.layer.bias)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        ids = batch["id"].double()
        emb = ids[:, None].float() * self.scale + torch.arange(DIM, dtype=torch.float32)
        if "draw" in batch:
            extra = batch["draw"].double().reshape(len(ids), -1)
        elif "image" in batch:
            extra = batch["image"].double().reshape(len(ids), -1)
        else:
            extra = batch["vec"].double().reshape(len(ids), -1)
        return {"emb": emb, "score": ids * self.scale / 2, "extra": extra}


class KillAt(pl.Callback):
    """SIGKILL rank ``rank`` after ``batches`` predict batches (writing ``marker`` first)."""

    def __init__(self, rank: int, batches: int, marker: str) -> None:
        self.rank, self.batches, self.marker, self.seen = rank, batches, marker, 0

    def on_predict_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if trainer.global_rank == self.rank and self.seen >= self.batches:
            Path(self.marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)


def predict(spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Run the spec's predict; (rank, {"error": ..., "second_error": ...})."""
    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.produce.badrows import RaiseOnBadRow, ReplaceBadRow
    from lance_lightning.write.predictions import LancePredictionWriter
    from tests.resume_worker import make_shuffle

    devices = spec["devices"]
    writer = LancePredictionWriter(
        columns=["emb", "score", "extra"], run_dir=spec["run_dir"], flush_rows=spec["flush_rows"]
    )
    callbacks: list[Any] = [writer]
    if spec.get("kill_rank") is not None:
        callbacks.append(KillAt(spec["kill_rank"], spec["kill_batch"], f"{spec['out']}.killed"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        default_root_dir=str(Path(spec["out"]).parent),
    )
    policy = ReplaceBadRow(seed=3) if spec["bad"] == "replace" else RaiseOnBadRow()
    dm = LanceDataModule(
        predict=LanceSource(spec["uri"], columns=["id", "x", "vec"], filter=spec["filter"]),
        batch_size=spec["batch_size"],
        num_workers=spec["num_workers"],
        transform=Inputs(spec["random"], spec["seed"], spec["bad_mod"] if spec["bad"] else 0),
        row_identity=True if spec["random"] != "none" else None,
        bad_rows=policy,
        shuffle=make_shuffle(spec.get("shuffle", "none")),
    )
    model = ScaledModel(spec["scale"])
    record: dict[str, Any] = {}
    try:
        trainer.predict(model, datamodule=dm, return_predictions=False)
    except Exception as error:  # noqa: BLE001 - recorded: the oracle judges it
        import traceback

        traceback.print_exc()
        record["error"] = [type(error).__name__, str(error)[-1500:]]
        return trainer.global_rank, record
    if spec.get("second"):
        try:
            trainer.predict(model, datamodule=dm, return_predictions=False)
        except Exception as error:  # noqa: BLE001
            record["second_error"] = [type(error).__name__, str(error)[-1500:]]
    return trainer.global_rank, record


if __name__ == "__main__":
    from tests.contract import writer_script  # the model's class as this module names it, not __main__:

    spec = json.loads(Path(sys.argv[1]).read_text())  # a rerun in a test's process is the same model
    rank, record = writer_script.predict(spec)
    # Whole or not at all: the runner SIGKILLs the session as soon as rank 0 ends (at once when rank 0
    # is the one killed), which can fall inside rank 1's write (an empty rank1.json failed seed 8's
    # JSON read). A rank killed before its rename leaves no record, as one killed before it got here.
    done = Path(f"{spec['out']}.rank{rank}.json")
    done.with_suffix(".json.partial").write_text(json.dumps(record))
    os.replace(done.with_suffix(".json.partial"), done)
