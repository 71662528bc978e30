"""The compact row set of a filter: exact, scanned once, small, shipped whole to workers."""

from __future__ import annotations

import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning import LanceSource, RowShuffle
from lance_lightning.plan import rowset
from lance_lightning.plan.rowset import EliasFano, MatchBitmap, RangeRuns, rowset_from_arrays, scan_matches
from lance_lightning.source import pin_source
from tests.helpers import plan_of, write_dataset

ROWS = 20_000
FILTERS = {
    "scattered": "id % 10 = 3",
    "clustered": "id < 700 OR (id >= 5000 AND id < 9000) OR id >= 19990",
    "all": "id >= 0",
    "one": "id = 12345",
    "blocks": "(id % 1000) < 300",
}


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rowset") / "ds.lance"
    uri = write_dataset(path, ROWS, fragment_rows=3000)
    lance.dataset(uri).delete("id % 97 = 5")  # deletions: positions are live-row offsets
    return uri


def expected(uri: str, flt: str) -> np.ndarray:
    return lance.dataset(uri).to_table(columns=["_rowoffset"], filter=flt).column(0).to_numpy().astype(np.int64)


@pytest.mark.parametrize("name", sorted(FILTERS))
@pytest.mark.parametrize("scan_rows", [rowset.SCAN_BATCH_ROWS, 333])
def test_select_maps_each_match_to_its_position(uri: str, name: str, scan_rows: int, monkeypatch) -> None:
    monkeypatch.setattr(rowset, "SCAN_BATCH_ROWS", scan_rows)  # small batches: runs cross batches
    dataset = lance.dataset(uri)
    want = expected(uri, FILTERS[name])
    matches = scan_matches(dataset, FILTERS[name], dataset.count_rows())
    assert matches.rows == len(want)
    assert np.array_equal(matches.select(np.arange(len(want))), want)
    shuffled = np.random.default_rng(0).permutation(len(want))
    assert np.array_equal(
        matches.select(np.concatenate([shuffled, shuffled[:3]])), want[np.concatenate([shuffled, shuffled[:3]])]
    )


def test_the_smaller_structure_is_kept(uri: str) -> None:
    dataset = lance.dataset(uri)
    total = dataset.count_rows()
    scattered = scan_matches(dataset, FILTERS["scattered"], total)  # 1 row in 10: Elias-Fano
    assert isinstance(scattered, EliasFano)
    assert scattered.nbytes <= total // 8 * 0.7  # 8 bytes a match would be ~16 KB here, a bitmap ~2.5 KB
    dense = scan_matches(dataset, "id % 2 = 0", total)  # 1 row in 2: the bitmap
    assert isinstance(dense, MatchBitmap)
    assert dense.nbytes <= total // 8 + total // 64 + 256
    clustered = scan_matches(dataset, FILTERS["clustered"], total)
    assert isinstance(clustered, RangeRuns)
    runs = 1 + np.count_nonzero(np.diff(expected(uri, FILTERS["clustered"])) != 1)
    assert len(clustered.starts) == runs and clustered.nbytes == 16 * runs + 8


def test_scalar_index_filter_gives_the_same_rows(tmp_path) -> None:
    uri = write_dataset(tmp_path / "indexed.lance", 5000, fragment_rows=1000, label_classes=7)
    dataset = lance.dataset(uri)
    dataset.create_scalar_index("label", "BITMAP")
    matches = scan_matches(lance.dataset(uri), "label = 3", 5000)
    assert np.array_equal(matches.select(np.arange(matches.rows)), expected(uri, "label = 3"))


def test_a_filtered_plan_ships_the_compact_row_set(tmp_path) -> None:
    rows = 200_000
    uri = write_dataset(tmp_path / "big.lance", rows, fragment_rows=50_000)
    source = pin_source(LanceSource(uri, columns=["id"], filter="id % 10 = 0"), "train")
    plan = plan_of("train", source, RowShuffle(seed=0), None, 64, True)
    # A list of positions would pickle to 8 bytes a match (160 KB); the bitmap is 1 bit a row.
    assert len(pickle.dumps(plan)) < rows // 8 + rows // 64 + 4096
    copy = pickle.loads(pickle.dumps(plan))
    assert np.array_equal(copy.row_positions(np.arange(0, 20_000, 7)), np.arange(0, 20_000, 7) * 10)


