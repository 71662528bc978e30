"""DecodeImage's batched paths, Compose and DeviceAugment, on real JPEG/PNG bytes in real Lance datasets.

Images are solid colours derived from the row id (PNG is lossless, flat JPEG is within a few
levels), so every decoded image can be checked against the id it arrived with: this catches a
reordering of rows by the reader threads, not only a wrong shape.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from torchvision.io import encode_jpeg, encode_png
from torchvision.transforms import v2

from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from lance_lightning.dataset import LanceIterableDataset
from lance_lightning.errors import ConfigError
from lance_lightning.transforms import Compose, DecodeImage, DeviceAugment, ImageDecodeError
from tests.helpers import write_dataset

BAD_BYTES = b"\xff\xd8\xff\xe0 this is not a JPEG"


def colour(i: int) -> tuple[int, int, int]:
    return (i * 37) % 256, (i * 91 + 17) % 256, (i * 13 + 200) % 256


def solid(i: int, h: int = 12, w: int = 10) -> torch.Tensor:
    return torch.tensor(colour(i), dtype=torch.uint8).view(3, 1, 1).expand(3, h, w).contiguous()


def encode(image: torch.Tensor, fmt: str) -> bytes:
    data = encode_png(image) if fmt == "png" else encode_jpeg(image, quality=95)
    return bytes(data.numpy().tobytes())


def image_blobs(rows: int, fmt: str = "mixed", bad: tuple[int, ...] = (), sizes: bool = False) -> list[bytes]:
    """Row ``i``: the solid colour of ``i`` (PNG for even rows when mixed); ``bad`` rows are garbage."""
    blobs = []
    for i in range(rows):
        kind = fmt if fmt != "mixed" else ("png" if i % 2 == 0 else "jpeg")
        h, w = (12 + i % 3, 10 + i % 5) if sizes else (12, 10)
        blobs.append(encode(solid(i, h, w), kind))
    for i in bad:
        blobs[i] = BAD_BYTES
    return blobs


def write_image_dataset(path: Path, rows: int, *, fmt: str = "mixed", bad: tuple[int, ...] = (),
                        sizes: bool = False, fragment_rows: int | None = None) -> str:
    """`tests.helpers.write_dataset` columns (id, label, x, vec) plus ``image`` (binary) and ``name``."""
    extra = {"image": pa.array(image_blobs(rows, fmt, bad, sizes), pa.binary()),
             "name": pa.array([f"row-{i}" for i in range(rows)])}
    return write_dataset(path, rows, fragment_rows=fragment_rows, extra=extra)


def assert_images_match_ids(images: torch.Tensor, ids: torch.Tensor, tolerance: int = 3) -> None:
    """Each decoded (uint8 or [0, 1] float) image is the solid colour of its row id."""
    if images.is_floating_point():
        images = (images * 255).round()
    expected = torch.stack([torch.tensor(colour(int(i)), dtype=torch.float32) for i in ids])
    got = images.float().mean(dim=(2, 3))
    assert torch.allclose(got, expected, atol=tolerance), (ids.tolist(), got[:4].tolist(), expected[:4].tolist())


# -- DecodeImage, batched paths -------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["png", "jpeg", "mixed"])
def test_decode_batch_matches_each_row(fmt: str) -> None:
    blobs = image_blobs(9, fmt)
    out = DecodeImage(normalize=False)({"image": blobs, "id": torch.arange(9)})
    assert out["image"].shape == (9, 3, 12, 10) and out["image"].dtype == torch.uint8
    assert_images_match_ids(out["image"], out["id"], tolerance=0 if fmt == "png" else 3)


def test_short_rows_and_bad_jpeg_in_the_middle_name_the_row() -> None:
    blobs = image_blobs(6, "jpeg")
    blobs[4] = b"\xff"  # shorter than the 3-byte magic
    with pytest.raises(ImageDecodeError) as info:
        DecodeImage()({"image": blobs})
    assert info.value.index == 4 and info.value.column == "image"
    blobs = image_blobs(6, "jpeg", bad=(3,))
    with pytest.raises(ImageDecodeError) as info:
        DecodeImage()({"image": blobs})
    assert info.value.index == 3


def test_non_bytes_value_names_the_row() -> None:
    blobs: list[Any] = image_blobs(3, "png")
    blobs[1] = "a string"
    with pytest.raises(ImageDecodeError, match="expected bytes, got str") as info:
        DecodeImage()({"image": blobs})
    assert info.value.index == 1


@pytest.mark.parametrize("fit", ["stretch", "crop"])
def test_mixed_sizes_resize_per_shape_group(fit: str) -> None:
    blobs = image_blobs(10, "png", sizes=True)
    out = DecodeImage(size=(6, 8), fit=fit, normalize=False)({"image": blobs, "id": torch.arange(10)})
    assert out["image"].shape == (10, 3, 6, 8)
    assert_images_match_ids(out["image"], out["id"], tolerance=1)  # solid colours survive resizing


def test_crop_keeps_aspect_and_takes_the_centre() -> None:
    # a 20x40 image: left half black, right half white; crop to 10x10 covers it at 10x20, centre = the edge
    image = torch.zeros(1, 20, 40, dtype=torch.uint8)
    image[:, :, 20:] = 255
    out = DecodeImage(size=10, fit="crop", mode="gray", normalize=False)({"image": [encode(image, "png")]})["image"]
    assert out.shape == (1, 1, 10, 10)
    assert out[0, 0, :, 0].float().mean() < 30 and out[0, 0, :, -1].float().mean() > 225
    stretched = DecodeImage(size=10, mode="gray", normalize=False)({"image": [encode(image, "png")]})["image"]
    assert stretched[0, 0, :, :4].float().mean() < 30 and stretched[0, 0, :, -4:].float().mean() > 225


def test_fit_and_device_validation() -> None:
    with pytest.raises(ValueError, match="fit='zoom'"):
        DecodeImage(fit="zoom")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device='mps'"):
        DecodeImage(device="mps")
    with pytest.raises(ValueError, match="device='nope'"):
        DecodeImage(device="nope")
    assert DecodeImage(device="cpu").device is None


# -- Compose and pass-through -----------------------------------------------------------------------
class AddOne:
    """A picklable toy transform: ``x + 1`` on one column."""

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, self.column: batch[self.column] + 1}


def test_compose_runs_in_order_and_passes_other_columns_through() -> None:
    label, vec = torch.arange(4), torch.rand(4, 8)
    batch = {"image": image_blobs(4, "png"), "label": label, "vec": vec, "name": ["a", "b", "c", "d"]}
    transform = Compose([DecodeImage(normalize=False), AddOne("label")])
    out = pickle.loads(pickle.dumps(transform))(batch)
    assert out["image"].shape == (4, 3, 12, 10)
    assert out["label"].tolist() == [1, 2, 3, 4]
    assert out["vec"] is vec and out["name"] is batch["name"]  # untouched: the very same objects
    assert label.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", ["DecodeImage", [1], None])
def test_compose_validation(bad: Any) -> None:
    with pytest.raises(ConfigError, match="transforms"):
        Compose(bad)


# -- DeviceAugment (on the CPU here; the same call runs on the GPU batch) -----------------------------
def test_device_augment_is_batch_wise_and_per_sample_optional() -> None:
    images = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    out = DeviceAugment([v2.RandomHorizontalFlip(p=1.0)])({"image": images, "id": torch.arange(2)})
    assert torch.equal(out["image"], images.flip(-1)) and out["id"].tolist() == [0, 1]
    torch.manual_seed(0)
    flips = DeviceAugment([v2.RandomHorizontalFlip(p=0.5)], per_sample=True)
    seen = set()
    for _ in range(20):
        result = flips({"image": images})["image"]
        seen.add(tuple(bool(torch.equal(r, i.flip(-1))) for r, i in zip(result, images)))
    assert (True, False) in seen or (False, True) in seen, "per-sample flips never differed within a batch"


def test_device_augment_validation() -> None:
    with pytest.raises(ConfigError, match="transforms"):
        DeviceAugment([])
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        DeviceAugment([v2.RandomHorizontalFlip()])({"image": [b"bytes"]})


# -- through the reader threads: order kept, every row decoded from its own bytes -------------------
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_threads_keep_order_and_rows(tmp_path: Path, threads: int) -> None:
    uri = write_image_dataset(tmp_path / "img.lance", 200, fragment_rows=64)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "image", "name"]), batch_size=16,
                         shuffle=RowShuffle(seed=3, clump_rows=4), transform=DecodeImage(size=8),
                         reader_threads=threads, prefetch_batches=3)
    dm.setup("fit")
    reference = LanceIterableDataset(dm.plans["train"], threads=0)
    dataset = LanceIterableDataset(dm.plans["train"], transform=dm.transform, threads=threads,
                                   prefetch_batches=3)
    want = [batch["id"].tolist() for batch in reference]
    got = list(dataset)
    assert [batch["id"].tolist() for batch in got] == want
    for batch in got:
        assert batch["image"].shape == (16, 3, 8, 8)
        assert batch["name"] == [f"row-{i}" for i in batch["id"].tolist()]
        assert_images_match_ids(batch["image"], batch["id"])
