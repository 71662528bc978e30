"""Image batch transforms.

Guarantees: :class:`DecodeImage` turns one column of encoded images (JPEG,
PNG, WebP or GIF bytes) into a single ``(N, C, H, W)`` tensor stored under the
same key, leaves every other key of the batch untouched, and never returns a
partially decoded batch: a row that cannot be decoded raises
:class:`ImageDecodeError` naming the column and the row's index in the batch
(the data module's bad-row policy maps it to the dataset row). All argument
checks happen in ``__init__``, so a bad configuration fails before any data is
read.

Batched, not per row: the column's bytes are one buffer (a converted binary
column already is; a list of bytes is joined once), the whole
batch is decoded and stacked by one compiled loop that releases the GIL once for
the batch, not once per image (so the transform scales over the reader
threads), resizing runs once per group of same-shaped images, and normalising
runs in cache-sized chunks. With
``device="cuda"`` the JPEGs (found with one vectorised comparison) go to one
batched nvJPEG call on the GPU; use it as the data module's ``device_transform``.
If that call fails, the JPEGs are decoded one call each, so a bad row is named
exactly as on the CPU. With ``cpu_share`` the first rows of each batch are decoded on
CPU threads while the GPU decodes the rest (`lance_lightning.transforms.host_share`), then copied
to the GPU and resized and normalised with them. The decoder backend (TorchCodec, or torchvision
as the fallback) is chosen in ``__init__``, see `lance_lightning.transforms.decoders`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Literal

import pyarrow as pa
import torch

from lance_lightning.errors import ConfigError, ImageDecodeError
from lance_lightning.produce.convert import Ragged
from lance_lightning.transforms import decoders
from lance_lightning.transforms.host_share import HostShare
from lance_lightning.transforms.sizes import check_size, fit_batch
from lance_lightning.transforms.vision import functional

__all__ = ["DecodeImage", "ImageDecodeError"]

#: torchvision's and TorchCodec's ``ImageReadMode`` values (the two enums agree).
_MODES: dict[str, int] = {"gray": 1, "rgb": 3, "unchanged": 0}
_MODE_CHANNELS: dict[str, int] = {"gray": 1, "rgb": 3}
_BYTES = (bytes, bytearray, memoryview)
#: Output bytes normalised per chunk: small enough to stay in a core's L2 cache between passes.
_SCALE_CHUNK_BYTES = 1 << 20


class DecodeImage:
    """Decodes a column of encoded images (JPEG/PNG bytes) into one uint8 or float tensor (N, C, H, W).

    The column's value is a binary column as the loader converts it (a uint8
    `Ragged`, read without a copy) or a sequence of ``bytes`` (``bytearray``
    and ``memoryview`` are accepted too), one encoded image per row. The result
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
            reader threads) or a CUDA device such as ``"cuda"`` (the batch's
            JPEGs decoded by nvJPEG in one call; other formats on the CPU, then
            copied without blocking). A CUDA device belongs in
            ``LanceDataModule(device_transform=...)``, which then leaves this
            column's bytes on the host (pinned) for the decoder.
        backend: the decoder: ``"torchcodec"`` (TorchCodec), ``"torchvision"``
            (its decoders are deprecated since torchvision 0.29), or
            ``"auto"`` (TorchCodec when installed, else torchvision). Both give
            the same images; see docs/performance.md for their speed.
        cpu_share: with a CUDA ``device``, the fraction of each batch (its first
            rows) decoded on CPU threads while the GPU decodes the rest, so
            that the GPU's decode work competes less with the model's kernels
            (benchmarks/results/gpu.md measures the shares). ``0`` (the
            default): the GPU decodes every JPEG. Without a device it has no
            effect (every row is decoded on the CPU).
        cpu_threads: threads for the CPU share (``None``: half the cores, at
            most 8).

    Raises:
        ConfigError: ``backend`` is unknown, or names a backend that is not installed.
        ImageDecodeError: a row's bytes are missing or undecodable.
        ValueError: images of different shapes without ``size``, or a channel
            count that does not match ``mean``/``std``.
    """

    #: Its work runs in native code that releases the GIL: reader threads run it in parallel
    #: (worker processes would add nothing: `lance_lightning.load.race.may_hold_gil`).
    releases_gil = True

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
        backend: Literal["auto", "torchcodec", "torchvision"] = "auto",
        cpu_share: float = 0.0,
        cpu_threads: int | None = None,
    ) -> None:
        if not isinstance(column, str) or not column:
            raise ConfigError("DecodeImage.column", column, "must be a non-empty column name", "e.g. column='image'")
        if mode not in _MODES:
            raise ConfigError("DecodeImage.mode", mode, "is not supported", f"use one of {sorted(_MODES)}")
        if fit not in ("stretch", "crop"):
            raise ConfigError("DecodeImage.fit", fit, "is not supported", "use 'stretch' or 'crop'")
        self.column = column
        self.size = check_size(size, "DecodeImage.size")
        self.mode = mode
        self.normalize = bool(normalize)
        self.fit = fit
        self.device = _check_device(device)
        self.mean, self.std = _check_mean_std(mean, std, self.normalize, mode)
        self.backend = decoders.resolve_backend(backend)
        self.host_share = HostShare(cpu_share, cpu_threads)

    @property
    def cpu_share(self) -> float:
        """The fraction of each batch decoded on CPU threads beside a GPU decode (see ``__init__``)."""
        return self.host_share.share

    @property
    def cpu_threads(self) -> int | None:
        return self.host_share.threads

    @property
    def host_columns(self) -> tuple[str, ...]:
        """Columns the batch transfer must leave on the host: the encoded bytes of a device decode."""
        return (self.column,) if self.device is not None else ()

    def check_schema(self, schema: Any) -> None:
        """At setup: `ConfigError` if the read column ``column`` is not a binary column."""
        if self.column not in schema.names:
            return  # an earlier transform may make it; the batch check names it otherwise
        typ = schema.field(self.column).type
        if not (pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ)):
            binary = [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
            raise ConfigError(
                "transform.column",
                self.column,
                f"DecodeImage decodes encoded image bytes, but column {self.column!r} is {typ}",
                f"set column to a binary column of JPEG/PNG bytes ({binary or 'none is read'})",
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(column={self.column!r}, size={self.size!r}, mode={self.mode!r}, "
            f"normalize={self.normalize!r}, mean={self.mean!r}, std={self.std!r}, fit={self.fit!r}, "
            f"device={self.device!r}, backend={self.backend!r}"
            + (f", cpu_share={self.cpu_share!r}, cpu_threads={self.cpu_threads!r})" if self.cpu_share else ")")
        )

    # -- decoding -----------------------------------------------------------

    def _joined(self, values: Ragged | Sequence[Any]) -> tuple[torch.Tensor, list[int]]:
        """All rows' bytes in one buffer, and the bounds of row ``i``: ``bounds[i]:bounds[i + 1]``."""
        if isinstance(values, Ragged):  # a converted binary column: already one buffer (no copy)
            if values.values.dtype != torch.uint8:
                raise ValueError(
                    f"DecodeImage: column {self.column!r} holds {values.values.dtype} lists; it "
                    "expects a binary column of encoded images"
                )
            empty = torch.nonzero(values.lengths() == 0)
            if len(empty):
                raise ImageDecodeError(self.column, int(empty[0]), "value is empty (0 bytes)")
            return values.values, values.offsets.tolist()
        if None in values:
            raise ImageDecodeError(self.column, list(values).index(None), "value is null")
        if not set(map(type, values)) <= set(_BYTES):
            index = next(i for i, v in enumerate(values) if not isinstance(v, _BYTES))
            raise ImageDecodeError(self.column, index, f"expected bytes, got {type(values[index]).__name__}")
        lengths = list(map(len, values))
        if 0 in lengths:
            raise ImageDecodeError(self.column, lengths.index(0), "value is empty (0 bytes)")
        joined = torch.frombuffer(bytearray().join(values), dtype=torch.uint8)
        return joined, list(accumulate(lengths, initial=0))

    def _decode(self, values: Sequence[Any]) -> torch.Tensor | list[torch.Tensor]:
        """The images stacked as (N, C, H, W) when they share a shape and dtype, else one per row."""
        joined, bounds = self._joined(values)
        kinds = decoders.formats(joined, bounds)
        if self.device is None:
            stacked, images = self._decode_host(joined, bounds, kinds)
            return images or stacked
        return self._decode_on(torch.device(self.device), joined, bounds, kinds)

    def _decode_host(
        self, joined: torch.Tensor, bounds: list[int], kinds: torch.Tensor, first: int = 0
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Rows ``joined[bounds[i]:bounds[i + 1]]`` decoded on the CPU, ``(stacked, [])`` or
        ``(empty, images)``; a bad row is named as row ``first + i`` of the batch."""
        try:
            return decoders.decode_rows(self.backend, joined, bounds, kinds, _MODES[self.mode])
        except (RuntimeError, ValueError):  # decode one by one to find the row at fault
            images = [self._decode_one(first + i, joined[bounds[i] : bounds[i + 1]]) for i in range(len(bounds) - 1)]
        return torch.empty(0), images

    def _decode_on(
        self, device: torch.device, joined: torch.Tensor, bounds: list[int], kinds: torch.Tensor
    ) -> list[torch.Tensor]:
        """Every row decoded onto ``device``: the JPEGs in one batched call, the other rows on the
        CPU, then copied without blocking. The first ``host_share.rows(n)`` rows are decoded on CPU
        threads meanwhile (`HostShare`); a bad row among them is named before one of the GPU's."""
        if joined.device.type != "cpu":
            joined = joined.cpu()  # the decoders parse the encoded bytes on the host
        if device.type == "cuda" and not joined.is_pinned():
            joined = joined.pin_memory()  # the decoder's host-to-device copy of the bytes can then be async
        rows = [joined[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        on_host = self.host_share.rows(len(rows))
        pending = None
        if on_host:
            pending = self.host_share.submit(
                lambda start, stop: self._decode_host_rows(joined, bounds, kinds, start, stop), on_host, device
            )
        jpegs = (torch.nonzero(kinds[on_host:] == decoders.JPEG).flatten() + on_host).tolist()
        images: list[torch.Tensor | None] = [None] * len(rows)
        try:
            decoded = self._decode_jpegs(device, rows, jpegs)
        except ImageDecodeError as error:
            first = pending.first_error() if pending is not None else None
            raise (first or error) from None
        for i, image in zip(jpegs, decoded):
            images[i] = image
        if pending is not None:
            images[:on_host] = pending.result()
        for i in (i for i, image in enumerate(images) if image is None):
            image = self._decode_one(i, rows[i])
            images[i] = image.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else image.to(device)
        return images  # type: ignore[return-value]

    def _decode_host_rows(
        self, joined: torch.Tensor, bounds: list[int], kinds: torch.Tensor, start: int, stop: int
    ) -> torch.Tensor | list[torch.Tensor]:
        """Rows ``[start, stop)`` decoded on the CPU (on a thread of `HostShare`)."""
        stacked, images = self._decode_host(joined, bounds[start : stop + 1], kinds[start:stop], first=start)
        return images or stacked

    def _decode_jpegs(self, device: torch.device, rows: list[torch.Tensor], jpegs: list[int]) -> list[torch.Tensor]:
        """Rows ``jpegs`` decoded on ``device`` by one batched call; if that call fails, by one call
        per image, so that the bad row is named (and the bad-row policy handles it as on the CPU)."""
        if not jpegs:
            return []
        mode = _MODES[self.mode]
        try:
            return decoders.decode_jpegs(self.backend, [rows[i] for i in jpegs], mode, device)
        except (RuntimeError, ValueError):
            return [self._decode_jpeg_one(i, rows[i], device) for i in jpegs]

    def _decode_jpeg_one(self, i: int, row: torch.Tensor, device: torch.device) -> torch.Tensor:
        try:
            return decoders.decode_jpegs(self.backend, [row], _MODES[self.mode], device)[0]
        except (RuntimeError, ValueError) as e:
            raise ImageDecodeError(self.column, i, str(e)) from e

    def _decode_one(self, i: int, row: torch.Tensor) -> torch.Tensor:
        try:
            return decoders.decode_one(self.backend, row, _MODES[self.mode])
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
            if isinstance(images, list):
                self._check_stackable(images)
            out = fit_batch(images, self.size, self.fit)
            if self.normalize and out.dtype == torch.uint8:
                return {**batch, self.column: self._scale_uint8(out)}
            if self.normalize:
                out = functional().to_dtype(out, torch.float32, scale=True)
        else:
            c = _MODE_CHANNELS.get(self.mode, 0)
            h, w = self.size if self.size is not None else (0, 0)
            out = torch.empty(
                (0, c, h, w), dtype=torch.float32 if self.normalize else torch.uint8, device=self.device or "cpu"
            )

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
                out = functional().normalize(out, mean=mean, std=std)

        return {**batch, self.column: out}

    def _scale_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """``(x / 255 - mean) / std`` as float32, of a uint8 (N, C, H, W) batch.

        On the CPU, works through the batch `_SCALE_CHUNK_BYTES` of output at a time, so that each
        chunk is shifted while it is still in the CPU cache: two whole-batch passes would stream
        the float32 batch through memory twice, memory-bound work that does not scale over the
        reader threads. On an accelerator the whole batch is one pass: chunks there only add
        kernel launches (512 of them for 256 images of 224x224, measured on an H100).
        """
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
        shift = (-mean / std).to(torch.float32).view(1, channels, 1, 1).to(images.device)
        out = torch.empty(images.shape, dtype=torch.float32, device=images.device)
        step = max(1, _SCALE_CHUNK_BYTES // (4 * images[0].numel())) if images.device.type == "cpu" else len(images)
        for start in range(0, len(images), step):
            chunk = out[start : start + step]
            torch.mul(images[start : start + step], scale, out=chunk)
            if self.mean is not None:
                chunk.add_(shift)
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
        raise ConfigError(
            "DecodeImage.device", device, "is not a device", "use None (CPU) or 'cuda' / 'cuda:N'"
        ) from None
    if parsed.type != "cuda":
        raise ConfigError("DecodeImage.device", device, "GPU decoding needs a CUDA device", "use None (CPU) or 'cuda'")
    return str(parsed)


def _check_mean_std(
    mean: Sequence[float] | None, std: Sequence[float] | None, normalize: bool, mode: str
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    if (mean is None) != (std is None):
        given, missing = ("mean", "std") if mean is not None else ("std", "mean")
        raise ConfigError(
            f"DecodeImage.{given}",
            mean if mean is not None else std,
            f"was given without {missing}",
            "pass both mean and std, or neither",
        )
    if mean is None or std is None:
        return None, None
    mean_t, std_t = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if not mean_t:
        raise ConfigError(
            "DecodeImage.mean", mean, "is empty", "pass one value per channel, or leave mean and std as None"
        )
    if len(mean_t) != len(std_t):
        raise ConfigError(
            "DecodeImage.std",
            std,
            f"has {len(std_t)} values but mean={mean!r} has {len(mean_t)}",
            "pass one value per channel in each",
        )
    if any(not s > 0 for s in std_t):
        raise ConfigError(
            "DecodeImage.std", std, "must be > 0 in every channel (a zero std would divide by zero)", "pass std > 0"
        )
    if not normalize:
        raise ConfigError(
            "DecodeImage.normalize",
            normalize,
            f"mean={mean!r}/std={std!r} need normalize=True (they apply to [0, 1] floats)",
            "set normalize=True or drop mean and std",
        )
    expected = _MODE_CHANNELS.get(mode)
    if expected is not None and len(mean_t) not in (1, expected):
        raise ConfigError(
            "DecodeImage.mean",
            mean,
            f"has {len(mean_t)} values but mode={mode!r} gives {expected} channel(s)",
            f"pass {expected} values (or 1 to share across channels)",
        )
    return mean_t, std_t
