"""A worker's batch crosses to the training process as one message (`lance_lightning.produce.parcel`)."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from lance_lightning.produce.convert import Ragged
from lance_lightning.produce.parcel import PARCEL_MAX_BYTES, Parcel, parcel


def crossed(value: object) -> object:
    """What the training process unpickles of ``value`` sent the way torch sends worker results."""
    return pickle.loads(bytes(ForkingPickler.dumps(value)))


def test_a_batch_arrives_as_the_same_plain_batch() -> None:
    batch = {
        "id": torch.arange(5),
        "vec": torch.rand(5, 3),
        "flag": torch.tensor([True, False, True, True, False]),
        "tokens": Ragged(torch.arange(9, dtype=torch.int32), torch.tensor([0, 2, 2, 5, 8, 9])),
        "name": ["a", "b", "c", "d", "e"],
        "half": torch.rand(5).half(),
    }
    wrapped = parcel(batch)
    assert isinstance(wrapped, Parcel)
    got = crossed(wrapped)
    assert type(got) is dict and list(got) == list(batch)
    for key in ("id", "vec", "flag", "half"):
        assert got[key].dtype == batch[key].dtype and torch.equal(got[key], batch[key])
    assert isinstance(got["tokens"], Ragged)
    assert torch.equal(got["tokens"].values, batch["tokens"].values)
    assert torch.equal(got["tokens"].offsets, batch["tokens"].offsets)
    assert got["name"] == batch["name"]
    got["vec"] += 1  # the rebuilt tensors are the receiver's own, writable
    assert not torch.equal(got["vec"], batch["vec"])


def test_a_non_contiguous_tensor_keeps_its_values() -> None:
    batch = {"x": torch.arange(12).reshape(3, 4).t()}
    assert torch.equal(crossed(parcel(batch))["x"], batch["x"])


@pytest.mark.parametrize(
    "batch",
    [
        {"big": torch.zeros(PARCEL_MAX_BYTES + 1, dtype=torch.uint8)},
        {"x": torch.zeros(4, dtype=torch.bfloat16)},
    ],
    ids=["larger than a parcel", "a dtype numpy has not"],
)
def test_what_a_parcel_cannot_carry_keeps_torch_s_shared_memory(batch: dict) -> None:
    assert parcel(batch) is batch


def test_anything_but_a_dict_passes_as_it_is() -> None:
    items = [torch.arange(3)]
    assert parcel(items) is items
