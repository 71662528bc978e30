"""Hypothesis strategies shared by the plan's property tests (tests/unit/plan/test_*properties.py,
test_read_groups.py): any shuffle strategy, seeds, and whether an epoch reorders rows. Each draw is
a valid configuration (a buffer holds at least one shard)."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from lance_lightning import BufferShuffle, NoShuffle, RowShuffle, ShardShuffle
from lance_lightning.plan.order import EpochOrder

PURE = settings(max_examples=150, deadline=None)  # property tests without I/O

seeds = st.integers(0, 2**31 - 1)


@st.composite
def buffer_shuffles(draw: st.DrawFn, max_rows: int = 400) -> Any:
    shard = draw(st.integers(1, max_rows // 2))
    buffer = draw(st.integers(shard, max_rows))
    return BufferShuffle(buffer_rows=buffer, seed=draw(seeds), shard_rows=shard)


def shuffle_strategies(max_rows: int = 400) -> st.SearchStrategy[Any]:
    """Any `ShuffleStrategy`, with shards and buffers of up to ``max_rows`` rows."""
    return st.one_of(
        st.just(NoShuffle()),
        st.builds(ShardShuffle, shard_rows=st.integers(1, max_rows), seed=seeds, shuffle_within_shard=st.booleans()),
        st.builds(RowShuffle, seed=seeds, clump_rows=st.integers(1, 32)),
        buffer_shuffles(max_rows),
    )


def enough_units(matched: int, strategy: Any) -> bool:
    """True when a new epoch reorders rows with overwhelming probability (>= 12 permuted items)."""
    order = EpochOrder(matched, strategy, 0)
    if isinstance(strategy, NoShuffle):
        return False
    if order.units >= 12:
        return True
    if isinstance(strategy, ShardShuffle) and strategy.shuffle_within_shard and order.unit_rows >= 12:
        return True
    return isinstance(strategy, BufferShuffle) and min(strategy.buffer_rows, matched) >= 12
