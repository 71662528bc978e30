"""Large worker batches cross through reused shared-memory slabs (`lance_lightning.produce.slabs`)."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

from lance_lightning import LanceDataModule, LanceSource, NoShuffle
from lance_lightning.produce import slabs
from lance_lightning.produce.convert import Ragged
from lance_lightning.produce.parcel import PARCEL_MAX_BYTES, parcel, slab_run
from lance_lightning.vocabulary import Shipment
from tests.helpers import write_dataset
from tests.worker_probe import WidenRows


@pytest.fixture
def ring():
    """A worker ring in this process, whose batches the same process receives."""
    channel = slabs.SlabChannel.open(multiprocessing.get_context("forkserver"), workers=1)
    slabs.start_worker_ring(channel, 0)
    yield slabs.worker_ring()
    slabs._RING = None
    channel.close()


def crossed(value: object) -> object:
    return pickle.loads(bytes(ForkingPickler.dumps(value)))


def big_batch(seed: int) -> dict:
    rows = PARCEL_MAX_BYTES // 4096 + 1  # 1 KiB floats per row: just over a parcel
    return {
        "id": torch.arange(rows) + seed,
        "wide": torch.full((rows, 1024), float(seed)),
        "tokens": Ragged(torch.arange(7, dtype=torch.int32) + seed, torch.tensor([0, 3, 7])),
        "name": [f"row-{seed}"],
        "t": torch.arange(6, dtype=torch.int16).reshape(2, 3).t() + seed,  # not contiguous
    }


def held(ring: slabs.SlabRing) -> list[int]:
    return [slot for slot in range(slabs.SLOTS) if ring.channel.held[slot]]


def test_a_large_batch_arrives_whole_over_a_slab(ring: slabs.SlabRing) -> None:
    batch = big_batch(3)
    packed = parcel(batch)
    assert isinstance(packed, slabs.SlabParcel)
    got = crossed(packed)
    assert list(got) == list(batch) and got["name"] == ["row-3"]
    for key in ("id", "wide", "t"):
        assert got[key].dtype == batch[key].dtype and torch.equal(got[key], batch[key]), key
    assert torch.equal(got["tokens"].values, batch["tokens"].values)
    assert torch.equal(got["tokens"].offsets, batch["tokens"].offsets)


def test_a_slot_is_held_until_the_batch_s_last_tensor_is_freed_then_reused(ring: slabs.SlabRing) -> None:
    got = crossed(parcel(big_batch(1)))
    assert held(ring) == [0]
    wide = got["wide"][5:]  # a view outlives the batch dict
    del got
    gc.collect()
    assert held(ring) == [0]
    second = crossed(parcel(big_batch(2)))  # slot 0 is held: another slab
    assert held(ring) == [0, 1] and torch.equal(wide, torch.full_like(wide, 1.0))
    del wide, second
    gc.collect()
    assert held(ring) == []
    storage = ring.slabs[0]
    crossed(parcel(big_batch(4)))
    assert ring.slabs[0] is storage  # reused, not reallocated


def test_keeping_a_small_column_does_not_keep_the_slab(ring: slabs.SlabRing) -> None:
    got = crossed(parcel(big_batch(5)))
    ids, tokens = got["id"], got["tokens"]  # small: copied out on receipt
    assert ids.numel() * ids.element_size() < slabs.VIEW_BYTES
    del got
    gc.collect()
    assert held(ring) == [] and torch.equal(ids, big_batch(5)["id"]) and tokens.values[0] == 5


def test_held_batches_are_never_overwritten_and_a_full_ring_falls_back(ring: slabs.SlabRing) -> None:
    kept = [crossed(parcel(big_batch(seed))) for seed in range(slabs.SLOTS)]
    assert len(held(ring)) == slabs.SLOTS
    overflow = big_batch(99)
    assert parcel(overflow) is overflow  # no free slot: torch's own shared memory, never a wait
    for seed, batch in enumerate(kept):
        assert torch.equal(batch["wide"], torch.full_like(batch["wide"], float(seed))), seed
    del kept, batch
    gc.collect()
    assert held(ring) == []


def small_shipment(seed: int) -> Shipment:
    batch = {"id": torch.arange(256) + seed, "vec": torch.full((256, 128), float(seed))}  # vec: 128 KiB
    return Shipment(parcel(batch), None, None)


def test_a_run_of_small_batches_shares_one_slot_until_its_last_batch_is_freed(ring: slabs.SlabRing) -> None:
    run = slab_run([small_shipment(seed) for seed in range(3)])
    assert all(isinstance(shipment.batch, slabs.SlabParcel) for shipment in run)
    got = [shipment.batch for shipment in crossed(run)]  # one message, as a worker's Bundle
    assert held(ring) == [0]
    for seed, batch in enumerate(got):
        assert torch.equal(batch["vec"], torch.full((256, 128), float(seed))) and batch["id"][0] == seed
    kept = got.pop(1)["vec"]
    del got, batch
    gc.collect()
    assert held(ring) == [0] and torch.equal(kept, torch.full((256, 128), 1.0))
    del kept
    gc.collect()
    assert held(ring) == []


def test_a_run_with_nothing_to_view_stays_in_its_message(ring: slabs.SlabRing) -> None:
    run = [Shipment(parcel({"id": torch.arange(256) + seed}), None, None) for seed in range(3)]
    assert slab_run(run) == run and held(ring) == []


@pytest.mark.slow
@pytest.mark.parametrize("size", ["large", "small"])
def test_workers_hand_batches_equal_to_in_process_ones(tmp_path: Path, size: str) -> None:
    """Through a loader with 2 workers, over 3 epochs, with every batch of an epoch kept until its
    end: each equals the in-process batch (a slot reused under a kept batch would change it).
    ``large``: each batch passes 1 MiB (a slab each); ``small``: 2048-row batches whose ``vec`` is
    64 KiB, sent in runs of 2 that share a slab."""
    uri = write_dataset(tmp_path / "ds.lance", 48_000, fragment_rows=12_000)
    columns, batch_size, transform = (
        (["id", "x"], 256, WidenRows()) if size == "large" else (["id", "x", "vec"], 2048, None)
    )

    def epochs(workers: int) -> list[list[dict]]:
        dm = LanceDataModule(
            train=LanceSource(uri, columns=columns),
            batch_size=batch_size,
            shuffle=NoShuffle(),
            transform=transform,
            num_workers=workers,
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
        seen = []
        for _ in range(3):
            batches = list(loader)
            if size == "large":
                assert all(batch["wide"].numel() * 4 > PARCEL_MAX_BYTES for batch in batches)
            seen.append([{key: value.clone() for key, value in batch.items()} for batch in batches])
        if workers:
            assert loader.worker_init_fn.keywords["slabs"].storages, "no batch came through a slab"
        return seen

    in_process, workers = epochs(0), epochs(2)
    for epoch, (expected, got) in enumerate(zip(in_process, workers)):
        assert len(got) == len(expected), epoch
        for want, have in zip(expected, got):
            assert list(have) == list(want)
            for key in want:
                assert torch.equal(have[key], want[key]), (epoch, key)
