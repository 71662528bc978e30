"""Property tests of the plan on real data: each epoch read once, in the planned order, on every topology.

What the tests establish, on Lance datasets written once per module and read through
`LanceIterableDataset` and `PlanReader` for every rank (and simulated DataLoader workers):
- every rank yields the same number of batches, each batch holds the planned rows with every
  column of the same row, and the epoch's rows come once apart from the documented tail, for any
  filter, filter read method (scan or take), strategy, world size, batch size and thread count;
- the reads are deterministic, the number of DataLoader workers changes nothing, the global order
  is the single-rank order, and a new epoch reorders the rows of shuffling strategies;
- a read resumed at ``rows_after(k)`` on any world size yields exactly the remaining rows;
- real forkserver DataLoader workers (ours, and a plain torch `DataLoader`) yield the same batches
  as the in-process reads (a few parametrized cases: they are slow to start).
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
from lance_lightning.plan.planner import check_fits
from lance_lightning.read.reader import (
    PlanReader,
)
from lance_lightning.source import pin_source
from tests.helpers import VEC_DIM, plan_of, write_dataset
from tests.plan_strategies import enough_units, shuffle_strategies

REAL = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


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
        steps = [s for run in reader.layout.worker_steps(w, workers) for s in run]
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
