"""Read groups change how the planned rows are read, never which rows come in which batch.

What the tests establish:
- with large shards each read group is one range inside one shard; with a short shard at most two
  groups per epoch are two ranges, read by two range scans in the planned order;
- a take plan's groups start at 16 batches and double up to `TAKE_GROUP_BYTES`, and a group taken
  in many calls yields each batch's rows in the planned order; a fit with another take group size
  trains on the same batches;
- `contiguous_ranges` rebuilds the positions (or refuses more ranges than allowed), and
  `read_batch_rows` sizes a read batch at about 2 MiB;
- with a filter the first group of an iteration is one batch, read on the consuming thread, and the
  next full size; a filtered scan group read as the span its rows lie in and one read by a
  scan restricted to its rows yield the same rows in the planned order.
"""

from __future__ import annotations

import lance
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lance_lightning import (
    BufferShuffle,
    FilterRead,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
)
from lance_lightning.read import lance_io, reader
from lance_lightning.read.reader import (
    MAX_RANGE_SCANS,
    TAKE_GROUP_BYTES,
    PlanReader,
    contiguous_ranges,
    read_batch_rows,
)
from lance_lightning.source import pin_source
from tests.harness import fit, make_dm
from tests.helpers import plan_of, write_dataset
from tests.plan_strategies import PURE

LABELS = 10


def test_read_groups_tile_large_shards(tmp_path) -> None:
    """With shards of at least a quarter of a read group, each group is one range inside one
    shard (read by one offset/limit scan, not a scan of several ranges). With a short shard (it
    comes last), at most two groups per epoch are two ranges, read by two range scans in the
    planned order (no allowlist scan, no sort)."""
    uri = write_dataset(tmp_path / "big.lance", 40_960, fragment_rows=15_000, label_classes=LABELS)
    source = pin_source(LanceSource(uri, columns=["id", "label", "x", "vec"]), "train")
    plan = plan_of("train", source, ShardShuffle(shard_rows=8192, seed=3), FilterRead(), 256, False)
    reader = PlanReader(plan, epoch=1, world_size=1, rank=0, start=0)
    groups = list(reader.groups(range(reader.layout.steps)))
    for group in groups:
        positions = np.concatenate([spec.positions for spec in group])
        assert np.array_equal(positions, np.arange(positions[0], positions[0] + len(positions)))
        assert positions[0] // 8192 == positions[-1] // 8192  # inside one shard
    assert sorted(np.concatenate([s.positions for g in groups for s in g]).tolist()) == list(range(40_960))

    short = write_dataset(tmp_path / "short.lance", 40_960 + 64, fragment_rows=15_000, label_classes=LABELS)
    source = pin_source(LanceSource(short, columns=["id", "label", "x", "vec"]), "train")
    plan = plan_of("train", source, ShardShuffle(shard_rows=8192, seed=3), FilterRead(), 256, False)
    for epoch in range(3):
        reader = PlanReader(plan, epoch=epoch, world_size=1, rank=0, start=0)
        wrapping = 0
        for group in reader.groups(range(reader.layout.steps)):
            positions = np.concatenate([spec.positions for spec in group])
            ranges = contiguous_ranges(positions, MAX_RANGE_SCANS)
            assert ranges is not None  # one range, or two: the shard crossing the end of the rows
            wrapping += len(ranges) == 2
            ids = [i for _, table in reader.read_group(group) for i in table.column("id").to_pylist()]
            assert ids == positions.tolist()
        assert wrapping <= 2  # the short shard, and the shard that crosses the end of the rows


def test_take_groups_double_and_sorted_calls_keep_the_planned_order(tmp_path, monkeypatch) -> None:
    """A take plan's read groups start at 16 batches and double up to `TAKE_GROUP_BYTES` of rows;
    a group taken in many `TAKE_CALL_ROWS`-row calls still yields each batch's rows in planned order."""
    monkeypatch.setattr(lance_io, "TAKE_CALL_ROWS", 7)
    uri = write_dataset(tmp_path / "take.lance", 6000, fragment_rows=1000, label_classes=LABELS)
    source = pin_source(LanceSource(uri, columns=["id", "label", "x", "vec"]), "train")
    plan = plan_of("train", source, RowShuffle(seed=5), FilterRead(), 8, False)
    assert plan.method == "take"
    reader = PlanReader(plan, epoch=2, world_size=1, rank=0, start=0)
    most = max(8, TAKE_GROUP_BYTES // plan.row_bytes)
    sizes = []
    order = plan.order(2)
    for group in reader.groups(range(reader.layout.steps)):
        sizes.append(sum(len(spec.positions) for spec in group))
        for spec, (step, table) in zip(group, reader.read_group(group)):
            assert step == spec.step
            expected = order.matched_indices(reader.layout.batch_rows(0, step))
            assert table.column("id").to_pylist() == expected.tolist()
    assert sizes[:3] == [128, 256, 512]
    assert all(b == min(2 * a, most) or b == sizes[-1] for a, b in zip(sizes, sizes[1:]))
    assert sum(sizes) == 6000
    sized = {
        group_bytes: [
            sum(len(spec.positions) for spec in group)
            for group in PlanReader(plan, 2, 1, 0, 0, take_group_bytes=group_bytes).groups(range(100))
        ]
        for group_bytes in (1, 300 * plan.row_bytes)
    }
    assert sized[1][:6] == [128] * 6  # never below 16 batches
    assert sized[300 * plan.row_bytes][:3] == [128, 256, 304]  # 38 batches of 8: the first with 300 rows


def test_fit_with_another_take_group_size_trains_on_the_same_batches(tmp_path) -> None:
    """``take_group_bytes`` changes how rows are read, never which rows come in which batch."""
    uri = write_dataset(tmp_path / "groups.lance", 3000, fragment_rows=500, label_classes=LABELS)
    seen = [
        fit(tmp_path, make_dm(uri, "row:9", batch_size=16, take_group_bytes=size), name=f"g{size}", max_epochs=2).seen
        for size in (1, 1 << 20)
    ]
    assert seen[0] == seen[1] and len(seen[0]) == 2 * (3000 // 16)


@PURE
@given(
    runs=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 40)), min_size=1, max_size=6), most=st.integers(1, 4)
)
def test_contiguous_ranges_rebuild_the_positions(runs: list[tuple[int, int]], most: int) -> None:
    positions = np.concatenate([np.arange(first, first + rows) for first, rows in runs])
    true_runs = 1 + int(np.count_nonzero(np.diff(positions) != 1))
    ranges = contiguous_ranges(positions, most)
    if true_runs > most:
        assert ranges is None
    else:
        assert ranges is not None and len(ranges) == true_runs
        rebuilt = np.concatenate([np.arange(first, first + rows) for first, rows in ranges])
        assert np.array_equal(rebuilt, positions)


