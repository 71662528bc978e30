"""DecodeImage, Compose and DeviceAugment, on real JPEG/PNG bytes (and in real Lance datasets).

Batched paths use solid colours derived from the row id (PNG is lossless, flat JPEG is within a
few levels), so every decoded image can be checked against the id it arrived with: this catches a
reordering of rows by the reader threads, not only a wrong shape. Single-batch checks (modes,
sizes, normalisation, errors, pickling) use random-noise images, exact through PNG.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from torchvision.transforms import v2

from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from lance_lightning.errors import ConfigError
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.produce.convert import Ragged, to_torch_batch
from lance_lightning.transforms import Compose, DecodeImage, DeviceAugment, ImageDecodeError, decoders
from lance_lightning.transforms.image import ImageDecodeError as ImageDecodeErrorDirect
from tests.helpers import encode_image
from tests.images import assert_images_match_ids, image_blobs, jpeg, noise, png, write_image_dataset


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


def test_converted_binary_column_decodes_like_bytes_and_names_an_empty_row() -> None:
    """The loader's form of a binary column (a uint8 `Ragged` over the Arrow buffer) decodes
    exactly like the list of bytes; an empty row is named by its index."""
    blobs = image_blobs(5, "mixed")
    column = to_torch_batch(pa.table({"image": pa.array(blobs, pa.binary())}))["image"]
    assert isinstance(column, Ragged)
    assert torch.equal(
        DecodeImage(normalize=False)({"image": column})["image"],
        DecodeImage(normalize=False)({"image": blobs})["image"],
    )
    blobs[2] = b""
    with pytest.raises(ImageDecodeError, match="empty") as info:
        DecodeImage()({"image": to_torch_batch(pa.table({"image": pa.array(blobs)}))["image"]})
    assert info.value.index == 2


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
    out = DecodeImage(size=10, fit="crop", mode="gray", normalize=False)({"image": [encode_image(image, "png")]})[
        "image"
    ]
    assert out.shape == (1, 1, 10, 10)
    assert out[0, 0, :, 0].float().mean() < 30 and out[0, 0, :, -1].float().mean() > 225
    stretched = DecodeImage(size=10, mode="gray", normalize=False)({"image": [encode_image(image, "png")]})["image"]
    assert stretched[0, 0, :, :4].float().mean() < 30 and stretched[0, 0, :, -4:].float().mean() > 225


def test_fit_and_device_validation() -> None:
    with pytest.raises(ConfigError, match="`DecodeImage.fit`='zoom'"):
        DecodeImage(fit="zoom")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`DecodeImage.device`='mps'"):
        DecodeImage(device="mps")
    with pytest.raises(ConfigError, match="`DecodeImage.device`='nope'"):
        DecodeImage(device="nope")
    assert DecodeImage(device="cpu").device is None


# -- DecodeImage on single batches: modes, sizes, normalisation, errors, pickling -----------------
def test_exports() -> None:
    assert ImageDecodeError is ImageDecodeErrorDirect
    assert issubclass(ImageDecodeError, ValueError)


def test_png_lossless_roundtrip_uint8() -> None:
    imgs = [noise(3, 10, 12, seed=i) for i in range(4)]
    batch = {"image": [png(x) for x in imgs], "label": torch.arange(4), "name": ["a", "b", "c", "d"]}
    out = DecodeImage(normalize=False)(batch)
    assert out["image"].dtype == torch.uint8
    assert out["image"].shape == (4, 3, 10, 12)
    assert torch.equal(out["image"], torch.stack(imgs))
    # other keys untouched (same objects), input dict not mutated
    assert out["label"] is batch["label"]
    assert out["name"] is batch["name"]
    assert isinstance(batch["image"], list)
    assert set(out) == set(batch)


def test_png_normalize_float_range() -> None:
    imgs = [noise(3, 8, 8, seed=i) for i in range(3)]
    out = DecodeImage()({"image": [png(x) for x in imgs]})["image"]
    assert out.dtype == torch.float32
    assert out.shape == (3, 3, 8, 8)
    assert torch.allclose(out, torch.stack(imgs).float() / 255.0)


def test_mixed_png_and_jpeg() -> None:
    blobs = [png(noise(3, 8, 8, 0)), jpeg(noise(3, 8, 8, 1)), png(noise(1, 8, 8, 2))]
    out = DecodeImage(mode="rgb")({"image": blobs})["image"]
    assert out.shape == (3, 3, 8, 8)


def test_gray_mode_from_rgb() -> None:
    blobs = [png(noise(3, 8, 8, i)) for i in range(2)] + [jpeg(noise(3, 8, 8, 9))]
    out = DecodeImage(mode="gray")({"image": blobs})["image"]
    assert out.shape == (3, 1, 8, 8)


def test_gray_mode_jpeg_only() -> None:
    blobs = [jpeg(noise(3, 8, 8, i)) for i in range(3)]
    out = DecodeImage(mode="gray", normalize=False)({"image": blobs})["image"]
    assert out.shape == (3, 1, 8, 8)


def test_rgb_mode_from_gray() -> None:
    img = noise(1, 8, 8)
    out = DecodeImage(mode="rgb", normalize=False)({"image": [png(img)]})["image"]
    assert out.shape == (1, 3, 8, 8)
    for c in range(3):
        assert torch.equal(out[0, c], img[0])


def test_unchanged_mode_keeps_channels() -> None:
    out = DecodeImage(mode="unchanged", normalize=False)({"image": [png(noise(1, 5, 5))]})["image"]
    assert out.shape == (1, 1, 5, 5)


def test_unchanged_mode_mixed_channels_error() -> None:
    blobs = [png(noise(1, 5, 5)), png(noise(3, 5, 5))]
    with pytest.raises(ValueError, match="channel counts") as ei:
        DecodeImage(mode="unchanged")({"image": blobs})
    assert "mode='rgb'" in str(ei.value)


def test_resize_stacks_mixed_sizes() -> None:
    blobs = [png(noise(3, 10, 20, 0)), jpeg(noise(3, 33, 17, 1)), png(noise(3, 8, 8, 2))]
    out = DecodeImage(size=(12, 14))({"image": blobs})["image"]
    assert out.shape == (3, 3, 12, 14)
    out = DecodeImage(size=9, normalize=False)({"image": blobs})["image"]
    assert out.shape == (3, 3, 9, 9)
    assert out.dtype == torch.uint8


def test_different_sizes_without_size_errors() -> None:
    blobs = [png(noise(3, 8, 8)), png(noise(3, 9, 8))]
    with pytest.raises(ValueError) as ei:
        DecodeImage(column="pix")({"pix": blobs})
    msg = str(ei.value)
    assert "'pix'" in msg
    assert "(3, 8, 8)" in msg and "(3, 9, 8)" in msg
    assert "size" in msg
    assert not isinstance(ei.value, ImageDecodeError)


def test_normalize_with_mean_std() -> None:
    img = noise(3, 6, 6)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    out = DecodeImage(mean=mean, std=std)({"image": [png(img)]})["image"]
    expected = (img.float() / 255.0 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    assert torch.allclose(out[0], expected, atol=1e-6)


@pytest.mark.parametrize("size", [None, (40, 24)])
def test_normalize_spans_several_chunks(size: tuple[int, int] | None) -> None:
    # 50 images of 3x64x64 float32 = 2.4 MB: normalised in 1 MB chunks, so chunk edges are covered
    images = [noise(3, 64, 64, seed=i) for i in range(50)]
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = DecodeImage(size=size, mean=mean, std=std)({"image": [png(x) for x in images]})["image"]
    stacked = torch.stack(images)
    if size is not None:
        stacked = v2.functional.resize(stacked, list(size), antialias=True)
    expected = (stacked.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert out.shape == (50, 3, *(size or (64, 64))) and out.dtype == torch.float32 and out.is_contiguous()
    assert torch.allclose(out, expected, atol=1e-5)


def test_normalize_single_value_broadcast_gray() -> None:
    img = noise(1, 4, 4)
    out = DecodeImage(mode="gray", mean=(0.5,), std=(0.5,))({"image": [png(img)]})["image"]
    assert torch.allclose(out[0], img.float() / 255.0 * 2 - 1, atol=1e-6)
    assert out.min() >= -1 and out.max() <= 1


def test_custom_column_only_that_key_replaced() -> None:
    batch = {"a": [png(noise(3, 4, 4))], "b": [b"not-an-image"]}
    out = DecodeImage(column="a")(batch)
    assert out["a"].shape == (1, 3, 4, 4)
    assert out["b"] == [b"not-an-image"]


def test_accepts_bytearray_and_memoryview() -> None:
    raw = png(noise(3, 4, 4))
    out = DecodeImage()({"image": [bytearray(raw), memoryview(raw)]})["image"]
    assert out.shape == (2, 3, 4, 4)


@pytest.mark.parametrize(
    "bad",
    [
        b"definitely not an image",
        b"\xff\xd8\xff\xe0garbage-after-jpeg-magic",
        b"\x89PNG\r\n\x1a\n-truncated",
        b"",
        None,
    ],
)
@pytest.mark.parametrize("others", ["png", "jpeg"])
@pytest.mark.parametrize("backend", ["torchcodec", "torchvision"])
def test_corrupt_bytes_raise_image_decode_error(bad: bytes | None, others: str, backend: str) -> None:
    enc = png if others == "png" else jpeg
    blobs = [enc(noise(3, 8, 8, i)) for i in range(4)]
    blobs[2] = bad
    with pytest.raises(ImageDecodeError) as ei:
        DecodeImage(column="photo", backend=backend)({"photo": blobs})
    err = ei.value
    assert err.column == "photo"
    assert err.index == 2
    assert "'photo'" in str(err) and "row 2" in str(err)
    assert isinstance(err, ValueError)


def test_truncated_jpeg_raises() -> None:
    good = jpeg(noise(3, 32, 32))
    blobs = [good, good[: len(good) // 3]]
    with pytest.raises(ImageDecodeError) as ei:
        DecodeImage()({"image": blobs})
    assert ei.value.index == 1


def test_image_decode_error_pickles() -> None:
    err = ImageDecodeError("image", 3, "boom")
    back = pickle.loads(pickle.dumps(err))
    assert (back.column, back.index, str(back)) == ("image", 3, str(err))


def test_missing_column_errors() -> None:
    with pytest.raises(ValueError, match="'image'.*not in the batch"):
        DecodeImage()({"label": torch.arange(2)})


def test_already_tensor_errors() -> None:
    with pytest.raises(ValueError, match="already a tensor"):
        DecodeImage()({"image": torch.zeros(2, 3, 4, 4)})


def test_empty_batch() -> None:
    out = DecodeImage(size=8, mode="gray")({"image": []})["image"]
    assert out.shape == (0, 1, 8, 8)
    assert out.dtype == torch.float32


def test_transform_is_picklable() -> None:
    t = DecodeImage(size=(4, 5), mode="gray", mean=(0.1,), std=(0.2,))
    t2 = pickle.loads(pickle.dumps(t))
    assert repr(t2) == repr(t)
    blobs = [png(noise(1, 8, 8))]
    assert torch.equal(t({"image": blobs})["image"], t2({"image": blobs})["image"])


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"mean": (0.5, 0.5, 0.5)}, "DecodeImage.mean"),
        ({"std": (0.5, 0.5, 0.5)}, "DecodeImage.std"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5)}, "DecodeImage.std"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.0, 0.5)}, "DecodeImage.std"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, -1.0, 0.5)}, "DecodeImage.std"),
        ({"mean": (), "std": ()}, "DecodeImage.mean"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "normalize": False}, "DecodeImage.normalize"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "mode": "gray"}, "DecodeImage.mean"),
        ({"size": 0}, "DecodeImage.size"),
        ({"size": -3}, "DecodeImage.size"),
        ({"size": (8, 0)}, "DecodeImage.size"),
        ({"size": (8, 8, 8)}, "DecodeImage.size"),
        ({"size": (8.5, 8)}, "DecodeImage.size"),
        ({"size": True}, "DecodeImage.size"),
        ({"mode": "bgr"}, "DecodeImage.mode"),
        ({"column": ""}, "DecodeImage.column"),
    ],
)
def test_init_validation_names_the_parameter_and_its_value(kwargs: dict, param: str) -> None:
    with pytest.raises(ConfigError) as ei:
        DecodeImage(**kwargs)
    assert ei.value.param == param
    assert ei.value.value == kwargs[param.split(".")[1]]
    assert f"`{param}`=" in str(ei.value) and "Fix:" in str(ei.value)


def test_unchanged_mode_mean_std_channel_mismatch_at_call() -> None:
    t = DecodeImage(mode="unchanged", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="1 channel"):
        t({"image": [png(noise(1, 4, 4))]})


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
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "image", "name"]),
        batch_size=16,
        shuffle=RowShuffle(seed=3, clump_rows=4),
        transform=DecodeImage(size=8),
        reader_threads=threads,
        prefetch_batches=3,
    )
    dm.setup("fit")
    reference = LanceIterableDataset(dm.plans["train"], reader_threads=0)
    dataset = LanceIterableDataset(
        dm.plans["train"], transform=dm.transform, reader_threads=threads, prefetch_batches=3
    )
    want = [batch["id"].tolist() for batch in reference]
    got = list(dataset)
    assert [batch["id"].tolist() for batch in got] == want
    for batch in got:
        assert batch["image"].shape == (16, 3, 8, 8)
        assert batch["name"] == [f"row-{i}" for i in batch["id"].tolist()]
        assert_images_match_ids(batch["image"], batch["id"])


class RecordPolicy:
    """A transform that notes the scheduling policy of the thread it runs on."""

    def __init__(self) -> None:
        self.policies: set[int] = set()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.policies.add(os.sched_getscheduler(0))
        return batch


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
def test_reader_threads_run_at_batch_priority_and_the_loop_does_not(tmp_path: Path) -> None:
    # SCHED_BATCH threads never preempt the training loop's thread when they wake for new work.
    uri = write_image_dataset(tmp_path / "img.lance", 64)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "image"]), batch_size=8, transform=DecodeImage())
    dm.setup("fit")
    record = RecordPolicy()
    assert len(list(LanceIterableDataset(dm.plans["train"], transform=record, reader_threads=2))) == 8
    assert record.policies == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.parametrize("backend", ["torchcodec", "torchvision"])
def test_cpu_decoding_is_compiled(backend: str) -> None:
    # The compiled loop releases the GIL once per batch; a silent fallback to the Python loop
    # would halve decode scaling over the reader threads without failing anything else.
    assert isinstance(decoders.compiled_loop(backend), torch.jit.ScriptFunction)