@settings(max_examples=100, deadline=None)
@given(bits=st.lists(st.booleans(), min_size=1, max_size=3000), data=st.data())
def test_bitmap_select_is_the_position_of_the_ith_set_bit(bits: list[bool], data: st.DataObject) -> None:
    flags = np.array(bits, dtype=bool)
    padded = np.zeros(-(-len(flags) // 512) * 512, dtype=bool)
    padded[: len(flags)] = flags
    bitmap = MatchBitmap(np.packbits(padded, bitorder="little").view(np.uint64))
    positions = np.flatnonzero(flags)
    assert bitmap.rows == len(positions)
    if len(positions):
        index = np.array(data.draw(st.lists(st.integers(0, len(positions) - 1), min_size=1, max_size=50)))
        assert np.array_equal(bitmap.select(index), positions[index])


@settings(max_examples=150, deadline=None)
@given(
    total=st.integers(1, 20_000),
    density=st.sampled_from([0.0005, 0.01, 0.1, 0.3, 0.6, 1.0]),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_elias_fano_select_is_the_position_of_the_ith_match(
    total: int, density: float, seed: int, data: st.DataObject
) -> None:
    flags = np.random.default_rng(seed).random(total) < density
    padded = np.zeros(-(-total // 512) * 512, dtype=bool)
    padded[:total] = flags
    bitmap = MatchBitmap(np.packbits(padded, bitorder="little").view(np.uint64))
    coded = EliasFano.from_bitmap(bitmap, total)
    rebuilt = rowset_from_arrays(coded.arrays())
    positions = np.flatnonzero(flags)
    assert coded.rows == rebuilt.rows == len(positions)
    if len(positions):
        index = np.array(data.draw(st.lists(st.integers(0, len(positions) - 1), min_size=1, max_size=60)))
        assert np.array_equal(coded.select(index), positions[index])
        assert np.array_equal(rebuilt.select(index), positions[index])
        assert np.array_equal(coded.select(np.arange(len(positions))), positions)


@settings(max_examples=150, deadline=None)
@given(
    total=st.integers(1, 20_000),
    density=st.sampled_from([0.0005, 0.01, 0.1, 0.3, 0.6, 1.0]),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_range_select_is_select_of_the_consecutive_indices(
    total: int, density: float, seed: int, data: st.DataObject
) -> None:
    """``select_range`` and `select_runs` (runs of consecutive indices decoded as ranges) give what
    ``select`` gives, for every structure; the Elias-Fano size is known before it is built."""
    flags = np.random.default_rng(seed).random(total) < density
    padded = np.zeros(-(-total // 512) * 512, dtype=bool)
    padded[:total] = flags
    bitmap = MatchBitmap(np.packbits(padded, bitorder="little").view(np.uint64))
    coded = EliasFano.from_bitmap(bitmap, total)
    assert EliasFano.size_of(bitmap.rows, total) == coded.nbytes
    positions = np.flatnonzero(flags)
    if not len(positions):
        return
    runs = np.concatenate([[0], np.flatnonzero(np.diff(positions) != 1) + 1])
    ranges = RangeRuns(positions[runs], np.diff(np.append(runs, len(positions))))
    first = data.draw(st.integers(0, len(positions) - 1))
    count = data.draw(st.integers(0, len(positions) - first))
    pieces = data.draw(st.lists(st.tuples(st.integers(0, len(positions) - 1), st.integers(1, 300)), max_size=5))
    index = np.concatenate(
        [np.zeros(0, dtype=np.int64)] + [np.arange(a, min(len(positions), a + n), dtype=np.int64) for a, n in pieces]
    )
    for found in (bitmap, coded, ranges):
        assert np.array_equal(found.select_range(first, count), positions[first : first + count])
        assert np.array_equal(rowset.select_runs(found, index), positions[index])


@pytest.mark.parametrize(
    "flt",
    ["x > 100", "x IS NULL", "NOT (x > 10)", "x % 3 = 0 OR id < 10", "s LIKE '1%'", "_rowid < 3000"],
)
@pytest.mark.parametrize("index_rows", [rowset.INDEX_SCAN_ROWS, 0])
def test_the_projected_filter_finds_the_filtered_rows(tmp_path, flt: str, index_rows: int, monkeypatch) -> None:
    """The filter evaluated as a projection (NULL does not match), or by a filtered scan where Lance
    cannot project it (``_rowid``) or, on large tables, an index answers it: the same rows."""
    monkeypatch.setattr(rowset, "INDEX_SCAN_ROWS", index_rows)
    rows = 5000
    table = pa.table(
        {
            "id": pa.array(np.arange(rows)),
            "x": pa.array([None if i % 7 == 0 else i for i in range(rows)], pa.int64()),
            "s": pa.array([str(i) for i in range(rows)]),
        }
    )
    uri = str(tmp_path / "nulls.lance")
    lance.write_dataset(table, uri, max_rows_per_file=1000)
    dataset = lance.dataset(uri)
    dataset.delete("id % 13 = 1")
    dataset.create_scalar_index("x", "BTREE")
    dataset = lance.dataset(uri)
    want = expected(uri, flt)
    matches = scan_matches(dataset, flt, dataset.count_rows())
    assert matches.rows == len(want) and np.array_equal(matches.select(np.arange(matches.rows)), want)
