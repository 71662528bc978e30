"""Image batch transforms.

Guarantees: :class:`DecodeImage` turns one column of encoded images (JPEG,
PNG, WebP or GIF bytes) into a single ``(N, C, H, W)`` tensor stored under the
same key, leaves every other key of the batch untouched, and never returns a
partially decoded batch: a row that cannot be decoded raises
:class:`ImageDecodeError` naming the column and the row's index in the batch.
All argument checks happen in ``__init__``, so a bad configuration fails before
any data is read.

The decoders (``torchvision.io``) release the GIL, so the transform is meant to
be run on a thread pool; that is the caller's business, not this module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms.v2 import functional as F

__all__ = ["DecodeImage", "ImageDecodeError"]

_JPEG_MAGIC = b"\xff\xd8\xff"

_MODES: dict[str, ImageReadMode] = {
    "gray": ImageReadMode.GRAY,
    "rgb": ImageReadMode.RGB,
    "unchanged": ImageReadMode.UNCHANGED,
}
_MODE_CHANNELS: dict[str, int] = {"gray": 1, "rgb": 3}


class ImageDecodeError(ValueError):
    """A row's bytes could not be decoded as an image.

    Attributes:
        column: the batch column being decoded.
        index: the row's position within the batch (not the dataset row id; the
            caller maps it to a row id).
    """

    def __init__(self, column: str, index: int, reason: str) -> None:
        self.column = column
        self.index = index
        self.reason = reason
        super().__init__(
            f"column {column!r}: row {index} of the batch could not be decoded as an image: {reason}"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keep it picklable across processes
        return (type(self), (self.column, self.index, self.reason))


def _normalize_size(size: int | tuple[int, int] | Sequence[int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, bool):
        raise ValueError(f"size={size!r} is not a valid size; pass an int or a (height, width) pair of positive ints, or None")
    if isinstance(size, int):
        pair: tuple[Any, ...] = (size, size)
    else:
        try:
            pair = tuple(size)
        except TypeError:
            raise ValueError(
                f"size={size!r} is not a valid size; pass an int or a (height, width) pair of positive ints, or None"
            ) from None
        if len(pair) != 2:
            raise ValueError(
                f"size={size!r} has {len(pair)} elements; pass an int or a (height, width) pair of positive ints"
            )
    for v in pair:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(
                f"size={size!r} must hold positive ints; pass e.g. size=224 or size=(224, 224)"
            )
    return (int(pair[0]), int(pair[1]))


class DecodeImage:
    """Decodes a column of encoded images (JPEG/PNG bytes) into one uint8 or float tensor (N, C, H, W).

    The column's value must be a sequence of ``bytes`` (``bytearray`` and
    ``memoryview`` are accepted too), one encoded image per row. The result
    replaces the column under the same key; every other key is passed through
    unchanged.

    Args:
        column: name of the binary column holding the encoded images.
        size: output ``(height, width)``; an int ``s`` means ``(s, s)`` (unlike
            torchvision's ``resize``, which would resize the shorter edge, an
            int here is a square so that every image stacks). Images are resized
            with antialiasing. When ``None`` no resize happens and every image
            in a batch must already have the same shape.
        mode: ``"gray"`` (1 channel), ``"rgb"`` (3 channels) or ``"unchanged"``
            (whatever the file holds; every image must then have the same
            number of channels).
        normalize: if True the output is float32 in ``[0, 1]`` (then
            standardised with ``mean``/``std`` when given); if False the output
            keeps the decoder's dtype (uint8 for 8-bit images).
        mean: per-channel mean for standardisation; needs ``std`` and
            ``normalize=True``.
        std: per-channel standard deviation (all > 0); needs ``mean``.

    Raises:
        ImageDecodeError: a row's bytes are missing or undecodable.
        ValueError: images of different shapes without ``size``, or a channel
            count that does not match ``mean``/``std``.
    """

    def __init__(
        self,
        column: str = "image",
        size: int | tuple[int, int] | None = None,
        mode: Literal["gray", "rgb", "unchanged"] = "rgb",
        normalize: bool = True,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
    ) -> None:
        if not isinstance(column, str) or not column:
            raise ValueError(f"column={column!r} must be a non-empty column name, e.g. column='image'")
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r} is not supported; use one of {sorted(_MODES)}")
        self.column = column
        self.size = _normalize_size(size)
        self.mode = mode
        self.normalize = bool(normalize)

        if (mean is None) != (std is None):
            given, missing = ("mean", "std") if mean is not None else ("std", "mean")
            raise ValueError(
                f"{given}={mean if mean is not None else std!r} was given without {missing}; "
                f"pass both mean and std, or neither"
            )
        if mean is not None and std is not None:
            mean_t = tuple(float(m) for m in mean)
            std_t = tuple(float(s) for s in std)
            if not mean_t:
                raise ValueError(f"mean={mean!r} is empty; pass one value per channel, or leave mean and std as None")
            if len(mean_t) != len(std_t):
                raise ValueError(
                    f"mean={mean!r} has {len(mean_t)} values but std={std!r} has {len(std_t)}; "
                    f"pass one value per channel in each"
                )
            if any(not s > 0 for s in std_t):
                raise ValueError(f"std={std!r} must be > 0 in every channel; a zero std would divide by zero")
            if not self.normalize:
                raise ValueError(
                    f"mean={mean!r}/std={std!r} need normalize=True (they apply to [0, 1] floats); "
                    f"set normalize=True or drop mean and std"
                )
            expected = _MODE_CHANNELS.get(mode)
            if expected is not None and len(mean_t) not in (1, expected):
                raise ValueError(
                    f"mean={mean!r} has {len(mean_t)} values but mode={mode!r} gives {expected} channel(s); "
                    f"pass {expected} values (or 1 to share across channels)"
                )
            self.mean: tuple[float, ...] | None = mean_t
            self.std: tuple[float, ...] | None = std_t
        else:
            self.mean = None
            self.std = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(column={self.column!r}, size={self.size!r}, mode={self.mode!r}, "
            f"normalize={self.normalize!r}, mean={self.mean!r}, std={self.std!r})"
        )

    # -- decoding -----------------------------------------------------------

    def _buffers(self, values: Sequence[Any]) -> list[torch.Tensor]:
        buffers: list[torch.Tensor] = []
        for i, b in enumerate(values):
            if b is None:
                raise ImageDecodeError(self.column, i, "value is null")
            if not isinstance(b, (bytes, bytearray, memoryview)):
                raise ImageDecodeError(self.column, i, f"expected bytes, got {type(b).__name__}")
            if len(b) == 0:
                raise ImageDecodeError(self.column, i, "value is empty (0 bytes)")
            buffers.append(torch.frombuffer(bytearray(b), dtype=torch.uint8))
        return buffers

    def _decode_one(self, i: int, buf: torch.Tensor, read_mode: ImageReadMode) -> torch.Tensor:
        try:
            return decode_image(buf, mode=read_mode)
        except (RuntimeError, ValueError) as e:
            raise ImageDecodeError(self.column, i, str(e)) from e

    def _decode(self, values: Sequence[Any]) -> list[torch.Tensor]:
        buffers = self._buffers(values)
        read_mode = _MODES[self.mode]
        if buffers and all(bytes(buf[:3].tolist()) == _JPEG_MAGIC for buf in buffers):
            try:
                out = decode_jpeg(buffers, mode=read_mode)
                return list(out) if isinstance(out, (list, tuple)) else [out]
            except (RuntimeError, ValueError):
                pass  # decode one at a time below to find the row at fault
        return [self._decode_one(i, buf, read_mode) for i, buf in enumerate(buffers)]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.column not in batch:
            raise ValueError(
                f"DecodeImage: column {self.column!r} is not in the batch (columns: {sorted(batch)}); "
                f"set column= to one of them or add it to the columns read"
            )
        values = batch[self.column]
        if isinstance(values, torch.Tensor):
            raise ValueError(
                f"DecodeImage: column {self.column!r} is already a tensor of shape {tuple(values.shape)}; "
                f"it expects encoded image bytes (was the column decoded twice?)"
            )
        images = self._decode(values)

        if self.size is not None:
            images = [F.resize(img, list(self.size), antialias=True) for img in images]

        if images:
            first = images[0]
            for img in images[1:]:
                if img.shape[0] != first.shape[0]:
                    raise ValueError(
                        f"DecodeImage: column {self.column!r} holds images with different channel counts "
                        f"{tuple(first.shape)} and {tuple(img.shape)} (C, H, W); set mode='rgb' or mode='gray'"
                    )
                if img.shape != first.shape:
                    raise ValueError(
                        f"DecodeImage: column {self.column!r} holds images of different shapes "
                        f"{tuple(first.shape)} and {tuple(img.shape)} (C, H, W); set size= to resize "
                        f"them to one shape"
                    )
                if img.dtype != first.dtype:
                    raise ValueError(
                        f"DecodeImage: column {self.column!r} holds images of different bit depths "
                        f"({first.dtype} and {img.dtype}); set normalize=True to get float32 for all"
                    )
            if self.normalize:
                images = [F.to_dtype(img, torch.float32, scale=True) for img in images]
            out = torch.stack(images)
        else:
            c = _MODE_CHANNELS.get(self.mode, 0)
            h, w = self.size if self.size is not None else (0, 0)
            out = torch.empty((0, c, h, w), dtype=torch.float32 if self.normalize else torch.uint8)

        if self.normalize and self.mean is not None and self.std is not None:
            channels = out.shape[1]
            mean, std = list(self.mean), list(self.std)
            if len(mean) == 1:
                mean, std = mean * channels, std * channels
            if len(mean) != channels:
                raise ValueError(
                    f"DecodeImage: column {self.column!r} decoded to {channels} channel(s) but mean/std have "
                    f"{len(self.mean)} values; pass {channels} values or set mode='gray'/'rgb'"
                )
            if out.shape[0] > 0:
                out = F.normalize(out, mean=mean, std=std)

        result = dict(batch)
        result[self.column] = out
        return result
