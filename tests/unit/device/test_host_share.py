"""`DecodeImage(cpu_share=...)`: the first rows of a device decode decoded on CPU threads meanwhile.

The device path (`DecodeImage._decode_on`) runs here with ``torch.device("cpu")`` as the device, so
the split (which rows go where, their order, errors, pickling) is checked on the CPU;
tests/unit/device/test_transfer.py runs it on a GPU.
"""

from __future__ import annotations

import copy
import pickle
import threading
from typing import Any

import pytest
import torch

from lance_lightning.errors import ConfigError
from lance_lightning.transforms import DecodeImage, ImageDecodeError, decoders
from lance_lightning.transforms.host_share import HostShare
from tests.images import assert_images_match_ids, image_blobs

CPU = torch.device("cpu")


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
    return transform._decode_on(CPU, joined, bounds, decoders.formats(joined, bounds))


@pytest.mark.parametrize("share, on_host", [(0.0, 0), (0.25, 5), (0.5, 10), (1.0, 20)])
@pytest.mark.parametrize("fmt", ["jpeg", "mixed"])
def test_the_first_rows_go_to_the_cpu_and_the_batch_keeps_its_order(
    monkeypatch: pytest.MonkeyPatch, share: float, on_host: int, fmt: str
) -> None:
    calls = CountCalls()
    monkeypatch.setattr(decoders, "decode_jpegs", calls)
    blobs = image_blobs(20, fmt)
    transform = DecodeImage(normalize=False, backend="torchvision", cpu_share=share, cpu_threads=3)
    images = device_decode(transform, blobs)
    jpegs_on_device = sum(1 for i in range(on_host, 20) if fmt == "jpeg" or i % 2 == 1)
    assert calls.sizes == ([jpegs_on_device] if jpegs_on_device else [])
    assert_images_match_ids(torch.stack(images), torch.arange(20))
    assert torch.equal(
        torch.stack(images), DecodeImage(normalize=False, backend="torchvision")({"image": blobs})["image"]
    )


def test_a_split_batch_is_resized_and_normalised_as_one() -> None:
    blobs = image_blobs(16, "jpeg", sizes=True)
    whole = DecodeImage(size=8, backend="torchvision")({"image": blobs})["image"]
    split = DecodeImage(size=8, backend="torchvision", cpu_share=0.5)
    joined, bounds = split._joined(blobs)
    images = split._decode_on(CPU, joined, bounds, decoders.formats(joined, bounds))
    from lance_lightning.transforms.sizes import fit_batch

    assert torch.allclose(split._scale_uint8(fit_batch(images, (8, 8), "stretch")), whole)


@pytest.mark.parametrize("bad, named", [((3,), 3), ((15,), 15), ((3, 15), 3), ((12, 15), 12)])
def test_a_bad_row_is_named_the_lowest_first_on_either_side(bad: tuple[int, ...], named: int) -> None:
    blobs = image_blobs(20, "jpeg", bad=bad)
    with pytest.raises(ImageDecodeError) as info:
        device_decode(DecodeImage(backend="torchvision", column="photo", cpu_share=0.5, cpu_threads=2), blobs)
    assert info.value.index == named and info.value.column == "photo"


def test_the_host_threads_are_reused_and_named() -> None:
    transform = DecodeImage(normalize=False, backend="torchvision", cpu_share=1.0, cpu_threads=2)
    seen: list[threading.Thread] = []
    real = transform._decode_host_rows

    def noting(*args: Any) -> Any:
        seen.append(threading.current_thread())
        return real(*args)

    transform._decode_host_rows = noting  # type: ignore[method-assign]
    for _ in range(3):
        device_decode(transform, image_blobs(8, "jpeg"))
    assert len(seen) == 6  # two chunks per batch
    assert 1 <= len(set(seen)) <= 2 and all(t.name.startswith("lance-decode-host") for t in seen)
    transform.host_share.close()
    assert not any(t.is_alive() for t in seen)


def test_a_copy_or_pickle_travels_without_the_pool() -> None:
    transform = DecodeImage(backend="torchvision", cpu_share=0.5, cpu_threads=2, device="cuda")
    device_decode(transform, image_blobs(8, "jpeg"))  # starts the pool
    for other in (pickle.loads(pickle.dumps(transform)), copy.deepcopy(transform)):
        assert other.cpu_share == 0.5 and other.cpu_threads == 2 and other.host_share._pool is None
        assert "cpu_share=0.5" in repr(other)
    assert "cpu_share" not in repr(DecodeImage(device="cuda", backend="torchvision"))
    transform.host_share.close()


@pytest.mark.parametrize("share", [-0.1, 1.5, "half", True])
def test_a_share_outside_zero_to_one_is_refused(share: Any) -> None:
    with pytest.raises(ConfigError, match="cpu_share"):
        DecodeImage(device="cuda", cpu_share=share)
    with pytest.raises(ConfigError, match="cpu_threads"):
        DecodeImage(device="cuda", cpu_share=0.5, cpu_threads=0)


def test_rows_rounds_the_share_of_a_batch() -> None:
    assert [HostShare(0.3).rows(n) for n in (0, 1, 10, 256)] == [0, 0, 3, 77]
    assert HostShare(1.0).rows(5) == 5 and HostShare(0.0).rows(5) == 0
