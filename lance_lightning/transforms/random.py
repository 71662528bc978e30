"""Per-row randomness: draws that depend only on (seed, epoch, the row's position in the epoch order).

Guarantees:
- `RowRandom` gives each row of a batch its own random stream, keyed by ``(seed, _epoch,
  _position)`` from the batch's row identity (`lance_lightning.produce.identity`): the same row of
  the same epoch draws the same values whatever the reader thread, DataLoader worker, rank, world
  size or batch size, and a resumed run repeats the uninterrupted run's draws exactly. No global
  random state is read or changed (torch's, NumPy's and ``random``'s generators are untouched), so
  reader threads never race on one.
- ``uniform`` is vectorised (counter-based splitmix64 of the row key, no per-row Python loop);
  ``generators`` / ``numpy_generators`` hand out one seeded ``torch.Generator`` /
  ``numpy.random.Generator`` per row for anything else.
- A batch without the identity keys raises `ConfigError` naming ``row_identity`` and the fix.
- `RandomFlip`, `RandomCrop` and `MaskTokens` are the package's random transforms: each draws from
  a `RowRandom`, works on the whole batch and returns a new dict with only its column replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.plan.bijection import derive_key, subkeys
from lance_lightning.transforms.sizes import check_size
from lance_lightning.vocabulary import EPOCH, EPOCH_POSITION

__all__ = ["MaskTokens", "RandomCrop", "RandomFlip", "RowRandom"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class RowRandom:
    """Random draws per row of a batch, keyed by ``(seed, epoch, position in the epoch order)``.

    Args:
        seed: The transform's own seed: another seed, other draws for every row.
    """

    def __init__(self, seed: int = 0) -> None:
        check_int("seed", seed, 0, "set seed to a non-negative integer, e.g. seed: 0")
        self.seed = seed

    def __repr__(self) -> str:
        return f"RowRandom(seed={self.seed})"

    def keys(self, batch: dict[str, Any]) -> np.ndarray:
        """One 64-bit key (``uint64``) per row of ``batch``."""
        if EPOCH_POSITION not in batch or EPOCH not in batch:
            raise ConfigError(
                "row_identity",
                sorted(batch),
                f"a per-row random transform needs the batch keys {EPOCH_POSITION!r} and {EPOCH!r}, "
                "which only batches with row identity carry",
                "add the split to LanceDataModule(row_identity=...), e.g. row_identity: true",
            )
        positions = _numpy(batch[EPOCH_POSITION])
        epochs = _numpy(batch[EPOCH])
        keys = np.empty(len(positions), dtype=np.uint64)
        for epoch in np.unique(epochs):  # one epoch per batch: one pass
            rows = epochs == epoch
            keys[rows] = subkeys(derive_key(self.seed, int(epoch)), positions[rows])
        return keys

    def uniform(self, batch: dict[str, Any], *shape: int) -> torch.Tensor:
        """Floats in ``[0, 1)`` of shape ``(rows, *shape)``: draw ``j`` of row ``i`` depends only on
        row ``i``'s key and ``j``."""
        keys = self.keys(batch)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        counters = (np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        with np.errstate(over="ignore"):
            bits = subkeys(0, keys[:, None] + counters)
        values = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return torch.from_numpy(values.reshape(len(keys), *shape))

    def integers(self, batch: dict[str, Any], high: torch.Tensor | int) -> torch.Tensor:
        """One integer in ``[0, high)`` per row (``high`` per row or for all), int64."""
        draws = self.uniform(batch)
        return torch.floor(draws * torch.as_tensor(high, dtype=torch.float64)).to(torch.int64)

    def generators(self, batch: dict[str, Any], device: str | torch.device = "cpu") -> list[torch.Generator]:
        """A seeded ``torch.Generator`` per row (on ``device``)."""
        return [torch.Generator(device).manual_seed(int(key >> np.uint64(1))) for key in self.keys(batch)]

    def numpy_generators(self, batch: dict[str, Any]) -> list[np.random.Generator]:
        """A seeded ``numpy.random.Generator`` per row."""
        return [np.random.default_rng(int(key)) for key in self.keys(batch)]


def _numpy(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(values, dtype=np.int64)


def _check_column(column: Any, default: str) -> str:
    if not isinstance(column, str) or not column:
        raise ConfigError("column", column, "must be a column name", f'set column: "{default}"')
    return column


def _check_p(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ConfigError("p", p, "must be a probability in [0, 1]", "set p: 0.5")
    return float(p)


def _tensor(batch: dict[str, Any], column: str, name: str, dims: int) -> torch.Tensor:
    value = batch.get(column)
    if not isinstance(value, torch.Tensor) or value.dim() < dims:
        described = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name}: column {column!r} must be a tensor of at least {dims} dims, got {described}")
    return value


class RandomFlip:
    """Flips each row's tensor along ``dims`` with probability ``p``, per row.

    Args:
        column: The tensor column, e.g. ``(N, C, H, W)`` images from `DecodeImage`.
        p: Probability that a row is flipped.
        dims: Dimensions of a row to flip (negative counts from the last): ``(-1,)`` flips images
            horizontally, ``(-2,)`` vertically.
        seed: Seed of the draws (`RowRandom`).
    """

    #: Its work runs in native code that releases the GIL: reader threads run it in parallel
    #: (worker processes would add nothing: `lance_lightning.load.race.may_hold_gil`).
    releases_gil = True

    def __init__(self, column: str = "image", p: float = 0.5, dims: Sequence[int] = (-1,), seed: int = 0) -> None:
        self.column = _check_column(column, "image")
        self.p = _check_p(p)
        if not isinstance(dims, Sequence) or not dims or not all(isinstance(d, int) and d != 0 for d in dims):
            raise ConfigError("dims", dims, "must be non-empty row dimensions (not 0, the batch)", "set dims: [-1]")
        self.dims = tuple(dims)
        self.random, self.seed = RowRandom(seed), seed

    def __repr__(self) -> str:
        return f"RandomFlip(column={self.column!r}, p={self.p}, dims={self.dims}, seed={self.random.seed})"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        values = _tensor(batch, self.column, "RandomFlip", 2)
        flip = (self.random.uniform(batch) < self.p).to(values.device)
        shape = (len(values),) + (1,) * (values.dim() - 1)
        return {**batch, self.column: torch.where(flip.reshape(shape), values.flip(self.dims), values)}


class RandomCrop:
    """Crops each row's ``(..., H, W)`` tensor to ``size`` at a random offset, per row.

    Args:
        column: The tensor column, e.g. ``(N, C, H, W)`` images from `DecodeImage`.
        size: Output ``(height, width)``; an int ``s`` means ``(s, s)``. At most the input's size.
        seed: Seed of the draws (`RowRandom`).
    """

    #: Its work runs in native code that releases the GIL: reader threads run it in parallel
    #: (worker processes would add nothing: `lance_lightning.load.race.may_hold_gil`).
    releases_gil = True

    def __init__(self, column: str = "image", size: int | tuple[int, int] = 224, seed: int = 0) -> None:
        self.column = _check_column(column, "image")
        checked = check_size(size, "RandomCrop.size")
        if checked is None:
            raise ConfigError("RandomCrop.size", size, "is required", "set size: 224 or [height, width]")
        self.size = checked
        self.random, self.seed = RowRandom(seed), seed

    def __repr__(self) -> str:
        return f"RandomCrop(column={self.column!r}, size={self.size}, seed={self.random.seed})"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        values = _tensor(batch, self.column, "RandomCrop", 3)
        height, width = values.shape[-2:]
        out_h, out_w = self.size
        if out_h > height or out_w > width:
            raise ValueError(f"RandomCrop: size {self.size} is larger than the rows' {(height, width)}")
        draws = self.random.uniform(batch, 2)
        tops = torch.floor(draws[:, 0] * (height - out_h + 1)).to(torch.int64).tolist()
        lefts = torch.floor(draws[:, 1] * (width - out_w + 1)).to(torch.int64).tolist()
        crops = [row[..., t : t + out_h, s : s + out_w] for row, t, s in zip(values, tops, lefts)]
        cropped = torch.stack(crops) if crops else values[..., :out_h, :out_w]
        return {**batch, self.column: cropped}


class MaskTokens:
    """Replaces each token of a ``(N, L)`` token tensor by ``mask_id`` with probability ``p``.

    The tensor holds one row per batch row (a ``fixed_size_list`` token column; not the windows of
    `TokenWindows`, which cut across rows). Draw ``j`` of a row masks its token ``j``, so a row's
    mask does not depend on the batch's other rows. The column is replaced and
    ``<column>_mask`` (bool, True where masked) added.

    Args:
        column: The ``(N, L)`` token tensor column.
        p: Probability that a token is masked.
        mask_id: The token that replaces masked ones.
        seed: Seed of the draws (`RowRandom`).
    """

    #: Its work runs in native code that releases the GIL: reader threads run it in parallel
    #: (worker processes would add nothing: `lance_lightning.load.race.may_hold_gil`).
    releases_gil = True

    def __init__(self, column: str = "input_ids", p: float = 0.15, mask_id: int = 0, seed: int = 0) -> None:
        self.column = _check_column(column, "input_ids")
        self.p = _check_p(p)
        check_int("mask_id", mask_id, None, "set mask_id to an integer token id")
        self.mask_id = mask_id
        self.random, self.seed = RowRandom(seed), seed

    def __repr__(self) -> str:
        return f"MaskTokens(column={self.column!r}, p={self.p}, mask_id={self.mask_id}, seed={self.random.seed})"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        tokens = _tensor(batch, self.column, "MaskTokens", 2)
        if len(tokens) != len(batch.get(EPOCH_POSITION, tokens)):
            raise ValueError(
                f"MaskTokens: column {self.column!r} has {len(tokens)} rows, the batch "
                f"{len(batch[EPOCH_POSITION])}: mask the batch's own rows, before TokenWindows"
            )
        mask = (self.random.uniform(batch, *tokens.shape[1:]) < self.p).to(tokens.device)
        return {
            **batch,
            self.column: tokens.masked_fill(mask, self.mask_id),
            f"{self.column}_mask": mask,
        }
