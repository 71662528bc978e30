"""Embeddings example: a table of embeddings with metadata, a SQL filter on indexed columns, and an MLP.

Guarantees: :func:`prepare` writes the same dataset on every machine (no network; numpy with a
fixed seed) and leaves an existing dataset alone unless asked to overwrite it.
:class:`EmbeddingClassifier` trains on its ``embedding`` and ``label`` columns as
`lance_lightning.LanceDataModule` delivers them (no transform needed).

The data stands for what an embedding table usually looks like: vectors from some encoder, a
label, and metadata to select rows by. Each class is a cluster of ``DIM``-dimensional vectors;
rows whose ``quality`` is below ``NOISY_BELOW`` carry a random label (label noise, as from a weak
annotator), so training on ``quality >= 0.3`` is what a careful user does. The rows are stored in
random order, so shards of contiguous rows are already well mixed (`lance_lightning.ShardShuffle`
reads them at scan speed).

Columns written (BITMAP indexes on ``source`` and ``split``, a BTREE index on ``quality``: Lance
answers the filter's row count from the indexes without reading the data):

* ``id`` (int64): 0..n-1, the storage order.
* ``embedding`` (fixed_size_list<float32>[``DIM``]): the vector.
* ``label`` (int64): the class, 0..``CLASSES``-1 (random when ``quality < NOISY_BELOW``).
* ``source`` (string): where the row came from: ``web``, ``books``, ``code`` or ``news``.
* ``quality`` (float32): an annotation-quality score in [0, 1).
* ``split`` (string): ``"val"`` for every 5th row, ``"train"`` otherwise.

Usage::

    python examples/tabular.py [OUT] [--rows N]      # default OUT: data/embeddings.lance
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CLASSES", "DIM", "EmbeddingClassifier", "prepare"]

DEFAULT_OUT = "data/embeddings.lance"
DEFAULT_ROWS = 40_000
DIM = 32
CLASSES = 8
NOISY_BELOW = 0.3
SOURCES = ("web", "books", "code", "news")
_COLUMNS = ("id", "embedding", "label", "source", "quality", "split")
_VAL_EVERY = 5
_SEED = 0


def prepare(out: str = DEFAULT_OUT, *, rows: int = DEFAULT_ROWS, overwrite: bool = False) -> str:
    """Write the embeddings dataset (``rows`` rows) at ``out`` and return ``out``.

    Idempotent: if ``out`` already holds a Lance dataset with this example's columns and
    ``overwrite`` is False, nothing is written (whatever ``rows`` says).

    Raises:
        FileExistsError: ``out`` exists but is not this example's dataset and ``overwrite`` is False.
    """
    import lance
    import numpy as np
    import pyarrow as pa

    out = os.fspath(out)
    if not overwrite and os.path.exists(out):
        try:
            names = set(lance.dataset(out).schema.names)
        except Exception:  # noqa: BLE001 - anything that is not a readable dataset
            names = set()
        if not set(_COLUMNS) <= names:
            raise FileExistsError(
                f"{out!r} exists but is not an embeddings dataset (columns {list(_COLUMNS)}); "
                "remove it, choose another path, or pass overwrite=True"
            )
        return out
    if rows < _VAL_EVERY:
        raise ValueError(f"`rows` must be at least {_VAL_EVERY}, got {rows}")

    rng = np.random.default_rng(_SEED)
    centers = rng.normal(size=(CLASSES, DIM)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=rows)
    vectors = centers[labels] + rng.normal(scale=2.0, size=(rows, DIM)).astype(np.float32)
    quality = rng.random(rows).astype(np.float32)
    noisy = quality < NOISY_BELOW
    labels = np.where(noisy, rng.integers(0, CLASSES, size=rows), labels)
    sources = np.array(SOURCES)[rng.integers(0, len(SOURCES), size=rows)]
    splits = np.where(np.arange(rows) % _VAL_EVERY == 0, "val", "train")

    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
            "label": pa.array(labels.astype(np.int64)),
            "source": pa.array(sources.tolist(), pa.string()),
            "quality": pa.array(quality),
            "split": pa.array(splits.tolist(), pa.string()),
        }
    )
    dataset = lance.write_dataset(table, out, mode="overwrite" if overwrite else "create")
    dataset.create_scalar_index("source", "BITMAP")
    dataset.create_scalar_index("split", "BITMAP")
    dataset.create_scalar_index("quality", "BTREE")
    return out


class EmbeddingClassifier(L.LightningModule):
    """A two-layer MLP classifying embeddings.

    Expects batches with ``"embedding"``: float32 (N, ``dim``) and ``"label"``: int64 (N,).

    Args:
        dim: Embedding width.
        classes: Number of classes.
        hidden: Width of the hidden layer.
        lr: Adam learning rate.
    """

    def __init__(self, dim: int = DIM, classes: int = CLASSES, hidden: int = 64, lr: float = 0.003) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, classes) for embeddings (N, dim)."""
        return self.net(x)

    def _loss_acc(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
        logits = self(batch["embedding"])
        labels = batch["label"]
        return F.cross_entropy(logits, labels), (logits.argmax(dim=1) == labels).float().mean(), int(labels.shape[0])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, _, n = self._loss_acc(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, acc, n = self._loss_acc(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=n)
        self.log("val/acc", acc, on_epoch=True, prog_bar=True, batch_size=n)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python examples/tabular.py", description="Write the embeddings example dataset."
    )
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT, help=f"dataset path (default {DEFAULT_OUT})")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"rows to write (default {DEFAULT_ROWS})")
    args = parser.parse_args(argv)
    out = prepare(args.out, rows=args.rows)
    import lance

    ds = lance.dataset(out)
    print(out)
    print(f"rows: {ds.count_rows()}")
    for where in (
        "split = 'train'",
        f"split = 'train' AND quality >= {NOISY_BELOW}",
        f"split = 'val' AND quality >= {NOISY_BELOW}",
    ):
        print(f"{where}: {ds.count_rows(filter=where)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
