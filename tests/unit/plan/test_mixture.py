"""The mixture map (`lance_lightning.plan.mixture`): counts per block, a bijection onto draws,
deterministic, proportions within 1% of the weights, repeated sources re-permuted per pass."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning.errors import ConfigError
from lance_lightning.plan.blocks import block_counts, epoch_positions
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.strategies import NoShuffle, RowShuffle, ShuffleStrategy
from lance_lightning.source import PinnedSource


def _plan(rows: int, strategy: ShuffleStrategy, name: str) -> ReadPlan:
    source = PinnedSource(uri=f"/data/{name}.lance", version=1, columns=("id",), filter=None, total_rows=rows)
    return ReadPlan("train", source, strategy, "take", rows, 8, False, "test")


def _mixture(
    rows: list[int], weights: list[float], block: int, strategy: ShuffleStrategy, samples: int | None = None
) -> MixturePlan:
    names = [f"s{j}" for j in range(len(rows))]
    counts = block_counts(weights, block, names)
    rule = "samples" if samples else "first_exhausted"
    positions = epoch_positions(rule, samples, rows, counts, block)
    plans = tuple(_plan(n, strategy, name) for n, name in zip(rows, names))
    return MixturePlan(
        "train", plans, tuple(names), tuple(weights), tuple(counts), block, rule, samples, strategy, 8, False, positions
    )


def test_block_counts_largest_remainder():
    assert block_counts([0.7, 0.3], 10_000, ["a", "b"]) == [7000, 3000]
    assert block_counts([1, 1, 1], 10, ["a", "b", "c"]) == [4, 3, 3]
    assert block_counts([0.5, 0.25, 0.25], 7, ["a", "b", "c"]) == [3, 2, 2]  # remainders .5, .75, .75
    assert sum(block_counts([0.123, 0.456, 0.421], 997, ["a", "b", "c"])) == 997


def test_block_counts_refuses_a_weight_too_small_for_the_block():
    with pytest.raises(ConfigError) as info:
        block_counts([1.0, 1e-6], 100, ["web", "tiny"])
    assert info.value.param == "weights[1]" and "tiny" in str(info.value) and "block" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    raw=st.lists(st.integers(1, 20), min_size=4, max_size=4),
    block=st.integers(4, 64),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
    extra=st.integers(0, 200),
)
def test_every_draw_exactly_once_and_deterministic(rows, raw, block, seed, epoch, extra):
    weights = [float(w) for w in raw[: len(rows)]]
    if block < len(rows):
        block = len(rows)
    try:
        counts = block_counts(weights, block, [str(j) for j in range(len(rows))])
    except ConfigError:
        return
    first_exhausted = min(n // k for n, k in zip(rows, counts)) * block
    samples = first_exhausted + extra if extra else None
    plan = _mixture(rows, weights, block, RowShuffle(seed=seed), samples=samples)
    positions = np.arange(plan.matched_rows)
    source, draw = plan.draws(epoch, positions)
    pairs = set(zip(source.tolist(), draw.tolist()))
    assert len(pairs) == plan.matched_rows  # injective: each (source, draw) at most once
    whole = plan.matched_rows // block * block
    for j, k in enumerate(counts):  # whole blocks: draws 0..blocks*k_j-1 of each source, each once
        assert sorted(draw[:whole][source[:whole] == j].tolist()) == list(range(whole // block * k))
    again = plan.draws(epoch, positions[::-1])
    assert np.array_equal(again[0][::-1], source) and np.array_equal(again[1][::-1], draw)
    # any subset of positions maps the same as the whole epoch (O(1) per position)
    some = positions[(positions * 7919) % max(1, plan.matched_rows) < plan.matched_rows // 3]
    assert np.array_equal(plan.draws(epoch, some)[1], draw[some])
    if samples is None:  # first_exhausted: one pass, so the rows of each source are distinct too
        src, rows_at = plan.units(epoch, positions)
        assert len(set(zip(src.tolist(), rows_at.tolist()))) == plan.matched_rows


def test_epoch_proportions_within_one_percent_of_the_weights():
    weights = [0.55, 0.3, 0.15]
    plan = _mixture([60_000, 50_000, 40_000], weights, 10_000, RowShuffle(seed=3))
    assert plan.matched_rows == 100_000  # first source exhausted after 10 blocks of 5,500
    source, _ = plan.draws(0, np.arange(plan.matched_rows))
    shares = np.bincount(source, minlength=3) / plan.matched_rows
    assert np.abs(shares - weights).max() < 0.01
    # and the first 1,000 samples are mixed already (slots are shuffled inside a block)
    early = np.bincount(source[:1000], minlength=3) / 1000
    assert np.abs(early - weights).max() < 0.06
    assert plan.source_rows(0, 12_345) == np.bincount(source[:12_345], minlength=3).tolist()


def test_orders_depend_on_seed_and_epoch():
    a = _mixture([500, 500], [0.5, 0.5], 100, RowShuffle(seed=1))
    b = _mixture([500, 500], [0.5, 0.5], 100, RowShuffle(seed=2))
    p = np.arange(a.matched_rows)
    assert not np.array_equal(a.draws(0, p)[0], b.draws(0, p)[0])
    assert not np.array_equal(a.draws(0, p)[0], a.draws(1, p)[0])
    assert np.array_equal(a.units(0, p)[1], _mixture([500, 500], [0.5, 0.5], 100, RowShuffle(seed=1)).units(0, p)[1])


def test_a_repeated_source_is_re_permuted_each_pass_or_repeats_in_storage_order():
    # source 1 has 10 rows and half of 400 samples: 20 passes through it
    shuffled = _mixture([1000, 10], [0.5, 0.5], 20, RowShuffle(seed=0), samples=400)
    source, rows = shuffled.units(0, np.arange(400))
    small = rows[source == 1]
    passes = [small[i : i + 10].tolist() for i in range(0, 200, 10)]
    draws = shuffled.draws(0, np.arange(400))[1][source == 1]
    by_pass = {}
    for d, r in zip(draws.tolist(), small.tolist()):
        by_pass.setdefault(d // 10, []).append(r)
    assert all(sorted(rows_) == list(range(10)) for rows_ in by_pass.values())  # each pass: every row once
    orders = {tuple(r for _, r in sorted(zip(draws[draws // 10 == p], small[draws // 10 == p]))) for p in by_pass}
    assert len(orders) > 1  # re-permuted pass by pass
    assert len(passes) == 20
    plain = _mixture([1000, 10], [0.5, 0.5], 20, NoShuffle(), samples=400)
    source, rows = plain.units(0, np.arange(400))
    draws = plain.draws(0, np.arange(400))[1]
    assert np.array_equal(rows[source == 1], draws[source == 1] % 10)  # storage order on every pass
