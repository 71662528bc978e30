"""The device stage: batch transfer and ``device_transform`` in a real Trainer; CUDA paths on a GPU.

On CPU the hooks run the same code with ``torch.device("cpu")``; the CUDA tests (pinned memory,
the side copy stream, nvJPEG decoding) run when a CUDA device exists and skip otherwise.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pyarrow as pa
import pytest
import torch
from torchvision.transforms import v2

from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.device.transfer import DeviceTransfer, move
from lance_lightning.produce.convert import Ragged, to_torch_batch
from lance_lightning.produce.producer import pin_batch
from lance_lightning.transforms import Compose, DecodeImage, DeviceAugment, ImageDecodeError
from tests.helpers import DECODER_BACKENDS, RecordingModel
from tests.images import assert_images_match_ids, image_blobs, write_image_dataset

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class ImageModel(RecordingModel):
    """Records what ``training_step`` receives: image tensors, name lists and devices."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[torch.Tensor] = []
        self.names: list[Any] = []
        self.devices: list[torch.device] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.images.append(batch["image"].cpu())
        self.names.append(batch["name"])
        self.devices.append(batch["image"].device)
        return super().training_step(batch, batch_idx)


class ModelWithHooks(ImageModel):
    """Also overrides both transfer hooks: they must still run next to the data module's."""

    def __init__(self) -> None:
        super().__init__()
        self.after_calls = 0
        self.transfer_calls = 0

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.transfer_calls += 1
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.after_calls += 1
        return {**batch, "x": batch["x"] * 0 + 1}


def _fit(tmp_path: Path, dm: LanceDataModule, model: pl.LightningModule, accelerator: str = "cpu") -> None:
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*overridden.*both.*")
        trainer.fit(model, datamodule=dm)


def _dm(uri: str, **kwargs: Any) -> LanceDataModule:
    return LanceDataModule(train=LanceSource(uri, columns=["id", "x", "image", "name"]), batch_size=16, **kwargs)


def test_device_transform_runs_after_transfer_and_lists_stay_lists(tmp_path: Path) -> None:
    uri = write_image_dataset(tmp_path / "img.lance", 64)
    dm = _dm(
        uri,
        transform=DecodeImage(normalize=False),
        device_transform=DeviceAugment([v2.RandomHorizontalFlip(p=1.0), v2.ToDtype(torch.float32, scale=True)]),
    )
    model = ImageModel()
    _fit(tmp_path, dm, model)
    assert len(model.images) == 4
    for ids, images, names in zip(model.seen, model.images, model.names):
        assert images.dtype == torch.float32 and images.shape == (16, 3, 12, 10)
        assert_images_match_ids(images, torch.tensor(ids))
        assert names == [f"row-{i}" for i in ids]  # a str column stays a list on the host
    assert dm.transfer_batch_to_device({"t": torch.ones(2), "s": ["a", "b"]}, torch.device("cpu"), 0)["s"] == ["a", "b"]


def test_model_hooks_still_run_next_to_the_data_modules(tmp_path: Path) -> None:
    uri = write_image_dataset(tmp_path / "img.lance", 64)
    flip = DeviceAugment([v2.RandomHorizontalFlip(p=1.0)])
    model = ModelWithHooks()
    _fit(tmp_path, _dm(uri, transform=DecodeImage(), device_transform=flip), model)
    assert model.transfer_calls == 4 and model.after_calls == 4
    plain = ModelWithHooks()
    _fit(tmp_path, _dm(uri, transform=DecodeImage()), plain)
    for flipped, original in zip(model.images, plain.images):
        assert torch.equal(flipped, original.flip(-1))  # ours ran, then the model's


def test_move_and_pin_on_this_machine() -> None:
    ragged = Ragged(torch.arange(5), torch.tensor([0, 2, 5]))
    batch = {
        "a": torch.ones(3),
        "r": ragged,
        "s": ["x"],
        "b": [b"y"],
        "nested": {"t": torch.zeros(1)},
        "tensors": [torch.ones(1)],
    }
    moved = move(batch, torch.device("cpu"))
    assert moved["s"] is batch["s"] and moved["b"] is batch["b"]
    assert torch.equal(moved["r"].values, ragged.values) and torch.equal(moved["nested"]["t"], torch.zeros(1))
    assert DeviceTransfer()(batch, torch.device("cpu"))["a"] is batch["a"]
    pinned = pin_batch(batch)
    if torch.cuda.is_available():
        assert pinned["a"].is_pinned() and pinned["r"].is_pinned() and pinned["s"] is batch["s"]
    else:
        assert pinned is batch  # page-locked memory needs CUDA: nothing to do, no error


