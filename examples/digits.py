"""Handwritten-digits example: a Lance dataset builder and a small classifier.

Guarantees: :func:`prepare` writes the same dataset on every machine (no
network, no randomness beyond a fixed seed) from the 1,797 8x8 digit images that
ship with scikit-learn, and leaves an existing dataset alone unless asked to
overwrite it. :class:`DigitsClassifier` trains on the batches that
``lance_lightning.transforms.DecodeImage(column="image", mode="gray")`` produces
from that dataset.

Columns written:

* ``id`` (int64): the sample's index in ``sklearn.datasets.load_digits()``, 0..n-1.
* ``image`` (binary): the 8x8 image, scaled from 0-16 to 0-255, as a 1-channel PNG.
* ``label`` (int64): the digit, 0-9.
* ``split`` (string): ``"val"`` for every 5th row of the (seeded) shuffled order,
  ``"train"`` otherwise, so about 80% train and 20% val with balanced labels.

Usage::

    python examples/digits.py [OUT]      # default OUT: data/digits.lance
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DigitsClassifier", "prepare"]

DEFAULT_OUT = "data/digits.lance"
_COLUMNS = ("id", "image", "label", "split")
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


def prepare(out: str = DEFAULT_OUT, *, overwrite: bool = False) -> str:
    """Build the digits Lance dataset at ``out`` and return ``out``.

    Idempotent: if ``out`` already holds a Lance dataset with this example's
    columns and ``overwrite`` is False, nothing is written.

    Raises:
        ImportError: scikit-learn is not installed (it is a dev dependency).
        FileExistsError: ``out`` exists but is not a digits Lance dataset and
            ``overwrite`` is False.
    """
    out = os.fspath(out)
    if not overwrite:
        existing = _existing_dataset(out)
        if existing is not None:
            names = set(existing.schema.names)
            if not set(_COLUMNS) <= names:
                raise FileExistsError(
                    f"{out!r} is a Lance dataset with columns {sorted(names)}, not the digits "
                    f"columns {list(_COLUMNS)}; choose another path or pass overwrite=True"
                )
            return out

    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError(
            "examples/digits.py needs scikit-learn (a dev dependency) for its bundled digits data; "
            "run `uv sync` (installs the dev group) or `pip install scikit-learn`"
        ) from e
    import lance
    import numpy as np
    import pyarrow as pa
    from torchcodec.encoders import PngEncoder

    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float64)  # (n, 8, 8), values 0..16
    labels = np.asarray(digits.target, dtype=np.int64)
    n = len(labels)

    scaled = np.clip(np.rint(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    order = np.random.default_rng(_SEED).permutation(n)

    ids: list[int] = []
    pngs: list[bytes] = []
    out_labels: list[int] = []
    splits: list[str] = []
    for pos, idx in enumerate(order):
        img = torch.from_numpy(np.ascontiguousarray(scaled[idx])).unsqueeze(0)  # (1, 8, 8) uint8
        ids.append(int(idx))
        pngs.append(PngEncoder(img).to_tensor().numpy().tobytes())
        out_labels.append(int(labels[idx]))
        splits.append("val" if pos % _VAL_EVERY == 0 else "train")

    table = pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "image": pa.array(pngs, type=pa.binary()),
            "label": pa.array(out_labels, type=pa.int64()),
            "split": pa.array(splits, type=pa.string()),
        }
    )
    lance.write_dataset(table, out, mode="overwrite" if overwrite else "create")
    return out


class DigitsClassifier(L.LightningModule):
    """A small CNN for 8x8 grayscale digits.

    Expects batches with ``"image"``: float tensor (N, 1, 8, 8) (as produced by
    ``DecodeImage(column="image", mode="gray")``) and ``"label"``: int64 (N,).

    Args:
        lr: Adam learning rate.
        hidden: width of the hidden fully connected layer.
    """

    def __init__(self, lr: float = 0.01, hidden: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, 10) for images (N, 1, 8, 8)."""
        return self.net(x)

    def _loss_acc(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = batch["image"], batch["label"]
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        return loss, acc, int(y.shape[0])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, _, n = self._loss_acc(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, acc, n = self._loss_acc(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=n)
        self.log("val/acc", acc, on_epoch=True, prog_bar=True, batch_size=n)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        _, acc, n = self._loss_acc(batch)
        self.log("test/acc", acc, on_epoch=True, batch_size=n)

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch["image"]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(f"usage: python examples/digits.py [OUT]   (default OUT: {DEFAULT_OUT})")
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
