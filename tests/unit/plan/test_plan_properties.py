"""Property tests of the read plan: epoch order, batch layout, resume, and real reads.

Two layers:
- pure (`EpochOrder`, `Layout`): many examples, no I/O;
- real data: a few Lance datasets written once per module, read through `LanceIterableDataset`
  and `PlanReader` for every rank (and simulated DataLoader workers), plus a few parametrized
  cases with real forkserver DataLoader workers.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lance_lightning import (
    BufferShuffle,
    ConfigError,
    FilterRead,
    LanceDataLoader,
    LanceIterableDataset,
    LanceMapDataset,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    ShuffleStrategy,
)
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.order import EpochOrder
from lance_lightning.plan.planner import check_fits
from lance_lightning.read import lance_io
from lance_lightning.read.reader import (
    MAX_RANGE_SCANS,
    TAKE_GROUP_BYTES,
    PlanReader,
    contiguous_ranges,
    read_batch_rows,
)
from lance_lightning.source import pin_source
from tests.harness import fit, make_dm
from tests.helpers import VEC_DIM, plan_of, write_dataset

PURE = settings(max_examples=150, deadline=None)
REAL = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

# -- strategies ------------------------------------------------------------------------------

seeds = st.integers(0, 2**31 - 1)


@st.composite
def buffer_shuffles(draw: st.DrawFn, max_rows: int = 400) -> BufferShuffle:
    shard = draw(st.integers(1, max_rows // 2))
    buffer = draw(st.integers(shard, max_rows))
    return BufferShuffle(buffer_rows=buffer, seed=draw(seeds), shard_rows=shard)


def shuffle_strategies(max_rows: int = 400) -> st.SearchStrategy[ShuffleStrategy]:
    return st.one_of(
        st.just(NoShuffle()),
        st.builds(ShardShuffle, shard_rows=st.integers(1, max_rows), seed=seeds, shuffle_within_shard=st.booleans()),
        st.builds(RowShuffle, seed=seeds, clump_rows=st.integers(1, 32)),
        buffer_shuffles(max_rows),
    )


def full_order(matched: int, strategy: ShuffleStrategy, epoch: int) -> np.ndarray:
    return EpochOrder(matched, strategy, epoch).matched_indices(np.arange(matched))


def enough_units(matched: int, strategy: ShuffleStrategy) -> bool:
    """True when a new epoch reorders rows with overwhelming probability (>= 12 permuted items)."""
    order = EpochOrder(matched, strategy, 0)
    if isinstance(strategy, NoShuffle):
        return False
    if order.units >= 12:
        return True
    if isinstance(strategy, ShardShuffle) and strategy.shuffle_within_shard and order.unit_rows >= 12:
        return True
    return isinstance(strategy, BufferShuffle) and min(strategy.buffer_rows, matched) >= 12


# -- pure layer: EpochOrder ------------------------------------------------------------------


@PURE
@given(matched=st.integers(1, 3000), strategy=shuffle_strategies(), epoch=st.integers(0, 10**6))
def test_order_is_a_permutation(matched: int, strategy: ShuffleStrategy, epoch: int) -> None:
    order = full_order(matched, strategy, epoch)
    assert order.dtype.kind == "i"
    assert np.array_equal(np.sort(order), np.arange(matched))
    if isinstance(strategy, NoShuffle):
        assert np.array_equal(order, np.arange(matched))


@PURE
@given(matched=st.integers(1, 3000), strategy=shuffle_strategies(), epoch=st.integers(0, 1000), data=st.data())
def test_order_is_deterministic_and_seekable(
    matched: int, strategy: ShuffleStrategy, epoch: int, data: st.DataObject
) -> None:
    whole = full_order(matched, strategy, epoch)
    # A new object (as in another process) gives the same order ...
    assert np.array_equal(whole, EpochOrder(matched, strategy, epoch).matched_indices(np.arange(matched)))
    # ... and any window or scattered set of positions is computed directly, without the prefix.
    a = data.draw(st.integers(0, matched - 1), label="a")
    b = data.draw(st.integers(a, matched), label="b")
    fresh = EpochOrder(matched, strategy, epoch)
    assert np.array_equal(fresh.matched_indices(np.arange(a, b)), whole[a:b])
    picks = np.array(data.draw(st.lists(st.integers(0, matched - 1), max_size=50), label="picks"), dtype=np.int64)
    assert np.array_equal(EpochOrder(matched, strategy, epoch).matched_indices(picks), whole[picks])


@PURE
@given(matched=st.integers(50, 3000), strategy=shuffle_strategies(), epoch=st.integers(0, 1000))
def test_epochs_differ_for_shuffling_strategies(matched: int, strategy: ShuffleStrategy, epoch: int) -> None:
    this, following = full_order(matched, strategy, epoch), full_order(matched, strategy, epoch + 1)
    if isinstance(strategy, NoShuffle):
        assert np.array_equal(this, following)
        return
    assume(enough_units(matched, strategy))
    assert not np.array_equal(this, following)


@PURE
@given(matched=st.integers(50, 3000), strategy=shuffle_strategies(), epoch=st.integers(0, 1000))
def test_seeds_differ(matched: int, strategy: ShuffleStrategy, epoch: int) -> None:
    assume(enough_units(matched, strategy))
    other = type(strategy)(
        **{**{k: v for k, v in strategy.describe().items() if k != "strategy"}, "seed": strategy.seed + 1}
    )
    assert not np.array_equal(full_order(matched, strategy, epoch), full_order(matched, other, epoch))


@PURE
@given(matched=st.integers(1, 2000), shard=st.integers(1, 300), seed=seeds, epoch=st.integers(0, 100))
def test_shard_shuffle_keeps_shards_contiguous_and_the_short_shard_last(
    matched: int, shard: int, seed: int, epoch: int
) -> None:
    """Without shuffle_within_shard every shard is one ascending run of consecutive rows (modulo
    the row count: one shard may cross the end of the rows), and a short shard comes last, so no
    batch before it straddles two shards."""
    order = full_order(matched, ShardShuffle(shard, seed), epoch)
    unit = min(shard, matched)
    for first in range(0, matched, unit):
        rows = order[first : first + unit]
        assert np.array_equal(rows, (rows[0] + np.arange(len(rows))) % matched)
    assert len(order[(matched // unit) * unit :]) == matched % unit  # the short shard fills the end


@PURE
@given(matched=st.integers(2, 2000), shard=st.integers(2, 300), seed=seeds)
def test_short_shard_rows_change_from_epoch_to_epoch(matched: int, shard: int, seed: int) -> None:
    """Shard boundaries rotate per epoch, so the short shard (and the tail drop_last skips) is not
    the same rows every epoch (64 epochs: with 2-row shards, 12 gave one rotation for 1 seed in 2048)."""
    assume(matched % shard and matched > shard)
    short = [
        frozenset(full_order(matched, ShardShuffle(shard, seed), epoch)[-(matched % shard) :].tolist())
        for epoch in range(64)
    ]
    assert len(set(short)) > 1


# -- pure layer: Layout ----------------------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    world = draw(st.integers(1, 4))
    rows = draw(st.integers(world, 1500))
    return Layout(
        start=draw(st.integers(0, 10_000)),
        rows=rows,
        world_size=world,
        batch_size=draw(st.integers(1, 64)),
        drop_last=draw(st.booleans()),
    )


def global_order(layout: Layout) -> list[np.ndarray]:
    """Per global step, the sequence positions of every rank, rank after rank."""
    return [np.concatenate([layout.batch_rows(r, s) for r in range(layout.world_size)]) for s in range(layout.steps)]


@PURE
@given(layout=layouts())
def test_layout_covers_rows_once_except_documented_tail(layout: Layout) -> None:
    W, B = layout.world_size, layout.batch_size
    for r in range(W):
        for s in range(layout.steps):
            rows = layout.batch_rows(r, s)
            assert len(rows) == (B if s < layout.full_steps else len(rows)) and len(rows) >= 1
        with pytest.raises(IndexError):
            layout.batch_rows(r, layout.steps)
    assert layout.tail_rows < W * B
    everything = np.concatenate(global_order(layout)) if layout.steps else np.array([], np.int64)
    counts = Counter(everything.tolist())
    end = layout.start + layout.rows
    if layout.drop_last:
        # Exactly the last `dropped_rows` positions are missing, nothing repeats.
        assert layout.repeated_rows == 0
        assert sorted(counts) == list(range(layout.start, end - layout.dropped_rows))
        assert set(counts.values()) <= {1}
        assert layout.dropped_rows == layout.rows % (W * B)
    else:
        assert layout.dropped_rows == 0
        assert sorted(counts) == list(range(layout.start, end))
        assert sum(counts.values()) == layout.rows + layout.repeated_rows
        assert layout.repeated_rows < W
        assert sum(c - 1 for c in counts.values()) == layout.repeated_rows
    # Every step's rows, rank after rank, come in sequence order apart from padding repeats.
    seen: list[int] = []
    for step in global_order(layout):
        for i in step.tolist():
            if i not in seen[-W * B :]:
                seen.append(i)
    expected_len = layout.rows - layout.dropped_rows
    assert seen == list(range(layout.start, layout.start + expected_len))


@PURE
@given(layout=layouts())
def test_tail_step_is_split_evenly(layout: Layout) -> None:
    assume(layout.steps > layout.full_steps)
    sizes = [len(np.unique(layout.batch_rows(r, layout.steps - 1))) for r in range(layout.world_size)]
    assert max(sizes) - min(sizes) <= 1
    distinct = np.unique(np.concatenate([layout.batch_rows(r, layout.steps - 1) for r in range(layout.world_size)]))
    assert len(distinct) == layout.tail_rows


@PURE
@given(layouts())
def test_batch_len_is_the_length_of_batch_rows(layout: Layout) -> None:
    for rank in range(layout.world_size):
        for step in range(layout.steps):
            assert layout.batch_len(rank, step) == len(layout.batch_rows(rank, step))


@PURE
@given(layout=layouts(), workers=st.integers(0, 6))
def test_worker_steps_partition_the_rank_steps(layout: Layout, workers: int) -> None:
    K = max(1, workers)
    parts = [list(layout.worker_steps(w, workers)) for w in range(K)]
    assert sorted(itertools.chain(*parts)) == list(range(layout.steps))
    # Round-robin over workers (what the DataLoader does) restores the step order.
    merged = [s for group in itertools.zip_longest(*parts) for s in group if s is not None]
    assert merged == list(range(layout.steps))


@PURE
@given(layout=layouts())
def test_rows_after_counts_distinct_rows_of_the_first_steps(layout: Layout) -> None:
    covered: set[int] = set()
    # (A layout without a single step, e.g. a resumed drop_last remainder, is consumed at once.)
    assert layout.rows_after(0) == (0 if layout.steps else layout.rows)
    for k in range(1, layout.steps + 1):
        for r in range(layout.world_size):
            covered.update(layout.batch_rows(r, k - 1).tolist())
        if k < layout.steps:
            assert layout.rows_after(k) == len(covered)
            assert covered == set(range(layout.start, layout.start + layout.rows_after(k)))
    # After the last step the whole range counts as consumed (a dropped tail is skipped for good).
    assert layout.rows_after(layout.steps) == layout.rows
    assert len(covered) == layout.rows - layout.dropped_rows


@PURE
@given(layout=layouts(), data=st.data())
def test_resume_on_any_world_size_yields_exactly_the_remaining_rows(layout: Layout, data: st.DataObject) -> None:
    """A run stopped after k steps and restarted (same or another world size) at rows_after(k)."""
    k = data.draw(st.integers(0, layout.steps), label="k")
    world2 = data.draw(st.integers(1, 4), label="world2")
    consumed = layout.rows_after(k)
    before = [i for s in global_order(layout)[:k] for i in s.tolist()]
    resumed = Layout(layout.start + consumed, layout.rows - consumed, world2, layout.batch_size, layout.drop_last)
    after = [i for s in global_order(resumed) for i in s.tolist()]
    end = layout.start + layout.rows
    if k < layout.steps:
        assert sorted(set(before)) == list(range(layout.start, layout.start + consumed))
    assert set(before).isdisjoint(after)
    union = Counter(before + after)
    missing = set(range(layout.start, end)) - set(union)
    if layout.drop_last:
        # Only a tail shorter than one step of the run that covered it is missing; nothing repeats.
        assert max(union.values(), default=1) == 1
        assert missing == set(range(end - len(missing), end))
        limit = world2 * layout.batch_size if k < layout.steps else layout.world_size * layout.batch_size
        assert len(missing) < limit
    else:
        assert not missing
    if k == layout.steps:
        assert resumed.steps == 0


# -- real data --------------------------------------------------------------------------------

ROWS = 700
FRAGMENT_ROWS = 128
LABELS = 10


@dataclass(frozen=True)
class Filter:
    sql: str | None
    mask: Callable[[np.ndarray], np.ndarray]

    def __repr__(self) -> str:
        return f"Filter({self.sql!r})"


FILTERS = [
    Filter(None, lambda ids: np.ones(len(ids), bool)),
    Filter("id % 29 = 3", lambda ids: ids % 29 == 3),  # 3.4%: selective (auto -> take)
    Filter("label != 3", lambda ids: ids % LABELS != 3),  # 90%: not selective
    Filter("id < 90 OR id >= 560", lambda ids: (ids < 90) | (ids >= 560)),  # two far-apart runs
]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(
        tmp_path_factory.mktemp("props") / "ds.lance", ROWS, fragment_rows=FRAGMENT_ROWS, label_classes=LABELS
    )


def make_plan(
    uri: str, flt: Filter, strategy: ShuffleStrategy, method: str, batch_size: int, drop_last: bool, world: int
):
    source = pin_source(LanceSource(uri, columns=["id", "label", "x", "vec"], filter=flt.sql), "train")
    plan = plan_of("train", source, strategy, FilterRead(method), batch_size, drop_last)
    check_fits(plan, world)
    return plan


def matched_ids(flt: Filter) -> np.ndarray:
    ids = np.arange(ROWS)
    return ids[flt.mask(ids)]


def check_rows(batch: dict) -> list[int]:
    """The batch's ids, after checking every column belongs to the same row."""
    ids = batch["id"]
    assert batch["label"].tolist() == (ids % LABELS).tolist()
    assert np.allclose(batch["x"].numpy(), ids.numpy().astype(np.float32) / ROWS)
    assert batch["vec"].shape == (len(ids), VEC_DIM)
    assert np.array_equal(batch["vec"][:, 0].numpy(), ids.numpy() * VEC_DIM)
    return ids.tolist()


