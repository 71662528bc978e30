"""Image test data shared by the test modules: encoded solid-colour and noise images, an image
dataset whose row ``i`` shows colour ``i``, and the check that decoded images match their ids."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from tests.helpers import encode_image, write_dataset

BAD_BYTES = b"\xff\xd8\xff\xe0 this is not a JPEG"


def colour(i: int) -> tuple[int, int, int]:
    return (i * 37) % 256, (i * 91 + 17) % 256, (i * 13 + 200) % 256


def solid(i: int, h: int = 12, w: int = 10) -> torch.Tensor:
    return torch.tensor(colour(i), dtype=torch.uint8).view(3, 1, 1).expand(3, h, w).contiguous()


def image_blobs(rows: int, fmt: str = "mixed", bad: tuple[int, ...] = (), sizes: bool = False) -> list[bytes]:
    """Row ``i``: the solid colour of ``i`` (PNG for even rows when mixed); ``bad`` rows are garbage."""
    blobs = []
    for i in range(rows):
        kind = fmt if fmt != "mixed" else ("png" if i % 2 == 0 else "jpeg")
        h, w = (12 + i % 3, 10 + i % 5) if sizes else (12, 10)
        blobs.append(encode_image(solid(i, h, w), kind))
    for i in bad:
        blobs[i] = BAD_BYTES
    return blobs


def write_image_dataset(
    path: Path,
    rows: int,
    *,
    fmt: str = "mixed",
    bad: tuple[int, ...] = (),
    sizes: bool = False,
    fragment_rows: int | None = None,
) -> str:
    """`tests.helpers.write_dataset` columns (id, label, x, vec) plus ``image`` (binary) and ``name``."""
    extra = {
        "image": pa.array(image_blobs(rows, fmt, bad, sizes), pa.binary()),
        "name": pa.array([f"row-{i}" for i in range(rows)]),
    }
    return write_dataset(path, rows, fragment_rows=fragment_rows, extra=extra)


def assert_images_match_ids(images: torch.Tensor, ids: torch.Tensor, tolerance: int = 3) -> None:
    """Each decoded (uint8 or [0, 1] float) image is the solid colour of its row id."""
    if images.is_floating_point():
        images = (images * 255).round()
    expected = torch.stack([torch.tensor(colour(int(i)), dtype=torch.float32) for i in ids])
    got = images.float().mean(dim=(2, 3))
    assert torch.allclose(got, expected, atol=tolerance), (ids.tolist(), got[:4].tolist(), expected[:4].tolist())


def noise(c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (c, h, w), dtype=torch.uint8, generator=g)


def png(image: torch.Tensor) -> bytes:
    return encode_image(image, "png")


def jpeg(image: torch.Tensor) -> bytes:
    return encode_image(image, "jpeg")
