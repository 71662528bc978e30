"""Blob columns handed on as seekable file objects: a transform naming a blob column in its
``blob_files`` attribute streams it (byte ranges through ``lance.BlobFile``) instead of getting bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_lightning import LanceDataModule, LanceIterableDataset, LanceMapDataset, LanceSource, RowShuffle
from lance_lightning.errors import ConfigError
from lance_lightning.source import pin_source
from lance_lightning.transforms import Compose
from tests.helpers import plan_of

ROWS = 40


def payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, 300 + 17 * i, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = os.fspath(tmp_path_factory.mktemp("blobs") / "media.lance")
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("label", pa.int64()),
            pa.field("video", pa.large_binary(), metadata={"lance-encoding:blob": "true"}),
        ]
    )
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "label": np.arange(ROWS) % 3,
            "video": pa.array([payload(i) for i in range(ROWS)], pa.large_binary()),
        },
        schema=schema,
    )
    lance.write_dataset(table, path, schema=schema, max_rows_per_file=16)
    return path


class Window:
    """Reads bytes ``[5, 5 + 40)`` of each row's video through its file object, two ways."""

    blob_files = ("video",)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        files = batch["video"]
        ranged = [f.read_range(5, 40) for f in files]
        sought = []
        for f in files:
            f.seek(5)
            sought.append(f.read(40))
        return {**batch, "video": ranged, "sought": sought, "sizes": [f.size() for f in files]}


def check(batch: dict[str, Any]) -> None:
    for i, ranged, sought, size in zip(batch["id"].tolist(), batch["video"], batch["sought"], batch["sizes"]):
        assert ranged == sought == payload(i)[5:45]
        assert size == len(payload(i))


def test_blob_files_in_the_iterable_dataset_filtered_and_shuffled(uri: str) -> None:
    plan = plan_of("train", pin_source(LanceSource(uri, filter="label != 1"), "train"), RowShuffle(seed=1), None, 6)
    dataset = LanceIterableDataset(plan, transform=Compose([Window()]), reader_threads=2)
    ids = []
    for batch in dataset:
        check(batch)
        ids += batch["id"].tolist()
    assert sorted(ids) == [i for i in range(ROWS) if i % 3 != 1]


def test_blob_files_reach_the_batch_without_a_transform_consuming_them(uri: str) -> None:
    class Keep:
        blob_files = ("video",)

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            return batch

    dm = LanceDataModule(predict=LanceSource(uri), batch_size=8, transform=Keep(), reader_threads=1)
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    files = batch["video"]
    assert len(files) == 8 and all(f.seekable() for f in files)
    assert files[3].read_range(100, 20) == payload(int(batch["id"][3]))[100:120]
    assert batch["_rowaddr"].tolist() == batch["id"].tolist()  # identity rides along on predict


def test_blob_files_in_the_map_dataset(uri: str) -> None:
    dataset = LanceMapDataset(LanceSource(uri, columns=["id", "video"]), transform=Window())
    check(dataset.__getitems__([31, 2, 17]))


def test_blob_files_that_are_not_blob_columns_are_config_errors(uri: str) -> None:
    class Wrong:
        blob_files = ("label",)

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            return batch

    plan = plan_of("train", pin_source(LanceSource(uri), "train"), None, None, 4)
    with pytest.raises(ConfigError, match="not blob columns") as info:
        LanceIterableDataset(plan, transform=Wrong())
    assert info.value.param == "blob_files"
    only = plan_of("train", pin_source(LanceSource(uri, columns=["video"]), "train"), None, None, 4)
    with pytest.raises(ConfigError, match="no column but its blob files"):
        LanceIterableDataset(only, transform=Window())


def test_bytes_stay_the_default(uri: str, tmp_path: Path) -> None:
    plan = plan_of("train", pin_source(LanceSource(uri), "train"), None, None, 8)
    batch = next(iter(LanceIterableDataset(plan)))
    assert batch["video"].row(2).numpy().tobytes() == payload(2)