# -- CUDA ---------------------------------------------------------------------------------------------
@cuda
@pytest.mark.cuda
def test_side_stream_transfer_delivers_the_right_values() -> None:
    device = torch.device("cuda")
    transfer = DeviceTransfer(copy_stream=True)
    for step in range(20):
        host = pin_batch(
            {
                "x": torch.full((256, 1024), float(step)),
                "r": Ragged(torch.arange(100), torch.tensor([0, 40, 100])),
                "s": ["keep"],
            }
        )
        busy = torch.randn(2048, 2048, device=device)
        for _ in range(5):
            busy = busy @ busy / 2048  # keep the compute stream busy while the copy is issued
        out = transfer(host, device)
        assert out["x"].is_cuda and out["s"] == ["keep"] and out["r"].values.is_cuda
        assert float(out["x"].sum()) == step * 256 * 1024
    transfer.stop()


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", DECODER_BACKENDS)
def test_gpu_jpeg_decode_matches_the_cpu(backend: str) -> None:
    blobs = image_blobs(12, "jpeg") + image_blobs(4, "png")
    ids = torch.arange(16) % 12
    gpu = DecodeImage(size=8, device="cuda", backend=backend)({"image": blobs})["image"]
    cpu = DecodeImage(size=8, backend=backend)({"image": blobs})["image"]
    assert gpu.is_cuda and gpu.shape == cpu.shape == (16, 3, 8, 8)
    assert (gpu.cpu() - cpu).abs().max() < 0.05  # nvJPEG and libjpeg may round differently
    assert_images_match_ids(gpu[:12].cpu(), ids[:12])


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("share", [0.25, 1.0])
def test_gpu_decode_with_a_cpu_share_matches_the_cpu(share: float) -> None:
    blobs = image_blobs(12, "jpeg") + image_blobs(4, "png")
    batch = pin_batch(to_torch_batch(pa.table({"image": pa.array(blobs, pa.binary())})))
    split = DecodeImage(size=8, device="cuda", cpu_share=share, cpu_threads=2)
    gpu = split(batch)["image"]
    cpu = DecodeImage(size=8)({"image": blobs})["image"]
    assert gpu.is_cuda and gpu.shape == cpu.shape == (16, 3, 8, 8)
    assert (gpu.cpu() - cpu).abs().max() < 0.05
    assert_images_match_ids(gpu[:12].cpu(), torch.arange(12))
    with pytest.raises(ImageDecodeError) as info:
        split({"image": to_torch_batch(pa.table({"image": image_blobs(12, "jpeg", bad=(1, 9))}))["image"]})
    assert info.value.index == 1


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", DECODER_BACKENDS)
def test_gpu_decode_names_a_bad_row_of_the_batch(backend: str) -> None:
    # the batched nvJPEG call fails; one call per image then names the row, as on the CPU
    blobs = image_blobs(12, "jpeg", bad=(7,))
    with pytest.raises(ImageDecodeError) as info:
        DecodeImage(device="cuda", backend=backend)({"image": to_torch_batch(pa.table({"image": blobs}))["image"]})
    assert info.value.index == 7 and info.value.column == "image"


@cuda
@pytest.mark.cuda
def test_trainer_on_cuda_decodes_on_the_gpu(tmp_path: Path) -> None:
    uri = write_image_dataset(tmp_path / "img.lance", 64, fmt="jpeg")
    dm = _dm(
        uri, device_transform=Compose([DecodeImage(device="cuda"), DeviceAugment([v2.RandomHorizontalFlip(p=1.0)])])
    )
    model = ImageModel()
    _fit(tmp_path, dm, model, accelerator="cuda")
    assert all(d.type == "cuda" for d in model.devices) and len(model.images) == 4
    for ids, images in zip(model.seen, model.images):
        assert_images_match_ids(images.flip(-1), torch.tensor(ids))
    assert dm._pin()  # pinned by default when training on CUDA
    assert dm.train_dataloader().device_path.depth > 0  # copied and decoded ahead of the step (once: flip)
    assert dm.device_transfer.host_columns[0] == "image"  # the encoded bytes stayed on the host
