"""`MixturePlan`: a mixture's positions mapped to (source, unit) in O(1), purely.

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
- With a ``schedule`` (`lance_lightning.plan.schedule`, ``epoch="samples"`` only) block ``b``
  of epoch ``e`` takes the counts scheduled at its first sample ``e * samples + b * K`` (a count
  may be 0), and a position takes draw ``d = before_j(e, b) + r`` of its source, where
  ``before_j(e, b)`` counts source ``j``'s slots in the earlier blocks of the epoch: a per-epoch
  prefix-sum table of O(blocks) (per block, not per sample), cached for the few epochs in use, so
  a position still maps in O(1), purely, with the same draw rules (own order, no repeat within a
  pass, ``pass_epoch`` per pass). Without a schedule nothing of the above changes.
- `MixturePlan` is one sequence of ``matched_rows`` positions: the `Layout`, the cursor, the
  loader length and elastic resume treat it as they treat one source's plan (it answers the
  `Plan` contract, `lance_lightning.plan.contract`). Its batches carry each row's source index
  (the ``source`` column, int64 into ``sources``). Its own members, read by the stages that
  check the kind: ``source_counts`` and ``scheduled_shares`` (the monitor), ``resume_identity``
  (the cursor), ``units`` (its reader). Its identity holds
  every source's identity, the weights (or the schedule, by sample), names, ``K`` and the epoch
  rule. ``on_schedule_change="continue"`` is a resume policy, not part of it: `resume_identity`
  then compares a saved cursor as if it had the current weights or schedule.
- Sources agree on a column's type up to the name and nullability of a list's item field
  (`plain_type`: ``list<element: int32>``, as Parquet and the tools that follow it name it, is
  Arrow's ``list<item: int32>``); their batches are read as those plain types (`plain_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lance_lightning.plan.bijection import derive_key, subkeys
from lance_lightning.plan.blocks import block_slots, pass_epoch
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.schedule import MixtureSchedule, epoch_blocks
from lance_lightning.plan.strategies import ShuffleStrategy
from lance_lightning.source import PinnedSource

_SLOTS = 5  # key stream of the in-block slot permutation (EpochOrder uses 1..4)
#: Identity fields that `on_schedule_change="continue"` takes from the current plan on resume.
_MIX_FIELDS = ("weights", "schedule")


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
    #: Each batch takes its rows from every source it draws.
    method: str = field(default="take", compare=False)
    #: Weights over training (``weights`` and ``counts`` are then empty).
    schedule: MixtureSchedule | None = None
    #: What a resume does with a checkpoint of other weights or another schedule (not the order's).
    on_schedule_change: str = field(default="refuse", compare=False)

    # -- what the cursor, layout and readers use -----------------------------------------------
    @property
    def source(self) -> PinnedSource:
        """The first source (all sources read the same columns with the same types)."""
        return self.plans[0].source

    @property
    def sources(self) -> tuple[PinnedSource, ...]:
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

    @property
    def clipped(self) -> bool:
        """Whether the sources' units are clips of media rows (all sources share the sampler)."""
        return self.plans[0].clipped

    def layout(self, world_size: int, start: int = 0) -> Layout:
        return Layout(start, self.matched_rows - start, world_size, self.batch_size, self.drop_last, self.pad)

    def identity(self) -> dict[str, Any]:
        """Plain description of everything that determines the epoch's sequence (no credentials)."""
        identity: dict[str, Any] = {
            "sources": [plan.identity() for plan in self.plans],
            "names": list(self.names),
            "weights": list(self.weights),
            "block": self.block,
            "epoch_rule": self.epoch_rule,
            "samples": self.samples,
            "shuffle": self.strategy.describe(),
            "rows": self.matched_rows,
        }
        if self.schedule is not None:
            del identity["weights"]
            identity["schedule"] = self.schedule.identity()
        return identity

    def resume_identity(self, saved: dict[str, Any]) -> dict[str, Any]:
        """``saved`` (a checkpoint's plan identity) as this plan compares it on resume: as saved, or
        with ``on_schedule_change="continue"`` with this plan's weights or schedule in place of its own."""
        if self.on_schedule_change != "continue" or not isinstance(saved, dict):
            return saved
        current = self.identity()
        out = {key: value for key, value in saved.items() if key not in _MIX_FIELDS}
        out.update({key: current[key] for key in _MIX_FIELDS if key in current})
        return out

    def scheduled_shares(self, epoch: int, end: int) -> dict[str, float]:
        """Each source's share of the first ``end`` positions of ``epoch`` as the weights or the
        schedule set it (each block at the shares of its first sample): O(1) per call."""
        if self.schedule is None:
            total = sum(self.weights)
            return {name: w / total for name, w in zip(self.names, self.weights, strict=True)}
        shares = self._blocks(epoch).scheduled(end, self.block)
        return dict(zip(self.names, shares.tolist(), strict=True))

    def _blocks(self, epoch: int) -> Any:
        """The scheduled blocks of ``epoch`` (cached per epoch)."""
        return epoch_blocks(self.schedule, epoch, self.matched_rows, self.block)

    # -- the mapping ----------------------------------------------------------------------------
    def draws(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, local draw) of each mixture position of ``epoch``: the position's slot
        names the source, and the position takes that source's next draw in the block."""
        positions = np.asarray(positions, dtype=np.int64)
        block, offset = np.divmod(positions, self.block)
        source, rank = np.empty_like(positions), np.empty_like(positions)
        key = derive_key(self.strategy.seed, epoch, _SLOTS)
        table = None if self.schedule is None else self._blocks(epoch)
        for b in np.unique(block).tolist():
            here = block == b
            counts = self.counts if table is None else tuple(table.counts[b].tolist())
            slots = block_slots(int(subkeys(key, np.array([b]))[0]), self.block, counts)
            source[here], rank[here] = slots[0][offset[here]], slots[1][offset[here]]
        if table is not None:  # the source's slots in the epoch's earlier blocks, plus its rank here
            return source, table.before[block, source] + rank
        per_block = np.asarray(self.counts, dtype=np.int64)
        return source, block * per_block[source] + rank

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
                order = plan.order(pass_epoch(epoch, int(pass_)))
                matched = order.matched_indices(index[here])
                out[here] = matched if plan.packed or plan.clipped else plan.row_positions(matched)
            rows[mine] = out
        return source, rows

    def source_counts(self, epoch: int, end: int) -> dict[str, int]:
        return dict(zip(self.names, self.source_rows(epoch, end), strict=True))

    def source_rows(self, epoch: int, end: int) -> list[int]:
        """Samples of each source among the first ``end`` positions of ``epoch`` (O(block) work)."""
        whole = end // self.block
        if self.schedule is None:
            counts = [whole * k for k in self.counts]
        else:
            counts = self._blocks(epoch).before[whole].tolist()
        tail = np.arange(whole * self.block, end, dtype=np.int64)
        if len(tail):
            source, _ = self.draws(epoch, tail)
            for j, n in enumerate(np.bincount(source, minlength=len(self.plans)).tolist()):
                counts[j] += n
        return counts

    def explain(self, world_size: int = 1) -> str:
        layout = self.layout(world_size)
        lines = [f"split '{self.split}': mixture of {len(self.plans)} sources, block {self.block:,}"]
        if self.schedule is not None:
            for name, plan in zip(self.names, self.plans, strict=True):
                src = plan.source
                lines.append(f"  {name}: {src.uri} @ {src.version_shown}, {plan.matched_rows:,} {plan.unit}s")
            lines += self.schedule.lines(self.names, self.matched_rows, self.block)
        else:
            total = sum(self.weights)
            for name, plan, weight, count in zip(self.names, self.plans, self.weights, self.counts):
                src = plan.source
                lines.append(
                    f"  {name}: {src.uri} @ {src.version_shown}, {plan.matched_rows:,} {plan.unit}s, "
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


def plain_type(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with every (fixed-size) list's item field named ``item`` and nullable, inside
    structs too: the name and flag other writers give that field change no value."""
    if pa.types.is_list(arrow_type):
        return pa.list_(plain_type(arrow_type.value_type))
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(plain_type(arrow_type.value_type))
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(plain_type(arrow_type.value_type), arrow_type.list_size)
    if pa.types.is_struct(arrow_type):
        return pa.struct([field.with_type(plain_type(field.type)) for field in arrow_type])
    return arrow_type


def plain_table(table: pa.Table) -> pa.Table:
    """``table`` with its columns cast to their `plain_type` (itself where they are plain already)."""
    plain = pa.schema([field.with_type(plain_type(field.type)) for field in table.schema])
    return table if plain.equals(table.schema) else table.cast(plain)
