"""Bad rows: undecodable bytes raise naming the dataset row, or are replaced deterministically.

Real Lance datasets with real PNG/JPEG bytes and a few garbage rows; real Trainer and checkpoint
for the resume test; worker processes for the error path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from lance_lightning import LanceDataModule, LanceMapDataset, LanceSource, RowShuffle
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.produce.badrows import BadRowError, RaiseOnBadRow, ReplaceBadRow, RowError
from lance_lightning.transforms import DecodeImage
from tests.harness import assert_exact, fit, run_resume
from tests.helpers import ImageRecordingModel
from tests.images import assert_images_match_ids, write_image_dataset

BAD = (13, 14, 57, 130)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """160 rows (ids 0..159) with undecodable image bytes at ids 13, 14, 57 and 130."""
    return write_image_dataset(tmp_path / "img.lance", 160, bad=BAD, fragment_rows=64)


def make_dm(
    uri: str, policy: Any = None, *, filter: str | None = None, shuffle: Any = None, **kwargs: Any
) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x", "image"], filter=filter),
        batch_size=16,
        transform=DecodeImage(size=8, normalize=False),
        bad_rows=policy,
        shuffle=shuffle,
        **kwargs,
    )


def epoch(dm: LanceDataModule, world_size: int = 1, rank: int = 0, threads: int = 2) -> tuple[list, dict]:
    dm.setup("fit")
    dataset = LanceIterableDataset(
        dm.plans["train"],
        world_size=world_size,
        rank=rank,
        transform=dm.transform,
        reader_threads=threads,
        bad_rows=dm.bad_rows,
    )
    return list(dataset), dataset.clock.peek()


# -- raise ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("filter", [None, "label != 0"])
def test_raise_names_the_dataset_row_id_and_column(uri: str, filter: str | None) -> None:
    dm = make_dm(uri, filter=filter)
    assert isinstance(dm.bad_rows, RaiseOnBadRow)  # the default
    with pytest.raises(BadRowError) as info:
        epoch(dm)
    error = info.value
    assert (error.position, error.row_id, error.column) == (13, 13, "image")  # position in the dataset, not the split
    text = str(error)
    assert "dataset row 13" in text and "id=13" in text and "'image'" in text and "ReplaceBadRow" in text
    # in-batch index 13, or 11 when the filter drops ids 0 and 10 before it
    assert isinstance(error.__cause__, RowError) and error.__cause__.index == (11 if filter else 13)


def test_raise_in_a_worker_process_reaches_the_main_process_with_its_type(uri: str) -> None:
    dm = make_dm(uri, num_workers=1)
    with pytest.raises(BadRowError, match=r"dataset row 13 \(id=13\).*column 'image'"):
        list(dm.train_dataloader())


def test_other_errors_are_not_bad_rows(tmp_path: Path) -> None:
    uri = write_image_dataset(tmp_path / "sizes.lance", 32, sizes=True)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "image"]),
        batch_size=16,
        transform=DecodeImage(),
        bad_rows=ReplaceBadRow(),
    )
    with pytest.raises(ValueError, match="different shapes") as info:
        epoch(dm)
    assert not isinstance(info.value, (RowError, BadRowError))


# -- replace -------------------------------------------------------------------------------------------
def test_replace_keeps_batch_sizes_counts_and_is_deterministic(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lance_lightning"):
        batches, totals = epoch(make_dm(uri, ReplaceBadRow(seed=5)))
    assert [len(b["id"]) for b in batches] == [16] * 10
    ids = [i for b in batches for i in b["id"].tolist()]
    assert not set(BAD) & set(ids)
    replaced = [ids[i] for i in BAD]
    assert len(ids) == 160 and sorted(set(range(160)) - set(BAD)) == sorted(set(ids))
    for batch in batches:
        assert_images_match_ids(batch["image"], batch["id"])  # the replacement's own image
    assert totals["bad_rows"] == len(BAD)
    assert sum("bad row replaced" in r.message for r in caplog.records) == len(BAD)
    again, _ = epoch(make_dm(uri, ReplaceBadRow(seed=5)), threads=0)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in batches]
    other, _ = epoch(make_dm(uri, ReplaceBadRow(seed=6)))
    assert [[i for b in other for i in b["id"].tolist()][j] for j in BAD] != replaced  # the seed chooses


def test_replacement_candidates_that_are_bad_are_skipped_and_limited(tmp_path: Path) -> None:
    bad = tuple(range(0, 64, 2))  # half the rows are bad
    uri = write_image_dataset(tmp_path / "half.lance", 64, bad=bad)
    batches, totals = epoch(make_dm(uri, ReplaceBadRow(seed=1)))
    ids = [i for b in batches for i in b["id"].tolist()]
    assert len(ids) == 64 and all(i % 2 == 1 for i in ids) and totals["bad_rows"] == 32
    all_bad = write_image_dataset(tmp_path / "all.lance", 32, bad=tuple(range(32)))
    with pytest.raises(BadRowError, match="none of 3 replacement candidates"):
        epoch(make_dm(all_bad, ReplaceBadRow(max_attempts=3)))


def test_two_ranks_yield_equal_batches_with_bad_rows(uri: str) -> None:
    dm = make_dm(uri, ReplaceBadRow(), shuffle=RowShuffle(seed=2, clump_rows=4), drop_last=False)
    ranks = [epoch(dm, world_size=2, rank=r)[0] for r in (0, 1)]
    sizes = [[len(b["id"]) for b in batches] for batches in ranks]
    assert sizes[0] == sizes[1] and len(sizes[0]) == 5
    ids = [i for batches in ranks for b in batches for i in b["id"].tolist()]
    assert len(ids) == 160 and not set(BAD) & set(ids)


def test_bad_rows_from_worker_processes_are_counted_in_the_main_process(uri: str) -> None:
    loader = make_dm(uri, ReplaceBadRow(), num_workers=2).train_dataloader()
    batches = list(loader)
    assert len(batches) == 10
    assert loader.dataset.clock.peek()["bad_rows"] == len(BAD)


def test_map_dataset_applies_the_policy(uri: str) -> None:
    raising = LanceMapDataset(LanceSource(uri, columns=["id", "image"]), transform=DecodeImage())
    with pytest.raises(BadRowError, match=r"dataset row 57 \(id=57\)"):
        raising.__getitems__([1, 57, 2])
    replacing = LanceMapDataset(
        LanceSource(uri, columns=["id", "image"]),
        transform=DecodeImage(normalize=False),
        bad_rows=ReplaceBadRow(seed=3),
    )
    first = replacing.__getitems__([1, 57, 2, 57])
    second = replacing.__getitems__([1, 57, 2, 57])
    assert first["id"][[0, 2]].tolist() == [1, 2] and first["id"][1] == first["id"][3] != 57
    assert torch.equal(first["id"], second["id"]) and first["image"].shape[0] == 4
    assert_images_match_ids(first["image"], first["id"])
    assert replacing.clock.peek()["bad_rows"] == 4


# -- resume across a bad row -----------------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", ["none", "row:2"])
def test_resume_across_a_bad_row_is_exact(tmp_path: Path, uri: str, shuffle: str) -> None:
    k = 3  # the checkpoint lands before rows 57 and 130 are replaced
    a, b, c = run_resume(
        tmp_path,
        uri,
        shuffle,
        None,
        k=k,
        transform=DecodeImage(size=8),
        bad_rows=ReplaceBadRow(seed=4),
        source=LanceSource(uri, columns=["id", "x", "image"]),
    )
    assert_exact(a.seen, b.seen, c.seen, k)
    trained = [i for step in c.seen for i in step]
    assert len(trained) == 160 and not set(BAD) & set(trained)


# -- the device stage: a device_transform under the same policy -------------------------------------------
def fit_steps(
    tmp_path: Path, uri: str, policy: Any, stage: str, device: str = "cpu"
) -> tuple[ImageRecordingModel, LanceDataModule]:
    decode = DecodeImage(size=8, normalize=False, device=None if device == "cpu" else device)
    where = {"transform": decode} if stage == "host" else {"device_transform": decode}
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x", "image"]),
        batch_size=16,
        bad_rows=policy,
        shuffle=RowShuffle(seed=2, clump_rows=4),
        **where,
    )
    model = ImageRecordingModel()
    fit(tmp_path, dm, name=f"{stage}-{device}", model=model, accelerator=device)
    return model, dm


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
        ),
    ],
)
def test_device_transform_replaces_bad_rows_exactly_as_the_host_transform(
    tmp_path: Path, uri: str, device: str
) -> None:
    host, _ = fit_steps(tmp_path, uri, ReplaceBadRow(seed=4), "host")
    on_device, dm = fit_steps(tmp_path, uri, ReplaceBadRow(seed=4), "device", device)
    assert on_device.seen == host.seen  # the same replacement rows, in the same places
    tolerance = 0 if device == "cpu" else 3  # nvJPEG and libjpeg may round differently
    assert all((a.int() - b.int()).abs().max() <= tolerance for a, b in zip(on_device.images, host.images))
    assert not set(BAD) & {i for step in on_device.seen for i in step} and len(on_device.seen) == 10
    assert dm.train_dataloader().dataset.clock.peek()["bad_rows"] == len(BAD)


def test_device_transform_raises_naming_the_dataset_row(tmp_path: Path, uri: str) -> None:
    with pytest.raises(BadRowError) as info:
        fit_steps(tmp_path, uri, RaiseOnBadRow(), "device")
    assert info.value.column == "image" and info.value.position in BAD and info.value.row_id == info.value.position
    assert f"dataset row {info.value.position} (id={info.value.position})" in str(info.value)
