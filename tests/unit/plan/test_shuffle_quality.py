"""How well each shuffle strategy mixes a dataset stored sorted by label.

The score of a strategy is its mean per-batch label entropy divided by the mean per-batch entropy
of a perfect shuffle (uniform random permutations of the same labels, same batch size): 1.0 mixes
like a perfect shuffle, storage order of sorted data scores near 0. Batches are read for real
from a Lance dataset through `LanceIterableDataset`. The table is printed and written to
``benchmarks/results/shuffle_quality.md`` for the docs.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from lance_lightning import (
    BufferShuffle,
    LanceIterableDataset,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    ShuffleStrategy,
)
from lance_lightning.source import pin_source
from tests.helpers import plan_of, write_dataset

ROWS = 20_000
CLASSES = 100
BATCH_SIZE = 256
EPOCHS = (0, 1)
REFERENCE_PERMUTATIONS = 8
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "shuffle_quality.md"

STRATEGIES: list[tuple[str, ShuffleStrategy]] = [
    ("NoShuffle()", NoShuffle()),
    ("ShardShuffle() (8192-row shards)", ShardShuffle(seed=0)),
    ("ShardShuffle(shard_rows=256)", ShardShuffle(256, seed=0)),
    ("ShardShuffle(shard_rows=256, shuffle_within_shard=True)", ShardShuffle(256, seed=0, shuffle_within_shard=True)),
    ("BufferShuffle() (16384-row buffer, 1024-row shards)", BufferShuffle(seed=0)),
    ("BufferShuffle(buffer_rows=4096, shard_rows=64)", BufferShuffle(4096, seed=0, shard_rows=64)),
    ("RowShuffle(clump_rows=64)", RowShuffle(seed=0, clump_rows=64)),
    ("RowShuffle(clump_rows=8)", RowShuffle(seed=0, clump_rows=8)),
    ("RowShuffle()", RowShuffle(seed=0)),
]


def batch_entropy(labels: np.ndarray) -> float:
    """Shannon entropy (bits) of the label distribution of one batch."""
    _, counts = np.unique(labels, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def mean_batch_entropy(batches: list[np.ndarray]) -> float:
    return float(np.mean([batch_entropy(b) for b in batches]))


def perfect_shuffle_entropy(
    labels: np.ndarray, batch_size: int, permutations: int = REFERENCE_PERMUTATIONS, seed: int = 1234
) -> float:
    """Expected mean per-batch entropy of uniformly shuffled ``labels`` (full batches only)."""
    rng = np.random.default_rng(seed)
    full = len(labels) // batch_size * batch_size
    values = []
    for _ in range(permutations):
        shuffled = rng.permutation(labels)[:full].reshape(-1, batch_size)
        values.append(mean_batch_entropy(list(shuffled)))
    return float(np.mean(values))


def shuffle_score(batches: list[np.ndarray], reference: float) -> float:
    """Mean per-batch label entropy relative to a perfect shuffle's (1.0 = as mixed as random)."""
    return mean_batch_entropy(batches) / reference


@pytest.fixture(scope="module")
def sorted_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(
        tmp_path_factory.mktemp("quality") / "sorted.lance",
        ROWS,
        fragment_rows=4096,
        sorted_labels=True,
        label_classes=CLASSES,
    )


def read_label_batches(uri: str, strategy: ShuffleStrategy, epoch: int) -> list[np.ndarray]:
    plan = plan_of("train", pin_source(LanceSource(uri, columns=["label"]), "train"), strategy, None, BATCH_SIZE, True)
    dataset = LanceIterableDataset(plan, reader_threads=2)
    dataset.set_epoch(epoch)
    return [batch["label"].numpy() for batch in dataset]


