"""Property tests of the pure plan (`EpochOrder`, `Layout`): many examples, no I/O.

What the tests establish:
- an epoch order is a permutation of the matched rows (storage order for `NoShuffle`), the same in
  any process, computed for any window or scattered positions without the prefix; another epoch
  or another seed gives another order; shard shuffles keep shards contiguous, the short shard last,
  and move the short shard's rows from epoch to epoch;
- a batch layout covers the rows once on every world size, apart from the documented tail (dropped
  with ``drop_last``, padded otherwise), splits the tail step evenly, partitions the steps over
  DataLoader workers in round-robin order, and ``rows_after(k)`` is where a run resumed on any
  world size yields exactly the remaining rows.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lance_lightning import (
    NoShuffle,
    ShardShuffle,
    ShuffleStrategy,
)
from lance_lightning.plan.layout import RUN_RAMP, Layout
from lance_lightning.plan.order import EpochOrder
from tests.plan_strategies import PURE, enough_units, seeds, shuffle_strategies


def full_order(matched: int, strategy: ShuffleStrategy, epoch: int) -> np.ndarray:
    return EpochOrder(matched, strategy, epoch).matched_indices(np.arange(matched))


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
@given(layout=layouts(), workers=st.integers(0, 6), chunk=st.integers(1, 40), ramp=st.booleans())
def test_worker_steps_partition_the_rank_steps(layout: Layout, workers: int, chunk: int, ramp: bool) -> None:
    K = max(1, workers)
    parts = [layout.worker_steps(w, workers, chunk=chunk, ramp=ramp) for w in range(K)]
    # Round-robin over workers, one run per item (what the DataLoader does), restores the step order.
    ordered = [run for items in itertools.zip_longest(*parts) for run in items if run is not None]
    assert [s for run in ordered for s in run] == list(range(layout.steps))
    # Runs are `chunk` steps (with `ramp`, first 1, RUN_RAMP, ... steps, a round of the workers
    # each, up to `chunk`); only the last is shorter.
    length = (lambda j: min(chunk, RUN_RAMP ** (j // K))) if ramp else (lambda j: chunk)
    assert all(len(run) == length(j) for j, run in enumerate(ordered[:-1]))


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
