"""Batch-wise ``torchvision.transforms.v2`` augmentations, on whatever device the batch is on.

Guarantees: `DeviceAugment` runs its torchvision v2 transforms on one ``(N, C, H, W)`` tensor
column with one call per transform for the whole batch (on the GPU when the batch is there,
which is where ``LanceDataModule(device_transform=...)`` runs it), replaces only that column
and keeps the tensor's shape. With ``per_sample=False`` (the default) the random parameters are
drawn once per batch (torchvision's batched semantics); ``per_sample=True`` draws them per image
at the cost of one call per image (torchvision has no batched per-sample call). With ``seed``
the per-image draws are reproducible: each image's transforms run with torch's CPU generator seeded
from its row's `RowRandom` key (``seed``, epoch, position in the epoch order), so they are the same
whatever the thread, worker, rank or batch size, and a resume repeats them. The batch then needs
its row identity (``LanceDataModule(row_identity=...)``); the seeded calls hold a process-wide lock
and restore the generator's state after each image.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from lance_lightning.errors import ConfigError
from lance_lightning.transforms.random import RowRandom
from lance_lightning.transforms.vision import v2

__all__ = ["DeviceAugment"]


class DeviceAugment:
    """Applies torchvision v2 transforms to the image tensor ``column`` of a batch.

    Args:
        transforms: torchvision ``v2`` transforms (modules), applied in order, e.g.
            ``[v2.RandomHorizontalFlip(), v2.ColorJitter(brightness=0.2)]``; in YAML a list of
            ``class_path: torchvision.transforms.v2.RandomHorizontalFlip`` entries.
        column: The ``(N, C, H, W)`` image tensor column (e.g. from `DecodeImage`).
        per_sample: Draw random parameters per image (one call per image) instead of per batch.
        seed: Draw each image's parameters from its row's own seeded stream (`RowRandom`; implies
            ``per_sample``), reproducible across threads, workers, ranks and resumes. ``None``:
            torch's global random state, as torchvision does.
    """

    def __init__(
        self,
        transforms: Sequence[torch.nn.Module],
        column: str = "image",
        per_sample: bool = False,
        seed: int | None = None,
    ) -> None:
        if isinstance(transforms, torch.nn.Module):
            transforms = [transforms]
        if not isinstance(transforms, Sequence) or not transforms:
            raise ConfigError(
                "transforms",
                transforms,
                "must be a non-empty list of torchvision v2 transforms",
                "pass e.g. [v2.RandomHorizontalFlip()]",
            )
        for i, transform in enumerate(transforms):
            if not callable(transform):
                raise ConfigError(f"transforms[{i}]", transform, "is not callable", "pass torchvision v2 transforms")
        if not isinstance(column, str) or not column:
            raise ConfigError("column", column, "must be a column name", 'set column: "image"')
        self.transforms = list(transforms)
        self.column = column
        self.random = None if seed is None else RowRandom(seed)
        self.per_sample = bool(per_sample) or self.random is not None
        self.pipeline = v2().Compose(self.transforms)

    def __repr__(self) -> str:
        seed = None if self.random is None else self.random.seed
        return (
            f"{type(self).__name__}({self.transforms!r}, column={self.column!r}, per_sample={self.per_sample!r}, "
            f"seed={seed!r})"
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        images = batch.get(self.column)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            described = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(
                f"DeviceAugment: column {self.column!r} must be an (N, C, H, W) image tensor, got {described}; "
                "decode it first (transform=DecodeImage(...) or DecodeImage(device='cuda') before this)"
            )
        if self.random is not None:
            out = torch.stack(self._seeded(images, self.random.keys(batch))) if len(images) else images
        elif self.per_sample:
            out = torch.stack([self.pipeline(image) for image in images]) if len(images) else images
        else:
            out = self.pipeline(images)
        result = dict(batch)
        result[self.column] = out
        return result

    def _seeded(self, images: torch.Tensor, keys: Any) -> list[torch.Tensor]:
        """Each image through the pipeline with the CPU generator seeded by its row's key."""
        out = []
        with _SEEDED, torch.random.fork_rng(devices=[]):
            for image, key in zip(images, keys):
                torch.manual_seed(int(key >> 1))
                out.append(self.pipeline(image))
        return out


#: Seeded calls swap the process's CPU generator state: one at a time.
_SEEDED = threading.Lock()
