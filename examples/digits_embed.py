"""Digits round trip, part 1: a model that embeds each digit image as 32 floats, for
``lance-lightning predict --config configs/digits_embed.yaml`` to write back into
``data/digits.lance`` as an ``embedding`` column (`lance_lightning.LancePredictionWriter`).

Guarantees: `DigitsEmbedder` is deterministic (a fixed, seeded projection of the 64 pixels, no
training), so every run and every rank writes the same vector for the same image; part 2,
``configs/digits_from_embedding.yaml``, trains `examples.tabular.EmbeddingClassifier` on that column.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

__all__ = ["DigitsEmbedder"]


class DigitsEmbedder(L.LightningModule):
    """Embeds ``"image"`` (float (N, 1, 8, 8), from ``DecodeImage(column="image", mode="gray")``) as
    ``dim`` floats: centered pixels times a fixed Gaussian projection (seeded), so distances between
    images are kept up to a small distortion.

    Args:
        dim: Embedding width.
        seed: Seed of the projection.
    """

    def __init__(self, dim: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("projection", torch.randn(64, dim, generator=generator) / dim**0.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pixels = image.reshape(len(image), -1).float()
        return (pixels - pixels.mean(dim=1, keepdim=True)) @ self.projection

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch["image"])
