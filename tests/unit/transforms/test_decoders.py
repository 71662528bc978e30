"""DecodeImage's decoder backends (TorchCodec, torchvision) and its device path, run on the CPU.

The device path (`DecodeImage._decode_on`) is the code ``device="cuda"`` runs: JPEG rows in one
batched decoder call, other rows decoded on the host and copied. TorchCodec's batched
``decode_jpeg`` also runs on the CPU, so the batching and the fallback that isolates a bad row are
checked here with real bytes; tests/unit/load/test_device.py runs the same on a GPU.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from PIL import Image

from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.device.transfer import host_columns
from lance_lightning.errors import ConfigError
from lance_lightning.produce.badrows import RaiseOnBadRow
from lance_lightning.produce.convert import Ragged
from lance_lightning.transforms import Compose, DecodeImage, DeviceAugment, ImageDecodeError, decoders
from tests.images import BAD_BYTES, image_blobs, jpeg, noise, png

BACKENDS = ["torchcodec", "torchvision"]


def pil_bytes(image: torch.Tensor, fmt: str, **kwargs: Any) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(out, fmt, **kwargs)
    return out.getvalue()


def png16(seed: int) -> bytes:
    values = torch.randint(0, 65536, (9, 7), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    out = io.BytesIO()
    Image.fromarray(values.numpy().astype("uint16")).save(out, "PNG")
    return out.getvalue()


def test_auto_picks_torchcodec_where_it_is_installed() -> None:
    transform = DecodeImage()
    assert transform.backend == "torchcodec" and "backend='torchcodec'" in repr(transform)


@pytest.mark.parametrize("mode", ["rgb", "gray", "unchanged"])
@pytest.mark.parametrize("kinds", ["jpeg+png", "webp+gif", "png16"])
def test_backends_decode_to_identical_images(mode: str, kinds: str) -> None:
    if kinds == "jpeg+png":
        blobs = [jpeg(noise(3, 12, 10, i)) if i % 2 else png(noise(3, 12, 10, i)) for i in range(6)]
    elif kinds == "webp+gif":
        blobs = [
            pil_bytes(noise(3, 12, 10, i), "WEBP", lossless=True) if i % 2 else pil_bytes(noise(3, 12, 10, i), "GIF")
            for i in range(4)
        ]
    else:
        blobs = [png16(i) for i in range(3)]
    if kinds == "webp+gif" and mode == "gray":  # torchvision keeps WebP in colour (it warns); TorchCodec converts
        assert DecodeImage(mode=mode, backend="torchcodec")({"image": blobs})["image"].shape[1] == 1
        return
    out = {b: DecodeImage(mode=mode, normalize=False, backend=b)({"image": blobs})["image"] for b in BACKENDS}
    assert out["torchcodec"].dtype == out["torchvision"].dtype
    assert torch.equal(out["torchcodec"], out["torchvision"])
    if kinds == "png16":
        assert out["torchcodec"].dtype == torch.uint16  # 16 bits kept, as torchvision does


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"`DecodeImage.backend`='pil'.*Fix: use one of"):
        DecodeImage(backend="pil")  # type: ignore[arg-type]


def test_without_torchcodec_auto_falls_back_and_asking_for_it_fails() -> None:
    """In an interpreter where torchcodec cannot be imported: 'torchcodec' is a ConfigError that
    says how to fix it; 'auto' warns and decodes with torchvision."""
    script = textwrap.dedent("""
        import sys, warnings
        sys.modules["torchcodec"] = None  # import torchcodec now raises ImportError
        import torch
        from lance_lightning.errors import ConfigError
        from lance_lightning.transforms import DecodeImage
        import io
        from PIL import Image
        jpeg = io.BytesIO()
        Image.new("RGB", (10, 12), (200, 30, 90)).save(jpeg, "JPEG")
        try:
            DecodeImage(backend="torchcodec")
        except ConfigError as error:
            print("ERROR", error)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            transform = DecodeImage(normalize=False)
        print("BACKEND", transform.backend)
        print("WARNED", [str(w.message) for w in seen if w.category is FutureWarning])
        print("SHAPE", tuple(transform({"image": [jpeg.getvalue()] * 3})["image"].shape))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ERROR `DecodeImage.backend`='torchcodec': TorchCodec is not installed" in out and "Fix:" in out
    assert "BACKEND torchvision" in out
    assert "WARNED ['DecodeImage: TorchCodec is not installed" in out and "deprecated" in out
    assert "SHAPE (3, 3, 12, 10)" in out