def read_rank(plan, world: int, rank: int, epoch: int, start: int = 0, threads: int = 2) -> list[list[int]]:
    dataset = LanceIterableDataset(plan, world_size=world, rank=rank, reader_threads=threads)
    dataset.set_epoch(epoch, start)
    return [check_rows(batch) for batch in dataset]


def read_rank_as_workers(plan, world: int, rank: int, epoch: int, workers: int, start: int = 0) -> list[list[int]]:
    """What a DataLoader with ``workers`` workers yields: each worker's reader, merged round-robin."""
    streams = []
    for w in range(workers):
        reader = PlanReader(plan, epoch, world, rank, start)
        steps = reader.layout.worker_steps(w, workers)
        streams.append(
            [table.column("id").to_pylist() for group in reader.groups(steps) for _, table in reader.read_group(group)]
        )
    return [b for group in itertools.zip_longest(*streams) for b in group if b is not None]


def global_ids(per_rank: list[list[list[int]]]) -> list[int]:
    """Concatenate every global step's batches, rank after rank."""
    return [i for step in zip(*per_rank) for batch in step for i in batch]


def expected_rank(plan, world: int, rank: int, epoch: int, ids: np.ndarray, start: int = 0) -> list[list[int]]:
    layout, order = plan.layout(world, start), plan.order(epoch)
    return [ids[order.matched_indices(layout.batch_rows(rank, s))].tolist() for s in range(layout.steps)]


