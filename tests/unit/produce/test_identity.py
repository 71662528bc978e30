"""Row identity: every batch row names its row address, Lance row id, epoch position and epoch,
the same whatever the strategy, filter, world size, batch size, threads or worker processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from lance_lightning import (
    BufferShuffle,
    LanceDataModule,
    LanceIterableDataset,
    LanceMixture,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    TokenPacking,
)
from lance_lightning.errors import ConfigError, RowError
from lance_lightning.produce.badrows import ReplaceBadRow
from lance_lightning.produce.identity import check_identity_settings
from lance_lightning.source import pin_source
from lance_lightning.vocabulary import EPOCH, EPOCH_POSITION, ROW_ADDRESS, ROW_ID
from tests.helpers import make_table, plan_of, write_dataset

ROWS = 230


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("identity") / "ds.lance", rows=ROWS, fragment_rows=64)


def lance_columns(uri: str, columns: list[str]) -> dict[int, tuple[int, ...]]:
    """id -> the values of Lance's own ``columns`` (``_rowaddr``, ``_rowid``) for that row."""
    table = lance.dataset(uri).to_table(columns=["id", *columns])
    return {row["id"]: tuple(row[c] for c in columns) for row in table.to_pylist()}


def records(
    uri: str, strategy: Any, *, filter: str | None = None, world_size: int = 1, batch_size: int = 16, **kw: Any
) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(epoch, position) -> (id, rowaddr, rowid) over every rank's batches of epochs 0 and 1."""
    plan = plan_of("train", pin_source(LanceSource(uri, filter=filter), "train"), strategy, None, batch_size)
    seen: dict[tuple[int, int], tuple[int, int, int]] = {}
    for rank in range(world_size):
        dataset = LanceIterableDataset(plan, world_size=world_size, rank=rank, row_identity=True, **kw)
        for epoch in (0, 1):
            dataset.set_epoch(epoch)
            for batch in dataset:
                assert batch[EPOCH].tolist() == [epoch] * len(batch["id"])
                for key in (ROW_ADDRESS, ROW_ID, EPOCH_POSITION, EPOCH):
                    assert batch[key].dtype == torch.int64
                for row in zip(
                    batch[EPOCH_POSITION].tolist(),
                    batch["id"].tolist(),
                    batch[ROW_ADDRESS].tolist(),
                    batch[ROW_ID].tolist(),
                ):
                    seen[(epoch, row[0])] = row[1:]
    return seen


@pytest.mark.parametrize(
    "strategy",
    [NoShuffle(), ShardShuffle(32, seed=1), RowShuffle(seed=2), BufferShuffle(buffer_rows=48, shard_rows=32, seed=3)],
    ids=["none", "shard", "row", "buffer"],
)
@pytest.mark.parametrize("filter", [None, "label < 6"])
def test_identity_is_the_row_and_its_epoch_position_whatever_the_topology(
    uri: str, strategy: Any, filter: str | None
) -> None:
    one = records(uri, strategy, filter=filter, world_size=1, batch_size=16)
    two = records(uri, strategy, filter=filter, world_size=2, batch_size=7, reader_threads=0)
    rows = len(lance.dataset(uri).to_table(columns=["id"], filter=filter))
    # Every epoch position of both epochs, each naming one row, the same row on any topology.
    assert sorted(one) == [(e, p) for e in (0, 1) for p in range(rows)]
    assert one == {key: value for key, value in two.items() if key in one}
    truth = lance_columns(uri, ["_rowaddr", "_rowid"])
    assert all(truth[i] == (address, row_id) for i, address, row_id in one.values())
    ids = [[one[(e, p)][0] for p in range(rows)] for e in (0, 1)]
    assert sorted(ids[0]) == sorted(ids[1])