def test_formats_are_told_apart_by_their_first_bytes() -> None:
    blobs = [jpeg(noise(3, 4, 4)), png(noise(3, 4, 4)), b"\xff", b"GIF89a...", b"\xff\xd8\xffxx"]
    joined = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    bounds = [0]
    for blob in blobs:
        bounds.append(bounds[-1] + len(blob))
    assert decoders.formats(joined, bounds).tolist() == [
        decoders.JPEG,
        decoders.PNG,
        decoders.OTHER,
        decoders.OTHER,
        decoders.JPEG,
    ]


# -- the device path, on the CPU ---------------------------------------------------------------------
class CountCalls:
    """Wraps `decoders.decode_jpegs` (the real one runs) and records the size of each call."""

    def __init__(self) -> None:
        self.real = decoders.decode_jpegs
        self.sizes: list[int] = []

    def __call__(self, backend: str, rows: list[torch.Tensor], mode: int, device: torch.device) -> Any:
        self.sizes.append(len(rows))
        return self.real(backend, rows, mode, device)


def device_decode(transform: DecodeImage, blobs: list[bytes]) -> list[torch.Tensor]:
    joined, bounds = transform._joined(blobs)
    return transform._decode_on(torch.device("cpu"), joined, bounds, decoders.formats(joined, bounds))


def test_device_path_decodes_the_jpegs_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = CountCalls()
    monkeypatch.setattr(decoders, "decode_jpegs", calls)
    blobs = image_blobs(10, "mixed")  # 5 JPEGs, 5 PNGs
    transform = DecodeImage(normalize=False, backend="torchcodec")
    images = device_decode(transform, blobs)
    assert calls.sizes == [5]
    assert torch.equal(torch.stack(images), transform({"image": blobs})["image"])


@pytest.mark.parametrize("bad", [(6,), (2, 7)])
def test_device_path_names_the_bad_row_when_the_batched_call_fails(
    monkeypatch: pytest.MonkeyPatch, bad: tuple[int, ...]
) -> None:
    calls = CountCalls()
    monkeypatch.setattr(decoders, "decode_jpegs", calls)
    blobs = image_blobs(10, "jpeg", bad=bad)
    assert blobs[bad[0]] == BAD_BYTES  # JPEG magic, garbage after it: it goes to the batched call
    with pytest.raises(ImageDecodeError) as info:
        device_decode(DecodeImage(backend="torchcodec", column="photo"), blobs)
    assert info.value.index == bad[0] and info.value.column == "photo"
    # one batched call of all 10 failed, then one call per image up to the first bad row
    assert calls.sizes == [10] + [1] * (bad[0] + 1)


def test_host_columns_stay_on_the_host_through_the_transfer() -> None:
    gpu_decode = DecodeImage(device="cuda")
    assert gpu_decode.host_columns == ("image",) and DecodeImage().host_columns == ()
    assert host_columns(Compose([gpu_decode, DeviceAugment([torch.nn.Identity()])])) == ("image",)
    dm = LanceDataModule(train=LanceSource("unused.lance"), device_transform=gpu_decode, bad_rows=RaiseOnBadRow())
    assert dm.device_transfer.host_columns == ("image",)  # the rows' positions travel beside the batch, not in it
    image = Ragged(torch.arange(6, dtype=torch.uint8), torch.tensor([0, 2, 6]))
    batch = {"image": image, "x": torch.ones(2), "r": Ragged(torch.arange(3), torch.tensor([0, 1, 3]))}
    moved = dm.device_transfer(batch, torch.device("meta"))  # any device other than the host's
    assert moved["image"] is image and list(moved) == ["image", "x", "r"]
    assert moved["x"].device.type == "meta" and moved["r"].values.device.type == "meta"
