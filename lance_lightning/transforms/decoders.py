"""Image decoder backends behind `DecodeImage`: TorchCodec, or torchvision as the fallback.

Guarantees:
- `resolve_backend` turns ``"auto" | "torchcodec" | "torchvision"`` into the backend that will
  decode: ``"auto"`` is TorchCodec when ``torchcodec`` imports, else torchvision (with a
  `FutureWarning` saying why, since torchvision's decoders are deprecated since 0.29). Asking for
  a backend that is not installed, or an unknown name, is a `ConfigError` naming the fix.
- Both backends give the same images for the same bytes (both wrap libjpeg-turbo, libpng,
  libwebp and giflib): uint8 (C, H, W), uint16 for 16-bit PNGs.
- `decode_rows` decodes rows ``data[bounds[i]:bounds[i + 1]]`` on the CPU in one compiled loop
  that holds no GIL (rows of other formats than JPEG/PNG go through the backend's Python call).
  Any undecodable row makes it raise ``RuntimeError``/``ValueError``; the caller then decodes
  row by row (`decode_one`) to name the row.
- `decode_jpegs` decodes a list of JPEGs (host tensors) on a device in one batched call (nvJPEG
  on CUDA; both backends take the encoded bytes on the host).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from lance_lightning.errors import ConfigError
from lance_lightning.transforms import vision

BACKENDS = ("auto", "torchcodec", "torchvision")
#: Formats told apart by their first bytes; everything else is "other".
JPEG, PNG, OTHER = 0, 1, 2
_MAGIC = {JPEG: b"\xff\xd8\xff", PNG: b"\x89PNG"}


def resolve_backend(backend: str) -> str:
    """The backend that decodes for ``backend`` (see the module docstring)."""
    if backend not in BACKENDS:
        raise ConfigError(
            "DecodeImage.backend",
            backend,
            "is not a decoder backend",
            f"use one of {list(BACKENDS)} ('auto' picks TorchCodec when it is installed)",
        )
    if backend == "torchvision":
        return backend
    if _torchcodec() is not None:
        return "torchcodec"
    if backend == "torchcodec":
        raise ConfigError(
            "DecodeImage.backend",
            backend,
            "TorchCodec is not installed (or does not import here)",
            "install it (`pip install torchcodec`, a dependency of lance-lightning), or set "
            "backend='auto' or 'torchvision'",
        )
    warnings.warn(
        "DecodeImage: TorchCodec is not installed, so images are decoded by torchvision, whose "
        "decoders are deprecated since torchvision 0.29; install torchcodec to use it",
        FutureWarning,
        stacklevel=3,
    )
    return "torchvision"


def _torchcodec() -> Any:
    """``torchcodec.decoders`` (which registers the ``torchcodec_ns`` ops), or None."""
    try:
        import torchcodec.decoders
    except (ImportError, OSError, RuntimeError):  # not installed, or its libraries do not load
        return None
    return torchcodec.decoders


def formats(data: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Each row's format (`JPEG`, `PNG` or `OTHER`), from its first bytes: one vectorised check."""
    starts = torch.tensor(bounds[:-1], dtype=torch.int64)
    lengths = torch.tensor(bounds[1:], dtype=torch.int64) - starts
    out = torch.full((len(starts),), OTHER, dtype=torch.int64)
    if not len(starts):
        return out
    for code in (JPEG, PNG):
        magic = torch.tensor(list(_MAGIC[code]), dtype=torch.uint8)
        last = (starts + lengths - 1).clamp(min=0)[:, None]
        head = data[torch.minimum(starts[:, None] + torch.arange(len(magic)), last)]
        out[(lengths >= len(magic)) & (head == magic).all(1)] = code
    return out


def _stack_or_list(images: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for image in images:
        if image.shape != images[0].shape or image.dtype != images[0].dtype:
            return torch.empty(0), images
    return torch.stack(images), images[:0]


def _torchvision_rows(
    data: torch.Tensor, bounds: list[int], kinds: list[int], mode: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    images = [
        torch.ops.image.decode_image(data[bounds[i] : bounds[i + 1]], mode, False) for i in range(len(bounds) - 1)
    ]
    return _stack_or_list(images)


def _torchcodec_rows(
    data: torch.Tensor, bounds: list[int], kinds: list[int], mode: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    images: list[torch.Tensor] = []
    for i in range(len(bounds) - 1):
        row = data[bounds[i] : bounds[i + 1]]
        if kinds[i] == 0:
            images.append(torch.ops.torchcodec_ns.decode_jpeg(row, mode))
        else:  # 16-bit PNGs keep 16 bits ("auto", code 2), as torchvision does
            images.append(torch.ops.torchcodec_ns.decode_png(row, mode, 2))
    return _stack_or_list(images)


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by TorchScript, so that its loop runs without the GIL; ``fn`` where that fails.

    A Python loop takes the GIL back after every image and makes a Python object of each; with
    small images the reader threads then queue for the GIL and the garbage collector. Measured
    on 64x64 JPEGs (2 cores): two threads decode 1.6-1.9x as fast as one with a Python loop,
    1.9-2.0x with the compiled one.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated, still supported
            return torch.jit.script(fn)
    except Exception:  # noqa: BLE001 - any failure to compile leaves the plain loop, which is correct
        return fn


_COMPILED: dict[str, Callable[..., Any]] = {}


def compiled_loop(backend: str) -> Callable[..., Any]:
    """The compiled CPU loop of ``backend`` (compiled once per process, on first use)."""
    loop = _COMPILED.get(backend)
    if loop is None:
        if backend == "torchcodec":
            _torchcodec()  # registers torch.ops.torchcodec_ns before compiling
        else:
            vision.image_ops()  # registers torch.ops.image before compiling
        loop = _compiled(_torchcodec_rows if backend == "torchcodec" else _torchvision_rows)
        _COMPILED[backend] = loop
    return loop


def decode_rows(
    backend: str, data: torch.Tensor, bounds: list[int], kinds: torch.Tensor, mode: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Rows ``data[bounds[i]:bounds[i + 1]]`` decoded on the CPU: ``(stacked, [])`` when they
    share a shape and dtype (one (N, C, H, W) tensor), else ``(empty, images)``."""
    if backend == "torchcodec" and bool((kinds == OTHER).any()):
        # WebP, GIF: the format-sniffing Python call (rare in training sets)
        return _stack_or_list(
            [decode_one(backend, data[bounds[i] : bounds[i + 1]], mode) for i in range(len(bounds) - 1)]
        )
    return compiled_loop(backend)(data, bounds, kinds.tolist(), mode)


def decode_one(backend: str, row: torch.Tensor, mode: int) -> torch.Tensor:
    """One image on the CPU; raises ``RuntimeError``/``ValueError`` when its bytes do not decode."""
    if backend == "torchcodec":
        return _torchcodec().decode_image(row, mode=_torchcodec().ImageReadMode(mode), output_dtype="auto")
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(row, mode=ImageReadMode(mode))


def decode_jpegs(backend: str, rows: list[torch.Tensor], mode: int, device: torch.device) -> list[torch.Tensor]:
    """JPEGs (host uint8 tensors) decoded on ``device`` in one call of the backend's batched decoder."""
    if backend == "torchcodec":
        return _torchcodec().decode_jpeg(rows, mode=_torchcodec().ImageReadMode(mode), device=device)
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(rows, mode=ImageReadMode(mode), device=device)
