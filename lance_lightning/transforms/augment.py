"""Batch-wise ``torchvision.transforms.v2`` augmentations, on whatever device the batch is on.

Guarantees: `DeviceAugment` runs its torchvision v2 transforms on one ``(N, C, H, W)`` tensor
column with one call per transform for the whole batch (on the GPU when the batch is there,
which is where ``LanceDataModule(device_transform=...)`` runs it), replaces only that column
and keeps the tensor's shape. With ``per_sample=False`` (the default) the random parameters are
drawn once per batch (torchvision's batched semantics); ``per_sample=True`` draws them per image
at the cost of one call per image (torchvision has no batched per-sample call). With ``seed``
the per-image draws are reproducible: each image's transforms draw from a CPU generator of its
own, seeded from its row's `RowRandom` key (``seed``, epoch, position in the epoch order), so they
are the same whatever the thread, worker, rank or batch size, and a resume repeats them. The batch
then needs its row identity (``LanceDataModule(row_identity=...)``). torch's global generator is
neither read nor moved by a seeded call: while an image's transforms run, torch's random functions
that draw on the CPU (`RANDOM_FUNCTIONS`: every one torchvision's v2 transforms call) get the
image's generator through a torch function mode, which holds on the calling thread only, so a
training step or a user's transform drawing from the global generator on another thread at the
same moment draws what it would without this call. (Before, the seeded calls seeded the global
generator and restored it after each image: a model built under ``torch.manual_seed`` while a
reader thread augmented got other weights, a CI failure of the prediction writer's rerun check.)
Draws on a CUDA device, as unseeded calls, come from that device's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

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
        """Each image through the pipeline, its CPU draws from a generator seeded by its row's key."""
        out = []
        generator = torch.Generator()
        with DrawsFrom(generator):
            for image, key in zip(images, keys):
                generator.manual_seed(int(key >> 1))
                out.append(self.pipeline(image))
        return out


#: torch's random functions that draw from a generator, each taking ``generator=``.
RANDOM_FUNCTIONS = frozenset(
    {
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.rand_like,
        torch.randn_like,
        torch.randint_like,
        torch.normal,
        torch.bernoulli,
        torch.multinomial,
        torch.poisson,
        torch.Tensor.uniform_,
        torch.Tensor.normal_,
        torch.Tensor.random_,
        torch.Tensor.bernoulli,
        torch.Tensor.bernoulli_,
        torch.Tensor.multinomial,
        torch.Tensor.exponential_,
        torch.Tensor.cauchy_,
        torch.Tensor.log_normal_,
        torch.Tensor.geometric_,
    }
)


class DrawsFrom(TorchFunctionMode):
    """Within it, on the calling thread only (torch function modes are thread-local), every call
    of `RANDOM_FUNCTIONS` that draws on the CPU and names no generator draws from ``generator``."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in RANDOM_FUNCTIONS and kwargs.get("generator") is None and _draws_on_cpu(args, kwargs):
            kwargs = {**kwargs, "generator": self.generator}
        return func(*args, **kwargs)


def _draws_on_cpu(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a random call draws on the CPU: its first tensor argument's device, else its
    ``device`` argument, else torch's default device."""
    tensor = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
    if tensor is not None:
        return tensor.device.type == "cpu"
    device = kwargs.get("device")
    return torch.device(device if device is not None else torch.get_default_device()).type == "cpu"