def test_read_batch_rows_hold_about_two_mib() -> None:
    assert read_batch_rows(528) == 4096  # id, label and a 128-float vector
    assert read_batch_rows(2506) == 1024  # a 64x64 JPEG
    assert read_batch_rows(10 << 20) == 64  # never fewer rows
    assert read_batch_rows(8) == 8192  # never more


def test_filtered_groups_start_at_one_batch_and_any_read_gives_the_planned_rows(tmp_path, monkeypatch) -> None:
    """With a filter, the first group of an iteration is one batch (read on the consuming thread)
    and the next full size; the groups of a filtered scan plan hold the same rows whether they are
    read as the span their rows lie in (in windows, the other rows dropped) or by a scan restricted
    to their rows, in the planned order, for storage order, shards and a shuffle buffer."""
    monkeypatch.setattr(lance_io, "SPAN_WINDOW_ROWS", 700)  # several windows per group
    monkeypatch.setattr(reader, "MAX_GROUP_ROWS", 1000)  # several groups per epoch
    uri = write_dataset(tmp_path / "filtered.lance", 12_000, fragment_rows=5000, label_classes=LABELS)
    lance.dataset(uri).delete("id % 97 = 5")
    live = lance.dataset(uri).to_table(columns=["id"]).column(0).to_numpy()  # id of each position
    for strategy in (
        NoShuffle(),
        ShardShuffle(shard_rows=512, seed=1),
        BufferShuffle(buffer_rows=1024, shard_rows=128, seed=2),
    ):
        source = pin_source(LanceSource(uri, columns=["id", "label", "vec"], filter="label < 6"), "train")
        plan = plan_of("train", source, strategy, FilterRead(), 64, False)
        assert plan.method == "scan"
        order = plan.order(1)
        read = {}
        for density in (0.0, 2.0):  # every group by span, every group by a restricted scan
            monkeypatch.setattr(reader, "SPAN_READ_DENSITY", density)
            pieces = PlanReader(plan, epoch=1, world_size=1, rank=0, start=0)
            assert pieces.first_inline and pieces.first_group_rows == 64
            groups = list(pieces.groups(range(pieces.layout.steps)))
            sizes = [sum(len(spec.positions) for spec in group) for group in groups]
            assert sizes[0] == 64 and len(sizes) > 3 and all(size >= pieces.group_rows > 64 for size in sizes[1:-1])
            read[density] = []
            for group in groups:
                for spec, (step, table) in zip(group, pieces.read_group(group)):
                    expected = plan.row_positions(order.matched_indices(pieces.layout.batch_rows(0, step)))
                    ids = table.column("id").to_numpy()
                    assert step == spec.step and np.array_equal(ids, live[expected])
                    read[density].append(ids)
        assert all(np.array_equal(a, b) for a, b in zip(read[0.0], read[2.0]))


def test_row_bytes_of_fixed_width_columns_come_from_the_schema(tmp_path) -> None:
    """Fixed-width columns are sized from the schema (no read at setup); a variable-width one by
    the 64-row sample, as before."""
    from types import SimpleNamespace

    from lance_lightning.plan import survey

    uri = write_dataset(tmp_path / "widths.lance", 100, extra={"name": [f"row {i}" for i in range(100)]})
    dataset = lance.dataset(uri)

    def no_read(*args, **kwargs):
        raise AssertionError("fixed-width columns are sized without a read")

    fixed = pin_source(LanceSource(uri, columns=["id", "label", "x", "vec"]), "train")
    assert survey._row_bytes(SimpleNamespace(schema=dataset.schema, scanner=no_read), fixed) == 8 + 8 + 4 + 32
    sample = dataset.to_table(columns=["id", "label", "x", "vec"], limit=64)
    assert survey._row_bytes(dataset, fixed) == -(-sample.nbytes // sample.num_rows)
    mixed = pin_source(LanceSource(uri, columns=["id", "name"]), "train")
    sample = dataset.to_table(columns=["id", "name"], limit=64)
    assert survey._row_bytes(dataset, mixed) == -(-sample.nbytes // sample.num_rows)
