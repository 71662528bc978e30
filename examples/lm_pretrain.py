"""Language-model pretraining example: Python's standard library as a token dataset, and a tiny causal LM.

Guarantees: :func:`prepare` needs no network and no tokenizer download. It reads the ``.py``
sources of the running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``,
without ``site-packages`` and test directories), so for one Python installation it writes the same
dataset every time (another Python version ships other sources, hence other rows). An existing
dataset is left alone unless asked to overwrite it. :class:`TinyCausalLM` trains on the batches
that ``lance_lightning.transforms.TokenWindows(column="tokens", eos_id=EOS_ID)`` makes from it.

Tokens are bytes: token ``b`` (0..255) is the byte ``b`` of the UTF-8 source, and ``EOS_ID`` (256)
separates documents; it is not stored, ``TokenWindows(eos_id=256)`` appends it after each document.
A document is one chunk of a file: consecutive whole lines, at most ``CHUNK_BYTES`` bytes (a longer
line is cut).

Columns written:

* ``path`` (string): the file's path relative to the stdlib directory, ``/``-separated.
* ``chunk`` (int32): the chunk's index within its file.
* ``tokens`` (list<int32>): the chunk's token ids.
* ``n_tokens`` (int32): ``len(tokens)``.
* ``split`` (string): ``"val"`` for every ``VAL_EVERY``-th file in path order, ``"train"``
  otherwise; a file's chunks are all in one split.

Usage::

    python examples/lm_pretrain.py [OUT] [--max-files N]   # default OUT: data/stdlib_tokens.lance
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EOS_ID", "VOCAB_SIZE", "TinyCausalLM", "prepare", "stdlib_files"]

DEFAULT_OUT = "data/stdlib_tokens.lance"
EOS_ID = 256
VOCAB_SIZE = 257
CHUNK_BYTES = 2048
VAL_EVERY = 20
_COLUMNS = ("path", "chunk", "tokens", "n_tokens", "split")
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files(max_files: int | None = None) -> tuple[Path, list[Path]]:
    """The stdlib directory and its non-empty ``.py`` sources in path order.

    With ``max_files``, ``max_files`` of them spread evenly over that order (a smaller, varied sample).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not _SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]) and p.stat().st_size > 0
    )
    if max_files is not None and max_files < len(files):
        if max_files < 1:
            raise ValueError(f"`max_files` must be at least 1, got {max_files}")
        files = [files[i * len(files) // max_files] for i in range(max_files)]
    return root, files


def chunk_lines(data: bytes, limit: int = CHUNK_BYTES) -> list[bytes]:
    """``data`` cut into chunks of whole lines of at most ``limit`` bytes (longer lines are cut)."""
    chunks: list[bytes] = []
    current = b""
    for line in data.splitlines(keepends=True):
        while len(line) > limit:  # a very long line: cut it
            if current:
                chunks.append(current)
                current = b""
            chunks.append(line[:limit])
            line = line[limit:]
        if len(current) + len(line) > limit:
            chunks.append(current)
            current = b""
        current += line
    if current:
        chunks.append(current)
    return chunks


def prepare(out: str = DEFAULT_OUT, *, max_files: int | None = None, overwrite: bool = False) -> str:
    """Tokenize the stdlib sources into a Lance dataset at ``out`` and return ``out``.

    Idempotent: if ``out`` already holds a Lance dataset with this example's columns and
    ``overwrite`` is False, nothing is written (whatever ``max_files`` says).

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
                f"{out!r} exists but is not a stdlib token dataset (columns {list(_COLUMNS)}); "
                "remove it, choose another path, or pass overwrite=True"
            )
        return out

    root, files = stdlib_files(max_files)
    paths: list[str] = []
    chunk_ids: list[int] = []
    pieces: list[np.ndarray] = []
    splits: list[str] = []
    for position, file in enumerate(files):
        split = "val" if position % VAL_EVERY == 0 else "train"
        for index, chunk in enumerate(chunk_lines(file.read_bytes())):
            paths.append(file.relative_to(root).as_posix())
            chunk_ids.append(index)
            pieces.append(np.frombuffer(chunk, dtype=np.uint8))
            splits.append(split)
    lengths = np.array([len(p) for p in pieces], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    values = np.concatenate(pieces).astype(np.int32)  # byte b -> token id b
    table = pa.table(
        {
            "path": pa.array(paths, pa.string()),
            "chunk": pa.array(chunk_ids, pa.int32()),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            "n_tokens": pa.array(lengths),
            "split": pa.array(splits, pa.string()),
        }
    )
    dataset = lance.write_dataset(table, out, mode="overwrite" if overwrite else "create")
    dataset.create_scalar_index("split", "BITMAP")
    return out


class TinyCausalLM(L.LightningModule):
    """A small decoder-only transformer over byte tokens.

    Expects batches with ``"input_ids"`` and ``"labels"``: int64 (N, T), T <= ``context``, as
    ``TokenWindows(labels=True)`` produces them (labels already shifted; ``-100`` is ignored).
    A batch with no whole window (N = 0) is skipped.

    Args:
        vocab_size: Token ids are ``0..vocab_size-1`` (bytes and the document separator).
        context: Longest window the position embedding covers.
        d_model, n_heads, n_layers: Transformer width, attention heads, layers.
        lr: AdamW learning rate.
    """

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        context: int = 128,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        lr: float = 3e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(context, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits (N, T, vocab_size) for ``input_ids`` (N, T)."""
        steps = input_ids.shape[1]
        x = self.tokens(input_ids) + self.positions(torch.arange(steps, device=input_ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(steps, device=input_ids.device)
        return self.head(self.norm(self.blocks(x, mask=causal, is_causal=True)))

    def _loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, int] | None:
        input_ids, labels = batch["input_ids"], batch["labels"]
        if input_ids.shape[0] == 0:
            return None
        logits = self(input_ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        return loss, int(input_ids.shape[0])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        result = self._loss(batch)
        if result is None:
            return None
        loss, windows = result
        self.log("train/loss", loss, prog_bar=True, batch_size=windows)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        result = self._loss(batch)
        if result is None:
            return
        loss, windows = result
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=windows)
        self.log("val/bits_per_byte", loss / math.log(2), on_epoch=True, batch_size=windows)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python examples/lm_pretrain.py", description="Tokenize the stdlib sources into a Lance dataset."
    )
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT, help=f"dataset path (default {DEFAULT_OUT})")
    parser.add_argument("--max-files", type=int, default=None, help="use this many files, spread evenly")
    args = parser.parse_args(argv)
    out = prepare(args.out, max_files=args.max_files)
    import lance

    ds = lance.dataset(out)
    print(out)
    print(f"documents: {ds.count_rows()}")
    for split in ("train", "val"):
        rows = ds.to_table(columns=["n_tokens"], filter=f"split = {split!r}")["n_tokens"].to_numpy()
        print(f"{split}: {len(rows)} documents, {int(rows.sum()):,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
