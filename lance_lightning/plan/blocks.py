"""Mixture blocks, pure: integer counts per block from weights, and each block's slots.

Guarantees:
- `block_counts`: weights become integer counts ``k_j`` per block of ``K`` positions (largest
  remainder, every count >= 1), so each whole block holds exactly ``k_j`` samples of source ``j``;
  a weight too small for ``K`` is a `ConfigError` naming it.
- `block_slots`: for a block keyed by its seed, epoch and index, each offset's source and how many
  earlier offsets of the block hold that source (a keyed bijection of the offsets: O(``K``) work,
  cached for the few blocks in use).
- `pass_epoch`: the epoch key of a source's order on a later pass through it within one epoch.
- `epoch_positions`: positions per epoch under either epoch rule.
"""

from __future__ import annotations

import functools

import numpy as np

from lance_lightning.errors import ConfigError
from lance_lightning.plan.bijection import derive_key, permute


def block_counts(weights: list[float], block: int, names: list[str]) -> list[int]:
    """Integer counts per ``block`` positions proportional to ``weights`` (largest remainder),
    each >= 1; a `ConfigError` names a weight too small for ``block``."""
    total = float(sum(weights))
    exact = [w / total * block for w in weights]
    counts = [int(x) for x in exact]
    left = block - sum(counts)
    by_remainder = sorted(range(len(weights)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in by_remainder[:left]:
        counts[j] += 1
    for j, count in enumerate(counts):
        if count < 1:
            raise ConfigError(
                f"weights[{j}]",
                weights[j],
                f"source '{names[j]}' gets no sample in a block of {block} (share {weights[j] / total:.2e})",
                f"raise its weight to {total / block:.3g} or more, or `block` above {int(total / weights[j]) + 1}",
            )
    return counts


@functools.lru_cache(maxsize=16)
def block_slots(key: int, block: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For each offset of a block keyed by ``key``: its source, and how many earlier offsets of the
    block hold that source (read-only arrays of ``block`` int64)."""
    slot = permute(np.arange(block, dtype=np.int64), block, key)
    starts = np.cumsum([0, *counts])
    source = np.searchsorted(starts, slot, side="right") - 1
    order = np.argsort(source, kind="stable")  # offsets grouped by source, in offset order
    rank = np.empty(block, dtype=np.int64)
    rank[order] = np.arange(block) - np.repeat(starts[:-1], counts)
    source.flags.writeable = rank.flags.writeable = False
    return source, rank


def pass_epoch(epoch: int, pass_: int) -> int:
    """The epoch key of a source's order on its pass ``pass_`` through mixture epoch ``epoch``:
    the first pass reads the source's own epoch order."""
    return epoch if pass_ == 0 else derive_key(epoch, pass_)


def epoch_positions(rule: str, samples: int | None, rows: list[int], counts: list[int] | None, block: int) -> int:
    """Positions per epoch: whole blocks until the first source runs out, or ``samples``."""
    if rule == "samples":
        if samples is None:
            raise ValueError("epoch='samples' needs the samples per epoch; samples is None")
        return int(samples)
    if counts is None:
        raise ValueError(f"epoch={rule!r} needs fixed weights (counts per block); counts is None")
    return min(n // k for n, k in zip(rows, counts)) * block
