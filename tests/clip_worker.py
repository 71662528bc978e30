"""A fit of video clips recording each trained clip (the user's path: ``Trainer.fit(ckpt_path=...)``).

Guarantees: `fit_clips` runs one real ``Trainer.fit`` of a `LanceDataModule` with
``clips=VideoClips(...)`` (or ``AudioClips``) and returns this rank's records ``[epoch, clip_row,
label, first frame time, last frame time, pixel sum]`` (audio: start, start, sample sum), one per
trained clip, and the number of batches each epoch.
Run as a script (``python tests/clip_worker.py SPEC.json``) it does the same under DDP (gloo, CPU)
and writes ``<out>.rank<r>.json``; a list of specs is fitted in turn in the same ranks (one
launch; each spec names its own ``out``), as tests/harness.py runs its jobs.
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


class ClipRecorder(pl.LightningModule):
    """Records every trained clip and trains a one-weight model on its pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.records: list[list[Any]] = []
        self.batches: dict[int, int] = {}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        epoch = self.current_epoch
        self.batches[epoch] = self.batches.get(epoch, 0) + 1
        if "audio" in batch:  # windows: float32 [B, channels, samples], starts [B, 1]
            video, times = batch["audio"], batch["audio_start"]
            assert video.dtype == torch.float32 and video.dim() == 3
            sums = [round(v, 3) for v in video.reshape(len(video), -1).double().sum(1).tolist()]
        else:
            video, times = batch["video"], batch["video_timestamps"]
            assert video.dtype == torch.uint8 and video.dim() == 5
            sums = video.reshape(len(video), -1).sum(1).tolist()
        for row, label, first, last, total in zip(
            batch["_clip_row"].tolist(), batch["label"].tolist(), times[:, 0].tolist(), times[:, -1].tolist(), sums
        ):
            self.records.append([epoch, row, label, round(first, 6), round(last, 6), total])
        x = video.float().reshape(len(video), -1).mean(dim=1, keepdim=True) / 255
        return (self.layer(x) - x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_clips(spec: dict[str, Any]) -> tuple[int, list[list[Any]], dict[int, int]]:
    """(rank, records, batches per epoch) of the fit ``spec`` names: uri, root, name, shuffle,
    batch_size, devices, num_workers, max_epochs, max_steps, ckpt_every, ckpt_path, media ("video" or
    "audio"), clips (kwargs of VideoClips or AudioClips), bad_rows ("raise" | "replace"), filter."""
    from lance_lightning import AudioClips, LanceDataModule, LanceSource, ReplaceBadRow, VideoClips
    from tests.harness import fit
    from tests.resume_worker import make_shuffle

    root = Path(spec["root"])
    media = spec.get("media", "video")
    dm = LanceDataModule(
        train=LanceSource(spec["uri"], columns=["id", media, "label"], filter=spec.get("filter")),
        batch_size=spec["batch_size"],
        shuffle=make_shuffle(spec["shuffle"]),
        num_workers=spec["num_workers"],
        reader_threads=2,
        clips=AudioClips(**spec["clips"]) if media == "audio" else VideoClips(**spec["clips"]),
        bad_rows=ReplaceBadRow(seed=3) if spec.get("bad_rows") == "replace" else None,
    )
    devices = spec.get("devices", 1)
    model = fit(
        root,
        dm,
        name=spec["name"],
        ckpt_path=spec.get("ckpt_path"),
        ckpt_every=spec.get("ckpt_every", 0),
        max_steps=spec.get("max_steps", -1),
        max_epochs=spec["max_epochs"],
        model=ClipRecorder(),
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
    )
    return model.global_rank, model.records, model.batches


if __name__ == "__main__":
    given = json.loads(Path(sys.argv[1]).read_text())
    for spec in given if isinstance(given, list) else [given]:
        rank, records, batches = fit_clips(spec)
        Path(f"{spec['out']}.rank{rank}.json").write_text(json.dumps({"records": records, "batches": batches}))