def test_identity_with_worker_processes_matches_in_process(uri: str) -> None:
    plan = plan_of("train", pin_source(LanceSource(uri), "train"), RowShuffle(seed=5), None, 20)
    dataset = LanceIterableDataset(plan, row_identity=True)
    dataset.set_epoch(2)
    in_process = [{k: b[k].tolist() for k in ("id", ROW_ADDRESS, EPOCH_POSITION)} for b in dataset]
    copy = dataset.for_loader(torch.multiprocessing.get_context("forkserver"), metrics=False, pin_memory=False)
    copy.set_epoch(2)
    loader = DataLoader(copy, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    with_workers = [{k: b[k].tolist() for k in ("id", ROW_ADDRESS, EPOCH_POSITION)} for b in loader]
    assert with_workers == in_process


def test_identity_after_deletions_and_with_stable_row_ids(tmp_path: Path) -> None:
    for stable in (False, True):
        uri = str(tmp_path / f"ds_{stable}.lance")
        lance.write_dataset(make_table(100), uri, max_rows_per_file=30, enable_stable_row_ids=stable)
        lance.dataset(uri).delete("id % 7 = 3")
        seen = records(uri, ShardShuffle(10, seed=0), batch_size=9)
        truth = lance_columns(uri, ["_rowaddr", "_rowid"])
        assert len(seen) == 2 * len(truth)
        assert all(truth[i] == (address, row_id) for i, address, row_id in seen.values())
        if stable:  # stable ids differ from addresses after the first deleted row
            assert any(address != row_id for _, address, row_id in seen.values())


class RejectId:
    """Rejects the row with id ``bad`` (a bad row), recording the identity it saw."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["id"].tolist()
        if self.bad in ids:
            raise RowError("id", ids.index(self.bad), "rejected")
        return batch


def test_replaced_row_carries_its_own_address_and_its_slots_position(uri: str) -> None:
    plan = plan_of("train", pin_source(LanceSource(uri), "train"), NoShuffle(), None, 10)
    dataset = LanceIterableDataset(plan, row_identity=True, transform=RejectId(13), bad_rows=ReplaceBadRow(seed=1))
    batch = next(b for b in dataset if 13 in b[EPOCH_POSITION].tolist())
    slot = batch[EPOCH_POSITION].tolist().index(13)
    replacement = int(batch["id"][slot])
    assert replacement != 13
    assert int(batch[ROW_ADDRESS][slot]) == lance_columns(uri, ["_rowaddr"])[replacement][0]


def test_data_module_default_is_predict_only(uri: str) -> None:
    dm = LanceDataModule(train=LanceSource(uri), predict=LanceSource(uri), batch_size=50, reader_threads=1)
    dm.setup("fit")
    dm.setup("predict")
    assert ROW_ADDRESS not in next(iter(dm.train_dataloader()))
    batch = next(iter(dm.predict_dataloader()))
    assert batch[EPOCH_POSITION].tolist() == list(range(50))
    assert batch[ROW_ADDRESS].tolist() == batch["id"].tolist()  # one fragment's first rows: offset = id


@pytest.mark.parametrize(
    ("value", "kwargs", "problem"),
    [
        ("predict", {}, "must be true, false, null"),
        (["train", "nope"], {}, "must be true, false, null"),
        (True, {"packing": TokenPacking(column="tokens", seq_len=8)}, "packed token windows"),
        (["train"], {"bad_rows": ReplaceBadRow(), "device_transform": lambda b: b}, "device_transform"),
    ],
)
def test_bad_settings_are_config_errors(value: Any, kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as info:
        check_identity_settings(value, kwargs.get("packing"), kwargs.get("bad_rows"), kwargs.get("device_transform"))
    assert info.value.param == "row_identity"
    assert check_identity_settings(None, TokenPacking(column="tokens", seq_len=8), None, None) == frozenset()


def test_a_source_column_named_like_a_key_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "clash.lance")
    lance.write_dataset(pa.table({"id": np.arange(10), "_position": np.arange(10)}), uri)
    plan = plan_of("predict", pin_source(LanceSource(uri), "predict"), None, None, 4)
    with pytest.raises(ConfigError, match="_position"):
        LanceIterableDataset(plan, row_identity=True)


def test_a_remote_cache_copy_and_a_mixture_are_refused(uri: str) -> None:
    pinned = pin_source(LanceSource(uri), "predict")
    copy = plan_of("predict", dataclasses.replace(pinned, stands_for=pinned), None, None, 4)
    with pytest.raises(ConfigError, match="remote_cache"):
        LanceIterableDataset(copy, row_identity=True)
    mixture = LanceMixture([LanceSource(uri), LanceSource(uri)], weights=[1.0, 1.0], block=20)
    dm = LanceDataModule(train=mixture, batch_size=8, reader_threads=0, row_identity=True)
    dm.setup("fit")
    with pytest.raises(ConfigError, match="LanceMixture") as info:
        dm.train_dataloader()
    assert info.value.param == "row_identity"


def test_by_default_a_split_identity_cannot_describe_is_read_without_it(tmp_path: Path) -> None:
    """``row_identity: null`` (predict by default) never breaks a predict split that worked before
    identity existed (here: a column named like a key); asked for explicitly, it is refused."""
    uri = str(tmp_path / "clash.lance")
    lance.write_dataset(pa.table({"id": np.arange(10), "_position": np.arange(10)}), uri)
    dm = LanceDataModule(predict=LanceSource(uri), batch_size=4, reader_threads=0)
    dm.setup("predict")
    batches = list(dm.predict_dataloader())
    assert [int(v) for b in batches for v in b["id"]] == list(range(10))
    assert all(ROW_ADDRESS not in batch for batch in batches)
    explicit = LanceDataModule(predict=LanceSource(uri), batch_size=4, reader_threads=0, row_identity=True)
    explicit.setup("predict")
    with pytest.raises(ConfigError, match="_position"):
        explicit.predict_dataloader()