def test_scoring_function_separates_sorted_from_shuffled() -> None:
    labels = np.repeat(np.arange(CLASSES), ROWS // CLASSES)
    reference = perfect_shuffle_entropy(labels, BATCH_SIZE)
    assert 6.0 < reference < np.log2(CLASSES)
    sorted_batches = list(labels[: len(labels) // BATCH_SIZE * BATCH_SIZE].reshape(-1, BATCH_SIZE))
    assert shuffle_score(sorted_batches, reference) < 0.2
    shuffled = np.random.default_rng(7).permutation(labels)
    shuffled_batches = list(shuffled[: len(labels) // BATCH_SIZE * BATCH_SIZE].reshape(-1, BATCH_SIZE))
    assert 0.98 < shuffle_score(shuffled_batches, reference) < 1.02
    assert batch_entropy(np.array([3, 3, 3])) == 0.0
    assert batch_entropy(np.array([1, 2, 3, 4])) == pytest.approx(2.0)


def test_shuffle_quality_table(sorted_uri: str) -> None:
    labels = np.repeat(np.arange(CLASSES), ROWS // CLASSES)
    assert len(labels) == ROWS
    reference = perfect_shuffle_entropy(labels, BATCH_SIZE)
    rows = []
    scores: dict[str, float] = {}
    for name, strategy in STRATEGIES:
        epoch_scores, distinct = [], []
        for epoch in EPOCHS:
            batches = read_label_batches(sorted_uri, strategy, epoch)
            assert len(batches) == ROWS // BATCH_SIZE and all(len(b) == BATCH_SIZE for b in batches)
            # A real epoch: every label appears as often as stored, apart from the dropped tail.
            counts = np.bincount(np.concatenate(batches), minlength=CLASSES)
            assert counts.sum() == ROWS - ROWS % BATCH_SIZE and counts.max() <= ROWS // CLASSES
            epoch_scores.append(shuffle_score(batches, reference))
            distinct.append(np.mean([len(np.unique(b)) for b in batches]))
        scores[name] = float(np.mean(epoch_scores))
        rows.append((name, scores[name], float(np.mean(distinct))))

    perfect_distinct = np.mean(
        [
            len(np.unique(b))
            for b in np.random.default_rng(0)
            .permutation(labels)[: ROWS // BATCH_SIZE * BATCH_SIZE]
            .reshape(-1, BATCH_SIZE)
        ]
    )
    table = [
        "# Shuffle quality",
        "",
        f"Dataset stored sorted by label: {ROWS:,} rows, {CLASSES} classes of {ROWS // CLASSES} rows, "
        f"batch size {BATCH_SIZE}, one rank, drop_last. Score = mean per-batch label entropy / that of a "
        f"perfect shuffle ({reference:.3f} bits, mean of {REFERENCE_PERMUTATIONS} random permutations); "
        f"mean over epochs {list(EPOCHS)}. Written by `tests/unit/plan/test_shuffle_quality.py` "
        f"(Python {platform.python_version()}).",
        "",
        "| Strategy | Score | Distinct labels per batch |",
        "|---|---:|---:|",
        *(f"| `{name}` | {score:.3f} | {distinct:.1f} |" for name, score, distinct in rows),
        f"| perfect shuffle (reference) | 1.000 | {perfect_distinct:.1f} |",
        "",
    ]
    text = "\n".join(table)
    print("\n" + text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)

    assert scores["RowShuffle()"] >= 0.95
    assert scores["NoShuffle()"] < 0.3
    # More mixing where the strategy promises it.
    assert scores["RowShuffle()"] > scores["RowShuffle(clump_rows=8)"] > scores["RowShuffle(clump_rows=64)"]
    assert scores["ShardShuffle(shard_rows=256)"] > scores["ShardShuffle() (8192-row shards)"] - 0.05
    assert scores["BufferShuffle() (16384-row buffer, 1024-row shards)"] > scores["ShardShuffle() (8192-row shards)"]
    assert scores["ShardShuffle(shard_rows=256, shuffle_within_shard=True)"] >= scores["ShardShuffle(shard_rows=256)"]
