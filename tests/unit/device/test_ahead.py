"""`DeviceAhead`: batches prepared ahead in a thread, in order, bounded, errors in place, stoppable;
`DevicePath`: the one way a loader's batches reach the device, decided once, positions included.

The thread logic is the same on every device (on CUDA it adds a stream and an event per batch), so
it is tested here on the CPU; the CUDA tests run it through a real Trainer on the GPU, resume included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pyarrow as pa
import pytest
import torch

from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from lance_lightning.device.ahead import DeviceAhead, DevicePath
from lance_lightning.device.transfer import DeviceTransfer
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.load.loader import LanceDataLoader
from lance_lightning.produce.convert import to_torch_batch
from lance_lightning.transforms import DecodeImage
from tests.harness import Job, Setup, run_and_check_resume
from tests.helpers import write_dataset
from tests.images import colour, image_blobs

CPU = torch.device("cpu")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Source:
    """Items ``(batch i, shipped i, positions i)``; counts pulls, fails at ``fail_at``, notes its close."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count, self.fail_at = count, fail_at
        self.pulled = 0
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        try:
            for i in range(self.count):
                if i == self.fail_at:
                    raise OSError(f"read of batch {i} failed")
                self.pulled += 1
                yield {"x": torch.tensor([i])}, f"stats {i}", [i]
        finally:
            self.closed = True


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lance-device-ahead"]


def test_batches_arrive_prepared_in_order_with_what_travels_beside_them() -> None:
    ahead = DeviceAhead(lambda batch, positions: {"x": batch["x"] * 10, "p": positions}, CPU, depth=3)
    out = list(ahead.iterate(iter(Source(20))))
    assert [int(b["x"]) for b, _, _ in out] == [10 * i for i in range(20)]
    assert [s for _, s, _ in out] == [f"stats {i}" for i in range(20)]
    assert [b["p"] for b, _, _ in out] == [p for _, _, p in out] == [[i] for i in range(20)]
    assert not _ahead_threads()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_never_more_than_depth_batches_ahead_of_the_consumer(depth: int) -> None:
    source = Source(30)
    taken = 0
    for _ in DeviceAhead(lambda batch, positions: batch, CPU, depth).iterate(iter(source)):
        taken += 1
        # queued (depth) + the one the thread holds while the queue is full
        assert source.pulled <= taken + depth + 1
    assert taken == 30


def test_a_read_error_arrives_after_the_batches_before_it() -> None:
    got = []
    with pytest.raises(OSError, match="read of batch 5 failed"):
        for batch, _, _ in DeviceAhead(lambda batch, positions: batch, CPU).iterate(iter(Source(10, fail_at=5))):
            got.append(int(batch["x"]))
    assert got == [0, 1, 2, 3, 4]
    assert not _ahead_threads()


def test_a_prepare_error_arrives_at_its_batch() -> None:
    def prepare(batch: dict[str, torch.Tensor], positions: Any) -> dict[str, torch.Tensor]:
        if int(batch["x"]) == 3:
            raise ValueError("row 3 does not decode")
        return batch

    got = []
    with pytest.raises(ValueError, match="row 3 does not decode"):
        for batch, _, _ in DeviceAhead(prepare, CPU).iterate(iter(Source(10))):
            got.append(int(batch["x"]))
    assert got == [0, 1, 2]


def test_leaving_early_stops_the_thread_and_closes_the_source() -> None:
    source = Source(1000)
    batches = DeviceAhead(lambda batch, positions: batch, CPU, depth=2).iterate(iter(source))
    for i, _ in enumerate(batches):
        if i == 2:
            break
    batches.close()  # what dropping the iterator does
    assert source.closed and not _ahead_threads()
    # taken + queued + the one in hand, + one whose read had begun when the consumer left
    assert source.pulled <= 3 + 2 + 1 + 1


