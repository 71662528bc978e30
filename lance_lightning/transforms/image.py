"""Image batch transforms.

Guarantees: :class:`DecodeImage` turns one column of encoded images (JPEG,
PNG, WebP or GIF bytes) into a single ``(N, C, H, W)`` tensor stored under the
same key, leaves every other key of the batch untouched, and never returns a
partially decoded batch: a row that cannot be decoded raises
:class:`ImageDecodeError` naming the column and the row's index in the batch
(the data module's bad-row policy maps it to the dataset row). All argument
checks happen in ``__init__``, so a bad configuration fails before any data is
read.

Batched, not per row: the column's bytes are joined into one buffer and split
into views (no per-row copies), the JPEG check is one vectorised comparison,
JPEGs go to one batched ``decode_jpeg`` call, and resizing and normalising run
once per group of same-shaped images. The decoders release the GIL, so the
transform scales on the reader threads. With ``device="cuda"`` the JPEGs are
decoded on the GPU (nvJPEG); use it as the data module's ``device_transform``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms.v2 import functional as F

from lance_lightning.badrows import RowError
from lance_lightning.transforms.sizes import check_size, fit_batch

__all__ = ["DecodeImage", "ImageDecodeError"]

_MODES: dict[str, ImageReadMode] = {
    "gray": ImageReadMode.GRAY,
    "rgb": ImageReadMode.RGB,
    "unchanged": ImageReadMode.UNCHANGED,
}
_MODE_CHANNELS: dict[str, int] = {"gray": 1, "rgb": 3}
_BYTES = (bytes, bytearray, memoryview)


class ImageDecodeError(RowError):
    """A row's bytes could not be decoded as an image.

    Attributes:
        column: the batch column being decoded.
        index: the row's position within the batch (not the dataset row id; the
            bad-row policy maps it to the dataset row).
    """

    def __init__(self, column: str, index: int, reason: str) -> None:
        super().__init__(column, index, reason)
        self.args = (f"column {column!r}: row {index} of the batch could not be decoded as an image: {reason}",)


class DecodeImage:
    """Decodes a column of encoded images (JPEG/PNG bytes) into one uint8 or float tensor (N, C, H, W).

    The column's value must be a sequence of ``bytes`` (``bytearray`` and
    ``memoryview`` are accepted too), one encoded image per row. The result
    replaces the column under the same key; every other key is passed through
    unchanged.

    Args:
        column: name of the binary column holding the encoded images.
        size: output ``(height, width)``; an int ``s`` means ``(s, s)`` so that
            every image stacks. When ``None`` no resize happens and every image
            in a batch must already have the same shape.
        fit: how an image reaches ``size``: ``"stretch"`` resizes to it exactly
            (aspect ratio not kept); ``"crop"`` resizes the image to cover it,
            keeping the aspect ratio, and crops the centre. Antialiased.
        mode: ``"gray"`` (1 channel), ``"rgb"`` (3 channels) or ``"unchanged"``
            (whatever the file holds; every image must then have the same
            number of channels).
        normalize: if True the output is float32 in ``[0, 1]`` (then
            standardised with ``mean``/``std`` when given); if False the output
            keeps the decoder's dtype (uint8 for 8-bit images).
        mean: per-channel mean for standardisation; needs ``std`` and
            ``normalize=True``.
        std: per-channel standard deviation (all > 0); needs ``mean``.
        device: where to decode and return the images: ``None`` (CPU, for the
            reader threads) or a CUDA device such as ``"cuda"`` (JPEGs decoded
            by nvJPEG; other formats on the CPU, then moved). A CUDA device
            belongs in ``LanceDataModule(device_transform=...)``.

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
        fit: Literal["stretch", "crop"] = "stretch",
        device: str | None = None,
    ) -> None:
        if not isinstance(column, str) or not column:
            raise ValueError(f"column={column!r} must be a non-empty column name, e.g. column='image'")
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r} is not supported; use one of {sorted(_MODES)}")
        if fit not in ("stretch", "crop"):
            raise ValueError(f"fit={fit!r} is not supported; use 'stretch' or 'crop'")
        self.column = column
        self.size = check_size(size)
        self.mode = mode
        self.normalize = bool(normalize)
        self.fit = fit
        self.device = _check_device(device)
        self.mean, self.std = _check_mean_std(mean, std, self.normalize, mode)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(column={self.column!r}, size={self.size!r}, mode={self.mode!r}, "
            f"normalize={self.normalize!r}, mean={self.mean!r}, std={self.std!r}, fit={self.fit!r}, "
            f"device={self.device!r})"
        )

    # -- decoding -----------------------------------------------------------

    def _buffers(self, values: Sequence[Any]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One view per row into a single joined buffer, and a bool mask of the JPEG rows."""
        if None in values:
            raise ImageDecodeError(self.column, list(values).index(None), "value is null")
        if not set(map(type, values)) <= set(_BYTES):
            index = next(i for i, v in enumerate(values) if not isinstance(v, _BYTES))
            raise ImageDecodeError(self.column, index, f"expected bytes, got {type(values[index]).__name__}")
        lengths = torch.tensor(list(map(len, values)), dtype=torch.int64)
        if bool((lengths == 0).any()):
            raise ImageDecodeError(self.column, int((lengths == 0).nonzero()[0]), "value is empty (0 bytes)")
        joined = torch.frombuffer(bytearray().join(values), dtype=torch.uint8)
        starts = torch.cumsum(lengths, 0) - lengths
        head = joined[torch.minimum(starts[:, None] + torch.arange(3), starts[:, None] + lengths[:, None] - 1)]
        is_jpeg = (lengths >= 3) & (head == torch.tensor([0xFF, 0xD8, 0xFF], dtype=torch.uint8)).all(1)
        return list(torch.split(joined, lengths.tolist())), is_jpeg

    def _decode(self, values: Sequence[Any]) -> list[torch.Tensor]:
        buffers, is_jpeg = self._buffers(values)
        read_mode = _MODES[self.mode]
        images: list[torch.Tensor | None] = [None] * len(buffers)
        jpegs = is_jpeg.nonzero().flatten().tolist()
        if jpegs:
            try:
                decoded = decode_jpeg([buffers[i] for i in jpegs], mode=read_mode, device=self.device or "cpu")
            except (RuntimeError, ValueError):  # decode one by one on the CPU to find the row at fault
                decoded = [self._decode_one(i, buffers[i], read_mode).to(self.device or "cpu") for i in jpegs]
            for i, image in zip(jpegs, decoded):
                images[i] = image
        if len(jpegs) < len(buffers):
            # No batched decoder exists for PNG/WebP/GIF: one call per image (each releases the GIL).
            for i in (~is_jpeg).nonzero().flatten().tolist():
                image = self._decode_one(i, buffers[i], read_mode)
                images[i] = image.to(self.device) if self.device else image
        return images  # type: ignore[return-value]

    def _decode_one(self, i: int, buf: torch.Tensor, read_mode: ImageReadMode) -> torch.Tensor:
        try:
            return decode_image(buf, mode=read_mode)
        except (RuntimeError, ValueError) as e:
            raise ImageDecodeError(self.column, i, str(e)) from e

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
        if len(values):
            images = self._decode(values)
            self._check_stackable(images)
            out = fit_batch(images, self.size, self.fit)
            if self.normalize and out.dtype == torch.uint8:
                out = self._scale_uint8(out)
                result = dict(batch)
                result[self.column] = out
                return result
            if self.normalize:
                out = F.to_dtype(out, torch.float32, scale=True)
        else:
            c = _MODE_CHANNELS.get(self.mode, 0)
            h, w = self.size if self.size is not None else (0, 0)
            out = torch.empty((0, c, h, w), dtype=torch.float32 if self.normalize else torch.uint8,
                              device=self.device or "cpu")

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

    def _scale_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """``(x / 255 - mean) / std`` as float32 in one allocation and two passes (not 3 and 3)."""
        channels = images.shape[1]
        mean = torch.tensor(self.mean if self.mean is not None else (0.0,), dtype=torch.float64)
        std = torch.tensor(self.std if self.std is not None else (1.0,), dtype=torch.float64)
        if len(mean) == 1:
            mean, std = mean.expand(channels), std.expand(channels)
        if len(mean) != channels:
            raise ValueError(
                f"DecodeImage: column {self.column!r} decoded to {channels} channel(s) but mean/std have "
                f"{len(mean)} values; pass {channels} values or set mode='gray'/'rgb'"
            )
        scale = (1.0 / (255.0 * std)).to(torch.float32).view(1, channels, 1, 1).to(images.device)
        out = torch.empty(images.shape, dtype=torch.float32, device=images.device)
        torch.mul(images, scale, out=out)
        if self.mean is not None:
            out.sub_((mean / std).to(torch.float32).view(1, channels, 1, 1).to(images.device))
        return out

    def _check_stackable(self, images: list[torch.Tensor]) -> None:
        first = images[0]
        for img in images[1:]:
            if img.shape == first.shape and img.dtype == first.dtype:
                continue
            if img.shape[0] != first.shape[0]:
                raise ValueError(
                    f"DecodeImage: column {self.column!r} holds images with different channel counts "
                    f"{tuple(first.shape)} and {tuple(img.shape)} (C, H, W); set mode='rgb' or mode='gray'"
                )
            if img.shape != first.shape and self.size is None:
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


def _check_device(device: str | None) -> str | None:
    if device is None or device == "cpu":
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device; use None (CPU) or 'cuda' / 'cuda:N'") from None
    if parsed.type != "cuda":
        raise ValueError(f"device={device!r}: GPU decoding needs a CUDA device; use None (CPU) or 'cuda'")
    return str(parsed)


def _check_mean_std(mean: Sequence[float] | None, std: Sequence[float] | None, normalize: bool,
                    mode: str) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    if (mean is None) != (std is None):
        given, missing = ("mean", "std") if mean is not None else ("std", "mean")
        raise ValueError(
            f"{given}={mean if mean is not None else std!r} was given without {missing}; "
            f"pass both mean and std, or neither"
        )
    if mean is None or std is None:
        return None, None
    mean_t, std_t = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if not mean_t:
        raise ValueError(f"mean={mean!r} is empty; pass one value per channel, or leave mean and std as None")
    if len(mean_t) != len(std_t):
        raise ValueError(
            f"mean={mean!r} has {len(mean_t)} values but std={std!r} has {len(std_t)}; "
            f"pass one value per channel in each"
        )
    if any(not s > 0 for s in std_t):
        raise ValueError(f"std={std!r} must be > 0 in every channel; a zero std would divide by zero")
    if not normalize:
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
    return mean_t, std_t
