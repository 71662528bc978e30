"""Statistical and structural tests of the keyed bijection behind every epoch order.

Fixed keys and seeds make every test deterministic; a χ² test rejects at p < 1e-6 only, so a
correct uniform permutation fails none of them, while a biased one (the identity, a rotation, a
permutation that keeps neighbours together) fails by many orders of magnitude.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from lance_lightning import BufferShuffle, RowShuffle, ShardShuffle
from lance_lightning.plan.bijection import derive_key, permute, subkeys
from lance_lightning.plan.order import EpochOrder

REJECT = 1e-6
KEYS = 20000


def images(n: int, keys: np.ndarray) -> np.ndarray:
    """``out[k, i]``: where row ``i`` lands under key ``keys[k]``."""
    x = np.tile(np.arange(n), len(keys))
    return permute(x, n, np.repeat(keys, n)).reshape(len(keys), n)


def chi2_p(observed: np.ndarray) -> float:
    expected = np.full(observed.shape, observed.sum() / observed.size)
    return float(stats.chisquare(observed.ravel(), expected.ravel(), ddof=0).pvalue)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), key=st.integers(0, 2**64 - 1))
def test_permute_is_a_bijection_of_every_size(n: int, key: int) -> None:
    assert np.array_equal(np.sort(permute(np.arange(n), n, key)), np.arange(n))


def test_permute_never_materializes_the_domain() -> None:
    # 10^15 rows: only the asked positions are computed; they stay distinct and inside.
    n = 10**15
    x = np.concatenate([np.arange(50_000), n - 1 - np.arange(50_000)])
    out = permute(x, n, derive_key(3, 0, 1))
    assert len(np.unique(out)) == len(x) and out.min() >= 0 and out.max() < n


@pytest.mark.parametrize("n", [10, 16, 37])
def test_each_row_lands_anywhere_uniformly(n: int) -> None:
    landed = images(n, np.array([derive_key(seed, 0, 1) for seed in range(KEYS)], dtype=np.uint64))
    counts = np.zeros((n, n), dtype=np.int64)
    np.add.at(counts, (np.tile(np.arange(n), KEYS), landed.ravel()), 1)
    assert chi2_p(counts) > REJECT


@pytest.mark.parametrize("n", [10, 16, 37])
def test_consecutive_displacements_are_uniform_over_keys(n: int) -> None:
    landed = images(n, np.array([derive_key(seed, 1, 1) for seed in range(KEYS)], dtype=np.uint64))
    shift = (np.diff(landed, axis=1) % n).ravel()
    assert shift.min() >= 1  # a bijection never maps neighbours to one row
    counts = np.bincount(shift, minlength=n)[1:]
    assert chi2_p(counts) > REJECT


@pytest.mark.parametrize("n", [100_000, 1 << 17])
def test_consecutive_displacements_of_one_large_order_are_uniform(n: int) -> None:
    order = permute(np.arange(n), n, derive_key(7, 0, 1))
    shift = np.diff(order) % n
    counts = np.bincount(shift * 100 // n, minlength=100)
    assert chi2_p(counts) > REJECT


def _unrelated(a: np.ndarray, b: np.ndarray) -> None:
    n = len(a)
    rho = stats.spearmanr(a, b).statistic
    assert abs(rho) < 5 / np.sqrt(n)  # |z| < 5: p < 1e-6 for independent orders
    kept = np.mean(np.sign(np.diff(a)) == np.sign(np.diff(b)))  # pairs whose relative order is the same
    assert abs(kept - 0.5) < 5 * 0.5 / np.sqrt(n - 1)


def test_two_keys_give_unrelated_orders() -> None:
    n = 200_000
    _unrelated(permute(np.arange(n), n, derive_key(0, 0, 1)), permute(np.arange(n), n, derive_key(1, 0, 1)))


@pytest.mark.parametrize(
    ("strategy", "stride", "unit"),
    [
        (RowShuffle(seed=0), 1, 1),
        (RowShuffle(seed=0, clump_rows=8), 8, 8),  # clumps keep their rows together: compare clumps
        (ShardShuffle(64, seed=0, shuffle_within_shard=True), 1, 1),
        (BufferShuffle(4096, seed=0, shard_rows=64), 4096, 64),  # a window keeps its shards: compare windows
    ],
)
def test_two_epochs_and_two_seeds_give_unrelated_orders(strategy, stride: int, unit: int) -> None:
    n = 400_003
    seq = np.arange(0, n, stride)
    other_seed = type(strategy)(**{**{k: v for k, v in strategy.describe().items() if k != "strategy"}, "seed": 1})
    first = EpochOrder(n, strategy, 0).matched_indices(seq) // unit
    _unrelated(first, EpochOrder(n, strategy, 1).matched_indices(seq) // unit)
    _unrelated(first, EpochOrder(n, other_seed, 0).matched_indices(seq) // unit)


def test_row_shuffle_landing_is_uniform_over_seeds() -> None:
    # The whole order path (units, rotation-free full units), not the bijection alone.
    n, seeds = 12, 3000
    counts = np.zeros((n, n), dtype=np.int64)
    for seed in range(seeds):
        counts[np.arange(n), EpochOrder(n, RowShuffle(seed=seed), 0).matched_indices(np.arange(n))] += 1
    assert chi2_p(counts) > REJECT


def test_subkeys_differ_per_group() -> None:
    keys = subkeys(derive_key(0, 0, 2), np.arange(100_000))
    assert len(np.unique(keys)) == 100_000


def test_an_epoch_order_of_a_trillion_rows_is_tiny_and_seekable() -> None:
    for strategy in (
        RowShuffle(seed=1),
        RowShuffle(seed=1, clump_rows=64),
        ShardShuffle(seed=1),
        BufferShuffle(seed=1),
    ):
        order = EpochOrder(10**12 + 7, strategy, 3)
        assert len(pickle.dumps(order)) < 2048
        near_end = order.matched_indices(np.arange(10**12 - 4096, 10**12))
        assert len(np.unique(near_end)) == 4096 and near_end.max() < 10**12 + 7
