"""A filter evaluated in a child process: the same rows as in process, through a real fit too."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import lance
import numpy as np
import pytest

from lance_lightning import DataReadError, LanceSource
from lance_lightning.plan import filter_scan
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.plan.rowset import EliasFano, MatchBitmap, RangeRuns
from lance_lightning.source import pin_source
from tests.harness import fit, make_dm
from tests.helpers import packages_imported_by, write_dataset


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    uri = write_dataset(tmp_path_factory.mktemp("filter_scan") / "ds.lance", 6000, fragment_rows=1000)
    lance.dataset(uri).delete("id % 89 = 4")  # positions are live-row offsets
    return uri


@pytest.mark.parametrize(
    ("flt", "kind"),
    [("id % 10 = 3", EliasFano), ("id % 2 = 0", MatchBitmap), ("id < 700 OR id >= 5990", RangeRuns)],
    ids=["elias-fano", "bitmap", "runs"],
)
def test_child_scan_finds_the_rows_the_in_process_scan_finds(uri: str, flt: str, kind: type) -> None:
    source = pin_source(LanceSource(uri, filter=flt), "train")
    in_process = find_matches(source, child_from_rows=1 << 62)
    in_child = find_matches(source, child_from_rows=0)
    assert type(in_child) is type(in_process) is kind
    everything = np.arange(in_process.rows)
    expected = lance.dataset(uri).to_table(columns=["_rowoffset"], filter=flt).column(0).to_numpy()
    assert in_child.rows == in_process.rows == len(expected)
    assert np.array_equal(in_child.select(everything), expected)
    assert np.array_equal(in_process.select(everything), expected)


def test_a_failing_child_raises_data_read_error_naming_the_filter(uri: str) -> None:
    source = dataclasses.replace(pin_source(LanceSource(uri), "train"), filter="no_such_column > 1")
    with pytest.raises(DataReadError, match="no_such_column > 1") as raised:
        find_matches(source, child_from_rows=0)
    assert raised.value.uri == uri and "child process" in str(raised.value)


def test_the_child_imports_neither_torch_nor_lightning() -> None:
    modules = ["lance_lightning.plan.filter_scan", "lance_lightning.lifetime"]
    assert packages_imported_by(modules, ("torch", "lightning", "pytorch_lightning")) == []


def test_fit_with_a_filter_scanned_in_a_child_trains_on_exactly_the_matching_rows(
    uri: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(filter_scan, "CHILD_SCAN_ROWS", 0)
    flt = "id % 7 = 2"
    model = fit(tmp_path, make_dm(uri, "row:3", filter=flt, batch_size=32, drop_last=False), name="child", max_epochs=2)
    expected = sorted(lance.dataset(uri).to_table(columns=["id"], filter=flt).column(0).to_pylist())
    for epoch in (0, 1):
        ids = [i for batch, e in zip(model.seen, model.seen_epochs) if e == epoch for i in batch]
        assert sorted(ids) == expected


def test_the_child_imports_this_package_from_where_the_parent_did() -> None:
    import lance_lightning

    first = filter_scan._child_env()["PYTHONPATH"].split(os.pathsep)[0]
    assert first == str(Path(lance_lightning.__file__).resolve().parent.parent)
