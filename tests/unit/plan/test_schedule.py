"""Mixture schedules (`lance_lightning.plan.schedule`, `MixturePlan` with a schedule): per-block
counts within 1/K of the weights scheduled at the block's first sample, every (source, draw) once
per epoch in draw order, linear stages moving monotonically, a one-stage schedule drawing exactly
as static weights, the scheduled shares, the plan's identity and its resume policy, ``explain``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning.cursor.position import first_difference
from lance_lightning.plan.blocks import block_counts
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.schedule import MixtureSchedule, epoch_blocks, parse_schedule
from lance_lightning.plan.strategies import NoShuffle, RowShuffle, ShuffleStrategy
from lance_lightning.source import PinnedSource


def _plan(rows: int, strategy: ShuffleStrategy, name: str) -> ReadPlan:
    source = PinnedSource(uri=f"/data/{name}.lance", version=1, columns=("id",), filter=None, total_rows=rows)
    return ReadPlan("train", source, strategy, "take", rows, 8, False, "test")


def _scheduled(
    rows: list[int],
    schedule: MixtureSchedule,
    block: int,
    samples: int,
    strategy: ShuffleStrategy,
    policy: str = "refuse",
) -> MixturePlan:
    names = tuple(f"s{j}" for j in range(len(rows)))
    plans = tuple(_plan(n, strategy, name) for n, name in zip(rows, names))
    return MixturePlan(
        "train", plans, names, (), (), block, "samples", samples, strategy, 8, False, samples,
        schedule=schedule, on_schedule_change=policy,
    )  # fmt: skip


def _expected_shares(schedule: MixtureSchedule, g: int) -> np.ndarray:
    """The shares at sample ``g``, written out from the docs (not through `shares_at`)."""
    shares = [np.asarray(w) / sum(w) for w in schedule.weights]
    starts = [0, *schedule.ends]
    stage = sum(1 for end in schedule.ends if end <= g)
    if schedule.interpolate == "constant" or stage == len(schedule.ends):
        return shares[stage]
    t = (g - starts[stage]) / (schedule.ends[stage] - starts[stage])
    return shares[stage] + (shares[stage + 1] - shares[stage]) * t


@st.composite
def schedules(draw: st.DrawFn, sources: int) -> MixtureSchedule:
    stages = draw(st.integers(1, 4))
    weights = []
    for _ in range(stages):
        stage = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0]), min_size=sources, max_size=sources))
        if not any(stage):
            stage[draw(st.integers(0, sources - 1))] = 1.0
        weights.append(stage)
    ends = sorted(draw(st.sets(st.integers(1, 3000), min_size=stages - 1, max_size=stages - 1)))
    spec = [{"until_sample": e, "weights": w} for e, w in zip(ends, weights)] + [{"weights": weights[-1]}]
    return parse_schedule(spec, draw(st.sampled_from(["constant", "linear"])), None, sources, "samples")


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    rows=st.lists(st.integers(1, 200), min_size=1, max_size=3),
    block=st.integers(3, 60),
    samples=st.integers(1, 900),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
)
def test_blocks_follow_the_schedule_and_every_draw_comes_once_in_order(data, rows, block, samples, seed, epoch):
    block = max(block, len(rows))
    schedule = data.draw(schedules(len(rows)))
    plan = _scheduled(rows, schedule, block, samples, RowShuffle(seed=seed))
    positions = np.arange(samples)
    source, draw = plan.draws(epoch, positions)
    for b in range(samples // block):  # whole blocks: counts within 1 of share x K at the first sample
        got = np.bincount(source[b * block : (b + 1) * block], minlength=len(rows))
        want = _expected_shares(schedule, epoch * samples + b * block) * block
        assert got.sum() == block and np.all(np.abs(got - want) < 1 + 1e-9), (b, got, want)
    for j in range(len(rows)):  # each source's draws: 0, 1, 2, ... along the positions, none twice
        assert draw[source == j].tolist() == list(range(int((source == j).sum())))
    some = positions[(positions * 7919) % samples < samples // 3]  # any subset maps the same (O(1) each)
    assert np.array_equal(plan.draws(epoch, some)[1], draw[some])
    assert plan.source_rows(epoch, samples) == np.bincount(source, minlength=len(rows)).tolist()
    src, units = plan.units(epoch, positions)
    for j, n in enumerate(rows):  # within each pass through a source, each row once
        mine = units[src == j]
        for first in range(0, len(mine), n):
            assert len(set(mine[first : first + n].tolist())) == len(mine[first : first + n])


@settings(max_examples=40, deadline=None)
@given(
    start=st.lists(st.integers(0, 10), min_size=2, max_size=2),
    end=st.lists(st.integers(0, 10), min_size=2, max_size=2),
    until=st.integers(50, 2000),
    block=st.integers(2, 200),
)
def test_linear_stages_move_monotonically(start, end, until, block):
    if not any(start) or not any(end):
        return
    schedule = parse_schedule(
        [{"until_sample": until, "weights": start}, {"weights": end}], "linear", None, 2, "samples"
    )
    table = epoch_blocks(schedule, 0, until + block, block)
    shares, counts = table.shares[:, 0], table.counts[:, 0]
    rising = end[0] / sum(end) >= start[0] / sum(start)
    steps = np.diff(shares) if rising else -np.diff(shares)
    assert np.all(steps >= -1e-12)  # the scheduled share moves one way only
    steps = np.diff(counts) if rising else -np.diff(counts)
    assert np.all(steps >= 0)  # and so do two sources' counts
    assert table.shares[0].tolist() == pytest.approx([w / sum(start) for w in start])
    assert table.shares[-1].tolist() == pytest.approx([w / sum(end) for w in end])  # held after the ramp


@settings(max_examples=30, deadline=None)
@given(raw=st.lists(st.integers(1, 9), min_size=2, max_size=3), block=st.integers(3, 50), seed=st.integers(0, 99))
def test_a_one_stage_schedule_draws_exactly_as_static_weights(raw, block, seed):
    weights = [float(w) for w in raw]
    names = [f"s{j}" for j in range(len(raw))]
    try:
        counts = block_counts(weights, block, names)
    except Exception:
        return
    rows, samples = [50] * len(raw), 4 * block + 7
    plans = tuple(_plan(n, RowShuffle(seed=seed), name) for n, name in zip(rows, names))
    static = MixturePlan(
        "train", plans, tuple(names), tuple(weights), tuple(counts), block, "samples", samples,
        RowShuffle(seed=seed), 8, False, samples,
    )  # fmt: skip
    schedule = parse_schedule([{"weights": weights}], "constant", None, len(raw), "samples")
    scheduled = _scheduled(rows, schedule, block, samples, RowShuffle(seed=seed))
    for epoch in (0, 2):
        positions = np.arange(samples)
        assert all(
            np.array_equal(a, b) for a, b in zip(static.draws(epoch, positions), scheduled.draws(epoch, positions))
        )
        assert all(
            np.array_equal(a, b) for a, b in zip(static.units(epoch, positions), scheduled.units(epoch, positions))
        )


def test_a_source_may_wait_at_weight_zero_and_the_boundary_is_a_sample():
    schedule = parse_schedule(
        [{"until_step": 3, "weights": [1, 0]}, {"weights": [1, 1]}], "constant", 100, 2, "samples"
    )  # 3 steps of 100 samples: sample 300
    assert schedule.ends == (300,)
    plan = _scheduled([400, 400], schedule, 50, 200, NoShuffle())
    source, draw = plan.draws(0, np.arange(200))
    assert source.tolist() == [0] * 200  # epoch 0 (samples 0..199): warm-up on source 0 alone
    source, draw = plan.draws(1, np.arange(200))  # samples 200..399: the boundary at 300 (block 2 of epoch 1)
    assert np.bincount(source[:100], minlength=2).tolist() == [100, 0]
    assert np.bincount(source[100:], minlength=2).tolist() == [50, 50]
    assert draw[source == 0].tolist() == list(range(150)) and draw[source == 1].tolist() == list(range(50))
    assert plan.source_counts(1, 150) == {"s0": 125, "s1": 25}
    assert plan.scheduled_shares(1, 150) == pytest.approx({"s0": 125 / 150, "s1": 25 / 150})
    assert plan.scheduled_shares(1, 0) == {"s0": 1.0, "s1": 0.0}


def test_identity_holds_the_schedule_by_sample_and_continue_takes_the_current_one():
    first = parse_schedule(
        [{"until_sample": 100, "weights": [1, 0]}, {"weights": [1, 1]}], "constant", None, 2, "samples"
    )
    other = parse_schedule(
        [{"until_sample": 120, "weights": [1, 0]}, {"weights": [1, 1]}], "constant", None, 2, "samples"
    )
    saved = _scheduled([50, 50], first, 10, 100, NoShuffle()).identity()
    assert "weights" not in saved
    assert saved["schedule"]["stages"] == [
        {"until_sample": 100, "weights": [1.0, 0.0]},
        {"until_sample": None, "weights": [1.0, 1.0]},
    ]
    refusing = _scheduled([50, 50], other, 10, 100, NoShuffle())
    compared = refusing.resume_identity(saved)
    assert first_difference(compared, refusing.identity(), "plan")[0] == "plan.schedule"
    continuing = _scheduled([50, 50], other, 10, 100, NoShuffle(), policy="continue")
    assert first_difference(continuing.resume_identity(saved), continuing.identity(), "plan") is None
    moved = dict(saved, samples=90)  # anything but the weights or the schedule is still compared
    assert first_difference(continuing.resume_identity(moved), continuing.identity(), "plan")[0] == "plan.samples"
    static = dict(saved, weights=[0.5, 0.5])
    del static["schedule"]
    assert first_difference(continuing.resume_identity(static), continuing.identity(), "plan") is None
    assert first_difference(static, continuing.identity(), "plan")[0] == "plan.weights"


def test_explain_lists_the_stages_with_their_sample_ranges():
    schedule = parse_schedule(
        [{"until_step": 10, "weights": [0.9, 0.1]}, {"until_sample": 700, "weights": [0.5, 0.5]}, {"weights": [0, 1]}],
        "linear",
        32,
        2,
        "samples",
    )
    text = _scheduled([500, 300], schedule, 100, 1000, RowShuffle(seed=1)).explain()
    assert "schedule (linear) over the mixture sample g = epoch x 1,000 + position" in text
    assert "stage 0: samples [0, 320) = until step 10 at 32 samples/step" in text
    assert "s0 0.9000 -> 0.5000" in text
    assert "stage 1: samples [320, 700)" in text and "stage 2: samples [700, end)" in text and "s1 1.0000" in text