def test_the_loader_cursor_counts_only_delivered_batches(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 200)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10, shuffle=RowShuffle(seed=1))
    dm.setup("fit")

    def loader(depth: int | None) -> LanceDataLoader:
        dataset = LanceIterableDataset(dm.plans["train"], world_size=1, rank=0)
        path = DevicePath(DeviceTransfer(copy_stream=False), CPU, None, depth) if depth is not None else None
        return LanceDataLoader(dataset, device_path=path)

    plain, ahead = loader(None), loader(4)
    for reference in (plain, ahead):
        batches = iter(reference)
        for _ in range(5):
            next(batches)
        reference.state = reference.state_dict()
        batches.close()
    assert ahead.state == plain.state  # 5 batches delivered, however far the thread had read
    resumed = loader(2)
    resumed.load_state_dict(ahead.state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    whole = [i for batch in loader(None) for i in batch["id"].tolist()]
    assert rest == whole[50:]


class _MovesBatches(pl.LightningModule):
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch


def test_the_way_to_the_device_is_decided_once_per_loader(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 40)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id"]), batch_size=10, device_transform=lambda b: b)
    dm.setup("fit")
    plan, stage = dm.plans["train"], dm.device_stage
    assert stage.path(plan, torch.device("cuda"), None).depth == 2  # ahead on CUDA
    assert stage.path(plan, torch.device("cuda"), _MovesBatches()).depth == 0  # the model moves batches
    assert stage.path(plan, CPU, None).depth == 0 and stage.path(plan, None, None).depth == 0  # in the hooks
    assert stage.path(plan, CPU, None).ships_positions  # the device transform's bad-row guard needs them
    plain = LanceDataModule(train=LanceSource(uri, columns=["id"]), batch_size=10)
    plain.setup("fit")
    assert not plain.device_stage.path(plain.plans["train"], CPU, None).ships_positions


def test_row_positions_reach_the_hooks_with_their_batch(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 60)
    seen: list[list[int]] = []
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id"]),
        batch_size=10,
        shuffle=RowShuffle(seed=3),
        device_transform=lambda batch: seen.append(batch["id"].tolist()) or batch,
    )
    dm.setup("fit")
    stage = dm.device_stage
    dataset = LanceIterableDataset(dm.plans["train"], world_size=1, rank=0)
    for workers in (0, 2):
        seen.clear()
        loader = LanceDataLoader(dataset, device_path=stage.path(dm.plans["train"], CPU, None), num_workers=workers)
        for batch in loader:
            assert not stage.in_hand.prepared
            assert stage.in_hand.positions.tolist() == batch["id"].tolist()  # id == dataset position
            assert stage.after_transfer(stage.to_device(batch, CPU, 0, None, generic=None), 0, None) is not None
        assert len(seen) == 6 and sorted(i for ids in seen for i in ids) == list(range(60))


# -- CUDA: through a real Trainer -----------------------------------------------------------------
@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("device_ahead", [0, 2])
def test_resume_on_cuda_is_exact_with_batches_prepared_ahead(tmp_path: Path, device_ahead: int) -> None:
    rows, k, epochs = 300, 3, 2
    uri = write_dataset(tmp_path / "ds.lance", rows, fragment_rows=100)
    extra = {"device_ahead": device_ahead}
    a, b = Setup(batch_size=16), Setup(batch_size=24)

    def job(name: str, setup: Setup, **kw: Any) -> Job:
        return Job(name, uri, "row:2", setup, epochs, extra=extra, accelerator="cuda", **kw)

    run_and_check_resume(tmp_path, job, rows=rows, k=k, setup_a=a, setup_b=b, max_epochs=epochs)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("priority", [0, -1])
def test_a_batch_prepared_ahead_is_not_overwritten_while_the_step_reads_it(priority: int) -> None:
    """Each batch is allocated on the ahead thread's stream; the step reads it only after queued
    matmuls and drops it at once. Without the event and ``record_stream`` the allocator would hand
    its memory to the next batches (same stream) before the read ran; the sums show it did not.
    ``priority=-1`` trains on a high-priority stream of its own (the consumer's current stream)."""
    device = torch.device("cuda")
    elements, count = 1 << 22, 24

    def prepare(batch: dict[str, torch.Tensor], positions: Any) -> dict[str, torch.Tensor]:
        return {"x": torch.full((elements,), float(batch["x"]), device=device)}

    busy = torch.randn(4096, 4096, device=device)
    sums = []
    stream = torch.cuda.Stream(device, priority=priority) if priority else torch.cuda.current_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for batch, _, _ in DeviceAhead(prepare, device, depth=2).iterate(iter(Source(count))):
            for _ in range(4):
                busy = (busy @ busy).div_(4096)  # the step's kernels, queued before its read of the batch
            sums.append(batch["x"].sum())
            del batch  # nothing but the stream marks keep the batch's memory from the next batches
        got = torch.stack(sums).cpu()
    assert got.tolist() == [float(i * elements) for i in range(count)]


@cuda
@pytest.mark.cuda
def test_decoded_batches_prepared_ahead_reach_the_step_intact() -> None:
    """The same through `DecodeImage(device="cuda", cpu_share=0.5)`: each batch is a different set
    of solid colours, read by the step after queued matmuls."""
    device = torch.device("cuda")
    blobs = image_blobs(64, "jpeg")
    batches = [
        to_torch_batch(pa.table({"image": pa.array(blobs[i : i + 16] * 16, pa.binary())})) for i in (0, 16, 32, 48)
    ]
    decode = DecodeImage(size=64, normalize=False, device="cuda", cpu_share=0.5, cpu_threads=4)

    class Batches:
        def __iter__(self) -> Iterator[Any]:
            for n in range(12):
                yield batches[n % 4], None, [n]

    busy = torch.randn(4096, 4096, device=device)
    means, firsts = [], []
    for batch, _, positions in DeviceAhead(lambda b, p: decode(b), device, depth=2).iterate(iter(Batches())):
        for _ in range(4):
            busy = (busy @ busy).div_(4096)
        means.append(batch["image"].float().mean(dim=(2, 3)))
        firsts.append(positions[0] % 4)
        del batch
    for first, got in zip(firsts, torch.stack(means).cpu()):
        expected = torch.tensor([colour(16 * first + i % 16) for i in range(256)], dtype=torch.float32)
        assert torch.allclose(got, expected, atol=3)
