"""A random transform for the per-row randomness tests, importable without Lightning (DataLoader
worker processes unpickle it and must never import Lightning).

Guarantees: `Draws` adds ``draw`` (each row's first `RowRandom` uniform draw) and flips ``vec``
per row with `RandomFlip`; both depend only on (seed, epoch, the row's epoch position).
"""

from __future__ import annotations

from typing import Any

from lance_lightning.transforms import RandomFlip, RowRandom


class Draws:
    """Adds ``draw`` and flips ``vec`` per row, from the batch's row identity."""

    def __init__(self, seed: int = 7) -> None:
        self.random = RowRandom(seed)
        self.flip = RandomFlip("vec", p=0.5, dims=(-1,), seed=seed)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**self.flip(batch), "draw": self.random.uniform(batch)}
