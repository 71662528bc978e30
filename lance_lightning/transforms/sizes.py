"""Sizes and batch-wise resizing shared by the image transforms.

Guarantees: `check_size` accepts an int or a (height, width) pair of positive ints (or None) and
raises `ConfigError` naming the parameter and the value otherwise. `fit_batch` stacks a list of (C, H, W) images into
one (N, C, h, w) tensor (or takes one already stacked), resizing once per group of same-shaped
images (one call for a batch whose images share a shape, the usual case), never once per image.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from lance_lightning.errors import ConfigError
from lance_lightning.transforms.vision import functional


def check_size(size: int | tuple[int, int] | Sequence[int] | None, param: str) -> tuple[int, int] | None:
    """``(height, width)`` from ``size`` (the value of ``param``); an int ``s`` is ``(s, s)``."""
    if size is None:
        return None
    fix = "pass an int or a (height, width) pair of positive ints, e.g. 224 or [224, 224], or None"
    if isinstance(size, bool):
        raise ConfigError(param, size, "is not a valid size", fix)
    if isinstance(size, int):
        pair: tuple[Any, ...] = (size, size)
    else:
        try:
            pair = tuple(size)
        except TypeError:
            raise ConfigError(param, size, "is not a valid size", fix) from None
        if len(pair) != 2:
            raise ConfigError(param, size, f"has {len(pair)} elements", fix)
    for v in pair:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(param, size, "must hold positive ints", fix)
    return (int(pair[0]), int(pair[1]))


def fit_batch(images: list[torch.Tensor] | torch.Tensor, size: tuple[int, int] | None, fit: str) -> torch.Tensor:
    """Stack ``images`` (same channels and dtype) into (N, C, h, w), fitted to ``size`` if given.

    ``images`` is a list of (C, H, W) images or an already stacked (N, C, H, W) tensor.
    ``fit="stretch"`` resizes to ``size`` exactly; ``fit="crop"`` resizes to cover ``size`` keeping
    the aspect ratio, then crops the centre. Without ``size`` the images must share one shape.
    """
    if isinstance(images, torch.Tensor):
        return _fit(images, size, fit)
    groups: defaultdict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        groups[tuple(image.shape)].append(i)
    if len(groups) == 1:
        return _fit(torch.stack(images), size, fit)
    first = images[0]
    out = torch.empty((len(images), first.shape[0], *size), dtype=first.dtype, device=first.device)  # type: ignore[misc]
    for indices in groups.values():
        fitted = _fit(torch.stack([images[i] for i in indices]), size, fit)
        out[torch.tensor(indices, device=out.device)] = fitted
    return out


def _fit(stack: torch.Tensor, size: tuple[int, int] | None, fit: str) -> torch.Tensor:
    """Fit an (n, C, H, W) stack of same-shaped images to ``size`` with one resize call."""
    if size is None or tuple(stack.shape[-2:]) == size:
        return stack
    F = functional()
    if fit == "stretch":
        return F.resize(stack, list(size), antialias=True)
    h, w = stack.shape[-2:]
    scale = max(size[0] / h, size[1] / w)
    cover = [max(size[0], math.ceil(h * scale - 1e-6)), max(size[1], math.ceil(w * scale - 1e-6))]
    if cover != [h, w]:
        stack = F.resize(stack, cover, antialias=True)
    return F.center_crop(stack, list(size))
