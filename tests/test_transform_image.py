"""Tests for lance_lightning.transforms.DecodeImage."""

from __future__ import annotations

import pickle

import pytest
import torch
from torchvision.io import encode_jpeg, encode_png

from lance_lightning.transforms import DecodeImage, ImageDecodeError
from lance_lightning.transforms.image import ImageDecodeError as ImageDecodeErrorDirect


def _img(c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (c, h, w), dtype=torch.uint8, generator=g)


def _png(img: torch.Tensor) -> bytes:
    return bytes(encode_png(img).numpy().tobytes())


def _jpeg(img: torch.Tensor, quality: int = 95) -> bytes:
    return bytes(encode_jpeg(img, quality=quality).numpy().tobytes())


def test_exports() -> None:
    assert ImageDecodeError is ImageDecodeErrorDirect
    assert issubclass(ImageDecodeError, ValueError)


def test_png_lossless_roundtrip_uint8() -> None:
    imgs = [_img(3, 10, 12, seed=i) for i in range(4)]
    batch = {"image": [_png(x) for x in imgs], "label": torch.arange(4), "name": ["a", "b", "c", "d"]}
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
    imgs = [_img(3, 8, 8, seed=i) for i in range(3)]
    out = DecodeImage()({"image": [_png(x) for x in imgs]})["image"]
    assert out.dtype == torch.float32
    assert out.shape == (3, 3, 8, 8)
    assert torch.allclose(out, torch.stack(imgs).float() / 255.0)


def test_jpeg_rgb_batched_path() -> None:
    imgs = [_img(3, 16, 16, seed=i) for i in range(5)]
    out = DecodeImage(normalize=False)({"image": [_jpeg(x) for x in imgs]})["image"]
    assert out.shape == (5, 3, 16, 16)
    assert out.dtype == torch.uint8


def test_mixed_png_and_jpeg() -> None:
    blobs = [_png(_img(3, 8, 8, 0)), _jpeg(_img(3, 8, 8, 1)), _png(_img(1, 8, 8, 2))]
    out = DecodeImage(mode="rgb")({"image": blobs})["image"]
    assert out.shape == (3, 3, 8, 8)


def test_gray_mode_from_rgb() -> None:
    blobs = [_png(_img(3, 8, 8, i)) for i in range(2)] + [_jpeg(_img(3, 8, 8, 9))]
    out = DecodeImage(mode="gray")({"image": blobs})["image"]
    assert out.shape == (3, 1, 8, 8)


def test_gray_mode_jpeg_only() -> None:
    blobs = [_jpeg(_img(3, 8, 8, i)) for i in range(3)]
    out = DecodeImage(mode="gray", normalize=False)({"image": blobs})["image"]
    assert out.shape == (3, 1, 8, 8)


def test_rgb_mode_from_gray() -> None:
    img = _img(1, 8, 8)
    out = DecodeImage(mode="rgb", normalize=False)({"image": [_png(img)]})["image"]
    assert out.shape == (1, 3, 8, 8)
    for c in range(3):
        assert torch.equal(out[0, c], img[0])


def test_unchanged_mode_keeps_channels() -> None:
    out = DecodeImage(mode="unchanged", normalize=False)({"image": [_png(_img(1, 5, 5))]})["image"]
    assert out.shape == (1, 1, 5, 5)


def test_unchanged_mode_mixed_channels_error() -> None:
    blobs = [_png(_img(1, 5, 5)), _png(_img(3, 5, 5))]
    with pytest.raises(ValueError, match="channel counts") as ei:
        DecodeImage(mode="unchanged")({"image": blobs})
    assert "mode='rgb'" in str(ei.value)


def test_resize_stacks_mixed_sizes() -> None:
    blobs = [_png(_img(3, 10, 20, 0)), _jpeg(_img(3, 33, 17, 1)), _png(_img(3, 8, 8, 2))]
    out = DecodeImage(size=(12, 14))({"image": blobs})["image"]
    assert out.shape == (3, 3, 12, 14)
    out = DecodeImage(size=9, normalize=False)({"image": blobs})["image"]
    assert out.shape == (3, 3, 9, 9)
    assert out.dtype == torch.uint8


def test_different_sizes_without_size_errors() -> None:
    blobs = [_png(_img(3, 8, 8)), _png(_img(3, 9, 8))]
    with pytest.raises(ValueError) as ei:
        DecodeImage(column="pix")({"pix": blobs})
    msg = str(ei.value)
    assert "'pix'" in msg
    assert "(3, 8, 8)" in msg and "(3, 9, 8)" in msg
    assert "size" in msg
    assert not isinstance(ei.value, ImageDecodeError)


def test_normalize_with_mean_std() -> None:
    img = _img(3, 6, 6)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    out = DecodeImage(mean=mean, std=std)({"image": [_png(img)]})["image"]
    expected = (img.float() / 255.0 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    assert torch.allclose(out[0], expected, atol=1e-6)


def test_normalize_single_value_broadcast_gray() -> None:
    img = _img(1, 4, 4)
    out = DecodeImage(mode="gray", mean=(0.5,), std=(0.5,))({"image": [_png(img)]})["image"]
    assert torch.allclose(out[0], img.float() / 255.0 * 2 - 1, atol=1e-6)
    assert out.min() >= -1 and out.max() <= 1


def test_custom_column_only_that_key_replaced() -> None:
    batch = {"a": [_png(_img(3, 4, 4))], "b": [b"not-an-image"]}
    out = DecodeImage(column="a")(batch)
    assert out["a"].shape == (1, 3, 4, 4)
    assert out["b"] == [b"not-an-image"]


def test_accepts_bytearray_and_memoryview() -> None:
    raw = _png(_img(3, 4, 4))
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
def test_corrupt_bytes_raise_image_decode_error(bad: bytes | None, others: str) -> None:
    enc = _png if others == "png" else _jpeg
    blobs = [enc(_img(3, 8, 8, i)) for i in range(4)]
    blobs[2] = bad
    with pytest.raises(ImageDecodeError) as ei:
        DecodeImage(column="photo")({"photo": blobs})
    err = ei.value
    assert err.column == "photo"
    assert err.index == 2
    assert "'photo'" in str(err) and "row 2" in str(err)
    assert isinstance(err, ValueError)


def test_truncated_jpeg_raises() -> None:
    good = _jpeg(_img(3, 32, 32))
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
    blobs = [_png(_img(1, 8, 8))]
    assert torch.equal(t({"image": blobs})["image"], t2({"image": blobs})["image"])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mean": (0.5, 0.5, 0.5)}, "std"),
        ({"std": (0.5, 0.5, 0.5)}, "mean"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5)}, "std="),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.0, 0.5)}, "std="),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, -1.0, 0.5)}, "> 0"),
        ({"mean": (), "std": ()}, "mean="),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "normalize": False}, "normalize=True"),
        ({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "mode": "gray"}, "mode='gray'"),
        ({"size": 0}, "size=0"),
        ({"size": -3}, "size=-3"),
        ({"size": (8, 0)}, "size=(8, 0)"),
        ({"size": (8, 8, 8)}, "size="),
        ({"size": (8.5, 8)}, "size="),
        ({"size": True}, "size="),
        ({"mode": "bgr"}, "mode='bgr'"),
        ({"column": ""}, "column="),
    ],
)
def test_init_validation(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError) as ei:
        DecodeImage(**kwargs)
    assert needle in str(ei.value)


def test_unchanged_mode_mean_std_channel_mismatch_at_call() -> None:
    t = DecodeImage(mode="unchanged", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="1 channel"):
        t({"image": [_png(_img(1, 4, 4))]})
