"""Both public dataset styles work with a plain torch DataLoader, outside Lightning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from lance_lightning import LanceIterableDataset, LanceMapDataset, LanceSource, RowShuffle, ShardShuffle
from lance_lightning.source import pin_source
from tests.helpers import plan_of, write_dataset


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("plain") / "ds.lance", rows=700, fragment_rows=128)


def test_map_dataset_batched_getitems_with_plain_dataloader(uri: str) -> None:
    dataset = LanceMapDataset(LanceSource(uri, columns=["id", "vec"], filter="label < 5"))
    assert len(dataset) == 350
    loader = DataLoader(
        dataset,
        batch_size=32,
        sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
        collate_fn=LanceMapDataset.collate,
    )
    ids = torch.cat([batch["id"] for batch in loader]).numpy()
    expected = np.arange(700)[np.arange(700) % 10 < 5]
    assert sorted(ids.tolist()) == expected.tolist()
    first = next(iter(loader))
    assert first["vec"].shape == (32, 8)
    assert torch.equal(first["vec"][:, 0], first["id"].float() * 8)


def test_map_dataset_getitem_and_order(uri: str) -> None:
    dataset = LanceMapDataset(LanceSource(uri, columns=["id"]))
    assert dataset[5]["id"].item() == 5
    batch = dataset.__getitems__([9, 3, 3, 650, -1])
    assert batch["id"].tolist() == [9, 3, 3, 650, 699]
    with pytest.raises(IndexError):
        dataset.__getitems__([700])


def test_iterable_dataset_with_plain_dataloader_and_workers(uri: str) -> None:
    plan = plan_of(
        "train",
        pin_source(LanceSource(uri, columns=["id"]), "train"),
        ShardShuffle(64, seed=3),
        None,
        batch_size=50,
        drop_last=False,
    )
    dataset = LanceIterableDataset(plan)
    dataset.set_epoch(4)
    in_process = [b["id"].tolist() for b in DataLoader(dataset, batch_size=None)]
    dataset = dataset.for_loader(torch.multiprocessing.get_context("forkserver"), metrics=True, pin_memory=False)
    dataset.set_epoch(4)
    with_workers = [
        b["id"].tolist()
        for b in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    ]
    assert in_process == with_workers
    assert sorted(sum(in_process, [])) == list(range(700))


def test_row_shuffle_iterable_reads_permuted_rows(uri: str) -> None:
    plan = plan_of(
        "train",
        pin_source(LanceSource(uri, columns=["id", "x"]), "train"),
        RowShuffle(seed=1),
        None,
        batch_size=64,
        drop_last=True,
    )
    dataset = LanceIterableDataset(plan, reader_threads=0)
    dataset.set_epoch(0)
    batches = list(dataset)
    assert len(batches) == 700 // 64
    ids = np.concatenate([b["id"].numpy() for b in batches])
    assert len(set(ids.tolist())) == len(ids)
    assert not np.all(np.diff(ids) > 0)
    for batch in batches:
        assert torch.allclose(batch["x"], batch["id"].float() / 700)