real_params = dict(
    flt=st.sampled_from(FILTERS),
    method=st.sampled_from(["auto", "scan", "take"]),
    strategy=shuffle_strategies(max_rows=300),
    world=st.integers(1, 4),
    batch_size=st.integers(4, 48),
    drop_last=st.booleans(),
    epoch=st.integers(0, 50),
    threads=st.integers(0, 2),
)


@REAL
@given(**real_params, workers=st.integers(2, 3))
def test_real_reads_cover_the_epoch_once_on_every_topology(
    uri: str,
    flt: Filter,
    method: str,
    strategy: ShuffleStrategy,
    world: int,
    batch_size: int,
    drop_last: bool,
    epoch: int,
    threads: int,
    workers: int,
) -> None:
    ids = matched_ids(flt)
    M = len(ids)
    batch_size = min(batch_size, M // world)
    assume(batch_size >= 1)
    plan = make_plan(uri, flt, strategy, method, batch_size, drop_last, world)
    assert plan.matched_rows == M
    if method != "auto" and flt.sql is not None and not isinstance(strategy, RowShuffle):
        assert plan.method == method
    layout = plan.layout(world)
    per_rank = [read_rank(plan, world, r, epoch, threads=threads) for r in range(world)]

    # Equal batch counts, and each batch holds the planned rows.
    assert [len(b) for b in per_rank] == [layout.steps] * world
    for r in range(world):
        assert per_rank[r] == expected_rank(plan, world, r, epoch, ids)

    # Exactly once, apart from the documented tail.
    counts = Counter(i for rank in per_rank for batch in rank for i in batch)
    assert set(counts) <= set(ids.tolist())
    if drop_last:
        assert max(counts.values()) == 1
        assert len(counts) == M - layout.dropped_rows
        assert layout.dropped_rows < world * batch_size
    else:
        assert set(counts) == set(ids.tolist())
        assert sum(counts.values()) == M + layout.repeated_rows

    # Deterministic: a second pass (another reader, other thread count) is identical.
    assert read_rank(plan, world, world - 1, epoch, threads=2 - threads) == per_rank[world - 1]

    # The number of DataLoader workers changes nothing.
    for r in range(world):
        assert read_rank_as_workers(plan, world, r, epoch, workers) == per_rank[r]

    # The global order is the single-rank order, up to the tail.
    single = global_ids([read_rank(plan, 1, 0, epoch, threads=threads)])
    combined = global_ids(per_rank)
    if drop_last:
        assert combined == single[: len(combined)]
    else:
        deduped = list(dict.fromkeys(combined))
        assert deduped == single
        assert len(single) == M

    # A new epoch reorders the rows of shuffling strategies; NoShuffle is storage order.
    following = global_ids([read_rank(plan, 1, 0, epoch + 1, threads=threads)])
    if isinstance(strategy, NoShuffle):
        assert following == single == ids[: len(single)].tolist()
    elif enough_units(M, strategy):
        assert following != single


@REAL
@given(**real_params, data=st.data())
def test_real_resume_from_rows_after_k_yields_the_remaining_rows(
    uri: str,
    flt: Filter,
    method: str,
    strategy: ShuffleStrategy,
    world: int,
    batch_size: int,
    drop_last: bool,
    epoch: int,
    threads: int,
    data: st.DataObject,
) -> None:
    ids = matched_ids(flt)
    M = len(ids)
    world2 = data.draw(st.integers(1, 4), label="world2")
    batch_size = min(batch_size, M // max(world, world2))
    assume(batch_size >= 1)
    plan = make_plan(uri, flt, strategy, method, batch_size, drop_last, max(world, world2))
    layout = plan.layout(world)
    k = data.draw(st.integers(0, layout.steps), label="k")
    per_rank = [read_rank(plan, world, r, epoch, threads=threads)[:k] for r in range(world)]
    before = global_ids(per_rank)
    start = layout.rows_after(k)
    resumed = [read_rank(plan, world2, r, epoch, start=start, threads=threads) for r in range(world2)]
    assert len({len(b) for b in resumed}) == 1
    assert len(resumed[0]) == plan.layout(world2, start).steps
    after = global_ids(resumed)

    # The uninterrupted single-rank sequence of the epoch.
    sequence = ids[plan.order(epoch).matched_indices(np.arange(M))].tolist()
    if k < layout.steps:
        assert before == sequence[:start]
    elif drop_last:
        assert before == sequence[: M - layout.dropped_rows]
    else:
        assert list(dict.fromkeys(before)) == sequence
    assert set(before).isdisjoint(after)
    remaining = sequence[start:]
    if drop_last:
        assert after == remaining[: len(after)]
        assert len(remaining) - len(after) < world2 * batch_size
    else:
        assert list(dict.fromkeys(after)) == remaining


def test_filter_method_is_honoured(uri: str) -> None:
    """Sanity for the real-data cases above: forced methods really change the plan."""
    flt = FILTERS[1]
    assert make_plan(uri, flt, ShardShuffle(16), "auto", 4, True, 1).method == "take"
    assert make_plan(uri, flt, ShardShuffle(16), "scan", 4, True, 1).method == "scan"
    assert make_plan(uri, FILTERS[2], ShardShuffle(16), "auto", 4, True, 1).method == "scan"
    assert make_plan(uri, FILTERS[2], ShardShuffle(16), "take", 4, True, 1).method == "take"
    with pytest.raises(ConfigError):
        make_plan(uri, flt, NoShuffle(), "auto", 20, True, 2)  # 25 rows < one step of 2 x 20


# -- real DataLoader workers (forkserver: slow to start, so only a few cases) ---------------------

WORKER_CASES = [
    pytest.param(FILTERS[0], RowShuffle(seed=3, clump_rows=4), 2, 2, 16, True, id="row-shuffle-W2-K2"),
    pytest.param(
        FILTERS[2], ShardShuffle(48, seed=1, shuffle_within_shard=True), 3, 2, 20, False, id="shard-filtered-W3-K2-pad"
    ),
    pytest.param(FILTERS[3], BufferShuffle(96, seed=2, shard_rows=8), 2, 3, 12, False, id="buffer-runs-W2-K3"),
]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize(("flt", "strategy", "world", "workers", "batch_size", "drop_last"), WORKER_CASES)
def test_real_dataloader_workers_keep_the_planned_order(
    uri: str, flt: Filter, strategy: ShuffleStrategy, world: int, workers: int, batch_size: int, drop_last: bool
) -> None:
    plan = make_plan(uri, flt, strategy, "auto", batch_size, drop_last, world)
    ids = matched_ids(flt)
    previous: list[int] = []
    for epoch in (0, 1):
        in_process = [read_rank(plan, world, r, epoch, threads=0) for r in range(world)]
        assert [len(b) for b in in_process] == [plan.layout(world).steps] * world
        if epoch == 1 and not isinstance(strategy, NoShuffle):
            assert global_ids(in_process) != previous
        previous = global_ids(in_process)
        for r in range(world):
            assert in_process[r] == expected_rank(plan, world, r, epoch, ids)
    loaders = [
        LanceDataLoader(
            LanceIterableDataset(plan, world_size=world, rank=r), num_workers=workers, persistent_workers=True
        )
        for r in range(world)
    ]
    try:
        for epoch in (0, 1):
            with_workers = []
            for r, loader in enumerate(loaders):
                loader.set_epoch(epoch)
                batches = [check_rows(b) for b in loader]
                assert len(batches) == len(loader)
                with_workers.append(batches)
            assert with_workers == [read_rank(plan, world, r, epoch, threads=0) for r in range(world)]
    finally:
        for loader in loaders:
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()


@pytest.mark.slow
def test_plain_torch_dataloader_with_forkserver_workers(uri: str) -> None:
    """The documented plain-DataLoader use: ``batch_size=None``, a pass-through collate, workers."""
    from torch.utils.data import DataLoader

    flt = FILTERS[1]
    plan = make_plan(uri, flt, ShardShuffle(8, seed=5), "take", 3, False, 2)
    expected = [read_rank(plan, 2, r, 7, threads=0) for r in range(2)]
    got = []
    for r in range(2):
        dataset = LanceIterableDataset(plan, world_size=2, rank=r)
        dataset.set_epoch(7)
        loader = DataLoader(
            dataset,
            batch_size=None,
            collate_fn=LanceMapDataset.collate,
            num_workers=2,
            multiprocessing_context="forkserver",
        )
        got.append([check_rows(b) for b in loader])
    assert got == expected
    assert sorted(set(global_ids(got))) == matched_ids(flt).tolist()


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
