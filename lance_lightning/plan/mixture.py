"""Weighted mixtures of sources: mixture positions mapped to (source, unit) in O(1), pure.

Guarantees:
- Weights become integer counts ``k_j`` per block of ``K`` positions (largest remainder, every
  count >= 1), so each whole block holds exactly ``k_j`` samples of source ``j``: proportions are
  within ``1/K`` of the weights over whole blocks.
- Position ``p`` of epoch ``e`` lies in block ``b = p // K``; its slot is a keyed bijection of
  ``p % K`` over ``[0, K)`` keyed by (seed, e, b); the slot's bucket in the cumulative counts is
  its source ``j``. The position takes source ``j``'s next draw: ``d = b * k_j + r``, where ``r``
  counts the positions before it in the block that hold source ``j``. Draw ``d`` is unit
  ``d % n_j`` of the source's own epoch order for epoch key (e, ``d // n_j``): a source drawn
  more than once per epoch is re-permuted each pass (in storage order under `NoShuffle`).
- So each source's draws come in its own order, without a gap or a repeat, in whole and partial
  blocks alike; (source, local draw) pairs of an epoch are distinct; the map is deterministic for
  (seed, epoch) and pure. A block's slots cost O(``K``) work, computed once per block read
  (O(1) per position over a read) and cached for the few blocks in use; nothing is built per epoch.
- `MixturePlan` is one sequence of ``matched_rows`` positions: the `Layout`, the cursor, the
  loader length and elastic resume treat it as they treat one source's plan. Its identity holds
  every source's identity, the weights, names, ``K`` and the epoch rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lance_lightning.errors import ConfigError
from lance_lightning.plan.bijection import derive_key, permute, subkeys
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.strategies import ShuffleStrategy

_SLOTS = 5  # key stream of the in-block slot permutation (EpochOrder uses 1..4)


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


@dataclass(frozen=True)
class MixturePlan:
    """The train plan of a mixture: ``matched_rows`` positions over the sources' own plans."""

    split: str
    plans: tuple[ReadPlan, ...]
    names: tuple[str, ...]
    weights: tuple[float, ...]
    counts: tuple[int, ...]
    block: int
    epoch_rule: str
    samples: int | None
    strategy: ShuffleStrategy
    batch_size: int
    drop_last: bool
    matched_rows: int
    pad: bool = True
    method: str = field(default="take", compare=False)
    reason: str = field(default="mixture: each batch takes its rows from every source it draws", compare=False)
    matches: None = field(default=None, compare=False)

    # -- what the cursor, layout and readers use -----------------------------------------------
    @property
    def source(self) -> Any:
        """The first source (all sources read the same columns with the same types)."""
        return self.plans[0].source

    @property
    def sources(self) -> tuple[Any, ...]:
        """Each source's pinned source, in ``source`` column order."""
        return tuple(plan.source for plan in self.plans)

    @property
    def row_bytes(self) -> int:
        return max(plan.row_bytes for plan in self.plans)

    @property
    def unit(self) -> str:
        """What the mixture's sequence counts: samples (rows, or windows with packing, of any source)."""
        return "sample"

    @property
    def packed(self) -> bool:
        """Whether the sources' units are packed token windows (all sources share the packing)."""
        return self.plans[0].packed

    def layout(self, world_size: int, start: int = 0) -> Layout:
        return Layout(start, self.matched_rows - start, world_size, self.batch_size, self.drop_last, self.pad)

    def identity(self) -> dict[str, Any]:
        """Plain description of everything that determines the epoch's sequence (no credentials)."""
        return {
            "sources": [plan.identity() for plan in self.plans],
            "names": list(self.names),
            "weights": list(self.weights),
            "block": self.block,
            "epoch_rule": self.epoch_rule,
            "samples": self.samples,
            "shuffle": self.strategy.describe(),
            "rows": self.matched_rows,
        }

    # -- the mapping ----------------------------------------------------------------------------
    def draws(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, local draw) of each mixture position of ``epoch``: the position's slot
        names the source, and the position takes that source's next draw in the block."""
        positions = np.asarray(positions, dtype=np.int64)
        block, offset = np.divmod(positions, self.block)
        source, rank = np.empty_like(positions), np.empty_like(positions)
        key = derive_key(self.strategy.seed, epoch, _SLOTS)
        for b in np.unique(block).tolist():
            here = block == b
            slots = _block_slots(int(subkeys(key, np.array([b]))[0]), self.block, self.counts)
            source[here], rank[here] = slots[0][offset[here]], slots[1][offset[here]]
        counts = np.asarray(self.counts, dtype=np.int64)
        return source, block * counts[source] + rank

    def units(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, unit of that source) of each mixture position of ``epoch``: the row's
        dataset position, or with packing the window's index."""
        source, draw = self.draws(epoch, positions)
        rows = np.empty_like(draw)
        for j, plan in enumerate(self.plans):
            mine = source == j
            if not mine.any():
                continue
            passes, index = np.divmod(draw[mine], plan.matched_rows)
            out = np.empty_like(index)
            for pass_ in np.unique(passes):
                here = passes == pass_
                order = plan.order(_pass_epoch(epoch, int(pass_)))
                matched = order.matched_indices(index[here])
                out[here] = matched if plan.packed else plan.row_positions(matched)
            rows[mine] = out
        return source, rows

    def source_rows(self, epoch: int, end: int) -> list[int]:
        """Samples of each source among the first ``end`` positions of ``epoch`` (O(block) work)."""
        whole = end // self.block
        counts = [whole * k for k in self.counts]
        tail = np.arange(whole * self.block, end, dtype=np.int64)
        if len(tail):
            source, _ = self.draws(epoch, tail)
            for j, n in enumerate(np.bincount(source, minlength=len(self.plans)).tolist()):
                counts[j] += n
        return counts

    def explain(self, world_size: int = 1) -> str:
        layout = self.layout(world_size)
        total = sum(self.weights)
        lines = [f"split '{self.split}': mixture of {len(self.plans)} sources, block {self.block:,}"]
        for name, plan, weight, count in zip(self.names, self.plans, self.weights, self.counts):
            src = plan.source
            lines.append(
                f"  {name}: {src.uri} @ version {src.version}, {plan.matched_rows:,} {plan.unit}s, "
                f"weight {weight / total:.4f}"
                f" -> {count:,} per block ({count / self.block:.4f})"
            )
        if self.epoch_rule == "first_exhausted":
            blocks = self.matched_rows // self.block
            unused = [plan.matched_rows - blocks * k for plan, k in zip(self.plans, self.counts)]
            lines.append(
                f"  epoch: first_exhausted: {blocks:,} whole block(s) = {self.matched_rows:,} samples; unread per "
                f"epoch: " + ", ".join(f"{n} {u:,}" for n, u in zip(self.names, unused))
            )
        else:
            lines.append(f"  epoch: samples={self.matched_rows:,} (sources repeat, re-permuted each pass)")
        lines.append(f"  strategy: {self.strategy!r} (each source's own order; blocks interleaved by seed)")
        lines.append(f"  batches: {layout.steps:,} per rank x {world_size} rank(s), batch_size {self.batch_size}")
        if layout.dropped_rows:
            lines.append(f"  tail: drop_last skips {layout.dropped_rows:,} sample(s) per epoch")
        return "\n".join(lines)


@functools.lru_cache(maxsize=16)
def _block_slots(key: int, block: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
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


def _pass_epoch(epoch: int, pass_: int) -> int:
    """The epoch key of a source's order on its pass ``pass_`` through mixture epoch ``epoch``:
    the first pass reads the source's own epoch order."""
    return epoch if pass_ == 0 else derive_key(epoch, pass_)


def epoch_positions(rule: str, samples: int | None, rows: list[int], counts: list[int], block: int) -> int:
    """Positions per epoch: whole blocks until the first source runs out, or ``samples``."""
    if rule == "samples":
        return int(samples)
    return min(n // k for n, k in zip(rows, counts)) * block
