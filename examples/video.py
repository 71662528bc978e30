"""Video example: a small synthetic video dataset stored as Lance blobs, and a tiny video classifier.

Guarantees: :func:`prepare` writes the same rows on every machine, the same bytes for every video
given the same PyAV wheel (no network, no system package: the clips are drawn by
``lance_lightning.media.synthetic.moving_shapes`` from fixed seeds and encoded by the FFmpeg that
PyAV bundles), and leaves an existing dataset alone unless asked to overwrite it; it takes a few
seconds. :class:`VideoClassifier` trains on the batches that
``LanceDataModule(clips=VideoClips(column="video", frames=8, ...))`` produces from it.

Columns written (4 classes x 24 videos by default, 64x64 at 24 fps, 48 to 96 frames each):

* ``id`` (int64): the row's index, 0..n-1.
* ``video`` (``large_binary`` with Lance's blob encoding): an H.264 MP4, a keyframe every 12 frames.
* ``label`` (int64): the class, 0..3 (``row % 4``): the moving square's colour in every frame and
  its direction (right, left, down, up) across frames.
* ``split`` (string): ``"val"`` for every 5th row, ``"train"`` otherwise (balanced labels).

Usage::

    python examples/video.py [OUT]      # default OUT: data/clips.lance
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["VideoClassifier", "prepare"]

DEFAULT_OUT = "data/clips.lance"
_COLUMNS = ("id", "video", "label", "split")
CLASSES = 4
VIDEOS_PER_CLASS = 24
SIZE = 64
FPS = 24
GOP = 12
MIN_FRAMES, MAX_FRAMES = 48, 96
_VAL_EVERY = 5
_SEED = 0


def _existing_dataset(out: str) -> Any | None:
    """The Lance dataset at ``out``, or None if there is none."""
    import lance

    if "://" not in out and not os.path.exists(out):
        return None
    try:
        return lance.dataset(out)
    except Exception:  # noqa: BLE001 - anything that is not a readable dataset
        if "://" not in out:
            raise FileExistsError(
                f"{out!r} exists but is not a Lance dataset; remove it, choose another path, or pass overwrite=True"
            ) from None
        return None


def prepare(out: str = DEFAULT_OUT, *, overwrite: bool = False, videos_per_class: int = VIDEOS_PER_CLASS) -> str:
    """Build the synthetic video dataset at ``out`` and return ``out``.

    Idempotent: if ``out`` already holds a Lance dataset with this example's columns and
    ``overwrite`` is False, nothing is written.

    Raises:
        FileExistsError: ``out`` exists but is not a video Lance dataset and ``overwrite`` is False.
    """
    out = os.fspath(out)
    if not overwrite:
        existing = _existing_dataset(out)
        if existing is not None:
            names = set(existing.schema.names)
            if not set(_COLUMNS) <= names:
                raise FileExistsError(
                    f"{out!r} is a Lance dataset with columns {sorted(names)}, not the video "
                    f"columns {list(_COLUMNS)}; choose another path or pass overwrite=True"
                )
            return out

    import lance
    import numpy as np
    import pyarrow as pa

    from lance_lightning.media.synthetic import encode_video, moving_shapes
    from lance_lightning.write.folders import BLOB_METADATA

    n = CLASSES * videos_per_class
    lengths = np.random.default_rng(_SEED).integers(MIN_FRAMES, MAX_FRAMES + 1, size=n)
    videos: list[bytes] = []
    for row in range(n):
        frames = moving_shapes(row % CLASSES, int(lengths[row]), SIZE, SIZE, seed=_SEED + row)
        videos.append(encode_video(frames, fps=FPS, gop=GOP))

    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("video", pa.large_binary(), metadata=BLOB_METADATA),  # stored out of line, read by range
            pa.field("label", pa.int64()),
            pa.field("split", pa.string()),
        ]
    )
    table = pa.table(
        {
            "id": pa.array(range(n), type=pa.int64()),
            "video": pa.array(videos, type=pa.large_binary()),
            "label": pa.array([row % CLASSES for row in range(n)], type=pa.int64()),
            "split": pa.array(["val" if row % _VAL_EVERY == 0 else "train" for row in range(n)], type=pa.string()),
        },
        schema=schema,
    )
    lance.write_dataset(table, out, mode="overwrite" if overwrite else "create")
    return out


class VideoClassifier(L.LightningModule):
    """A tiny early-fusion CNN for short clips (about 47 K parameters).

    Expects batches with ``"video"``: uint8 (B, T, 3, H, W) with ``T == frames`` (as ``VideoClips``
    produces; scaled to [0, 1] here) and ``"label"``: int64 (B,). Each clip's mean frame is
    subtracted (the static background goes, what moves stays), then the T frames are stacked as
    ``3 * T`` channels of 2D convolutions, which see motion across frames; 2D convolutions are also
    much cheaper than 3D ones on a CPU. Logs ``train_loss``, ``val_loss`` and ``val_acc``.

    Args:
        frames: Frames per clip (``VideoClips.frames``).
        classes: Number of classes.
        lr: Adam learning rate.
        width: Channels of the first convolution (doubled in the last).
    """

    def __init__(self, frames: int = 8, classes: int = CLASSES, lr: float = 0.003, width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3 * frames, width, kernel_size=5, stride=2, padding=2),
            nn.GroupNorm(4, width),
            nn.ReLU(),
            nn.Conv2d(width, width, kernel_size=3, padding=1),
            nn.GroupNorm(4, width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.GroupNorm(4, 2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, classes),
        )

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) for clips uint8 (B, T, 3, H, W)."""
        x = video.float().div(255.0)
        x = x - x.mean(dim=1, keepdim=True)  # minus each clip's mean frame
        return self.net(x.flatten(1, 2))  # (B, T * 3, H, W)

    def _loss_acc(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
        logits, y = self(batch["video"]), batch["label"]
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        return loss, acc, int(y.shape[0])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, _, n = self._loss_acc(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=n)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, acc, n = self._loss_acc(batch)
        self.log("val_loss", loss, on_epoch=True, prog_bar=True, batch_size=n)
        self.log("val_acc", acc, on_epoch=True, prog_bar=True, batch_size=n)

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch["video"]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(f"usage: python examples/video.py [OUT]   (default OUT: {DEFAULT_OUT})")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    out = prepare(argv[0] if argv else DEFAULT_OUT)
    import lance

    ds = lance.dataset(out)
    print(out)
    print(f"rows: {ds.count_rows()}")
    for split in ("train", "val"):
        print(f"{split}: {ds.count_rows(filter=f'split = {split!r}')}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
