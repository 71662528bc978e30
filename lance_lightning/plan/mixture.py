"""Weighted mixtures of sources: `LanceMixture` (the config), planned into a `MixturePlan` whose
positions map to (source, unit) in O(1), purely.

Guarantees:
- `LanceMixture`'s arguments are typed (LightningCLI reads them from YAML by ``class_path``) and
  validated in ``__init__``: weights (one per source, positive, finite) or a schedule
  (`lance_lightning.plan.schedule`), names (unique), the epoch rule and ``block``; each failure
  is a `ConfigError` naming the parameter, the value and the fix.
- `plan_mixture` pins every source in the main process, plans each as a plain row source (its
  own order under the split's shuffle strategy) and checks that all read the same columns with
  the same Arrow types (and not the ``source`` column the mixture adds).
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
  loader length and elastic resume treat it as they treat one source's plan. Its identity holds
  every source's identity, the weights (or the schedule, by sample), names, ``K`` and the epoch
  rule. ``on_schedule_change="continue"`` is a resume policy, not part of it: `resume_identity`
  then compares a saved cursor as if it had the current weights or schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError
from lance_lightning.plan.bijection import derive_key, subkeys
from lance_lightning.plan.blocks import block_counts, block_slots, epoch_positions, pass_epoch
from lance_lightning.plan.contract import SplitSettings
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.schedule import MixtureSchedule, epoch_blocks, parse_schedule
from lance_lightning.plan.strategies import ShuffleStrategy
from lance_lightning.plan.survey import build_plan
from lance_lightning.source import LanceSource, PinnedSource, pin_source
from lance_lightning.vocabulary import MIXTURE_SOURCE

_SLOTS = 5  # key stream of the in-block slot permutation (EpochOrder uses 1..4)
#: Identity fields that `on_schedule_change="continue"` takes from the current plan on resume.
_MIX_FIELDS = ("weights", "schedule")


class LanceMixture:
    """Train samples drawn from several Lance sources in fixed or scheduled proportions.

    Every block of ``block`` consecutive samples holds each source in proportion to its weight
    (rounded to whole samples, at least one each), in a shuffled order keyed by the shuffle
    strategy's seed and the epoch. Each source is read in its own epoch order (the data module's
    ``shuffle``); batches carry a ``source`` column (int64 index into ``sources``). With a
    ``schedule`` the weights change over training (docs/guide.md, "Schedules").

    Args:
        sources: The sources; all must read the same columns with the same types.
        weights: One positive weight per source (normalised; need not sum to 1); omit it with a
            ``schedule``.
        names: A name per source, used in logs and plan summaries; default ``source0``, ...
        epoch: ``"first_exhausted"``: an epoch is the whole blocks until the first source is read
            through (the other sources' rest is skipped that epoch, see ``explain``);
            ``"samples"``: an epoch is ``samples`` samples, sources repeat as needed.
        samples: Samples per epoch with ``epoch="samples"``.
        block: Samples per block (proportions are exact per block, within ``1/block`` overall).
        schedule: Stages of weights over training, e.g. ``[{until_step: 10000, weights: [0.9,
            0.1]}, {weights: [0.5, 0.5]}]``: each stage but the last ends at ``until_step``
            (times ``step_samples``) or ``until_sample``, counted on the mixture's global sample
            index ``epoch * samples + position``; weights >= 0, one positive per stage. Needs
            ``epoch="samples"``. Each block takes the weights at its first sample.
        interpolate: ``"constant"``: each stage's weights hold until its end; ``"linear"``: they
            move linearly to the next stage's weights at its end (the last stage holds).
        step_samples: Samples per optimizer step as planned (batch_size x devices x nodes x
            accumulate_grad_batches): converts ``until_step`` to samples once, so a boundary stays
            at the same sample when a resume changes the topology.
        on_schedule_change: A checkpoint taken under other weights or another schedule:
            ``"refuse"`` (`CursorMismatchError` naming ``plan.schedule`` or ``plan.weights``), or
            ``"continue"`` with the current ones from the checkpoint's position (the resumed
            epoch's draws of a source may then repeat or skip rows; later epochs are exact).
    """

    def __init__(
        self,
        sources: list[LanceSource],
        weights: list[float] | None = None,
        names: list[str] | None = None,
        epoch: Literal["first_exhausted", "samples"] = "first_exhausted",
        samples: int | None = None,
        block: int = 10_000,
        schedule: list[dict[str, Any]] | None = None,
        interpolate: Literal["constant", "linear"] = "constant",
        step_samples: int | None = None,
        on_schedule_change: Literal["refuse", "continue"] = "refuse",
    ) -> None:
        if not isinstance(sources, (list, tuple)) or not sources:
            raise ConfigError("sources", sources, "a mixture needs a non-empty list of sources", "list LanceSources")
        self.sources = [LanceSource(**s) if isinstance(s, dict) else s for s in sources]
        for j, source in enumerate(self.sources):
            if not isinstance(source, LanceSource):
                raise ConfigError(f"sources[{j}]", source, "is not a LanceSource", "give LanceSource(uri=...)")
        if schedule is not None and weights is not None:
            raise ConfigError(
                "weights", weights, "a schedule gives the weights of every stage", "drop `weights`, or `schedule`"
            )
        if schedule is None:
            _check_weights(weights, len(self.sources))
        self.weights = None if weights is None else [float(w) for w in weights]
        names = [f"source{j}" for j in range(len(self.sources))] if names is None else list(names)
        if len(names) != len(self.sources) or len(set(names)) != len(names) or not all(names):
            raise ConfigError("names", names, "needs one unique, non-empty name per source", "name each source once")
        self.names = names
        self.epoch = check_choice(
            "epoch", epoch, ("first_exhausted", "samples"), "unknown epoch rule", 'use "first_exhausted" or "samples"'
        )
        self.on_schedule_change = check_choice(
            "on_schedule_change",
            on_schedule_change,
            ("refuse", "continue"),
            "unknown policy",
            'use "refuse" or "continue"',
        )
        self.schedule: MixtureSchedule | None = None
        if schedule is not None:
            self.schedule = parse_schedule(schedule, interpolate, step_samples, len(self.sources), self.epoch)
        elif interpolate != "constant" or step_samples is not None:
            name, value = ("interpolate", interpolate) if interpolate != "constant" else ("step_samples", step_samples)
            raise ConfigError(name, value, "is only used with a `schedule`", "drop it, or add a `schedule`")
        self.schedule_args = (schedule, interpolate, step_samples)
        self.block = check_int("block", block, len(self.sources), f"set `block` to {len(self.sources)} or more")
        if epoch == "samples":
            self.samples = check_int("samples", samples, 1, "set `samples` to the samples per epoch, e.g. 100000")
        elif samples is not None:
            raise ConfigError(
                "samples", samples, 'is only used with epoch="samples"', 'drop it, or set epoch="samples"'
            )
        else:
            self.samples = None
        self.counts = None if self.weights is None else block_counts(self.weights, self.block, self.names)

    def at_versions(self, versions: list[int | None]) -> LanceMixture:
        """This mixture with source ``j`` pinned to ``versions[j]`` (a resume re-pins the versions
        its checkpoint was read at)."""
        sources = [replace(source, version=version) for source, version in zip(self.sources, versions, strict=True)]
        schedule, interpolate, step_samples = self.schedule_args
        return LanceMixture(
            sources,
            self.weights,
            self.names,
            self.epoch,
            self.samples,
            self.block,
            schedule,
            interpolate,
            step_samples,
            self.on_schedule_change,
        )

    def __repr__(self) -> str:
        text = (
            f"LanceMixture(sources={self.sources!r}, weights={self.weights!r}, names={self.names!r}, "
            f"epoch={self.epoch!r}, samples={self.samples!r}, block={self.block!r}"
        )
        if self.schedule is not None:
            schedule, interpolate, step_samples = self.schedule_args
            text += f", schedule={schedule!r}, interpolate={interpolate!r}, step_samples={step_samples!r}"
        if self.on_schedule_change != "refuse":
            text += f", on_schedule_change={self.on_schedule_change!r}"
        return text + ")"


def _check_weights(weights: Any, sources: int) -> None:
    if weights is None:
        raise ConfigError("weights", weights, "a mixture needs weights", "give one weight per source, or a `schedule`")
    if not isinstance(weights, (list, tuple)) or len(weights) != sources:
        raise ConfigError("weights", weights, f"needs one weight per source ({sources})", "give one weight per source")
    for j, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"weights[{j}]", weight, "must be a finite number", "use a positive number")
        if weight <= 0:
            raise ConfigError(f"weights[{j}]", weight, "must be positive", "use a weight > 0, or drop the source")


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
    def source_names(self) -> tuple[str, ...]:
        return self.names

    @property
    def added_columns(self) -> tuple[str, ...]:
        """Each row's source index (int64 into ``sources``)."""
        return (MIXTURE_SOURCE,)

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
                order = plan.order(pass_epoch(epoch, int(pass_)))
                matched = order.matched_indices(index[here])
                out[here] = matched if plan.packed else plan.row_positions(matched)
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
                lines.append(f"  {name}: {src.uri} @ version {src.version}, {plan.matched_rows:,} {plan.unit}s")
            lines += self.schedule.lines(self.names, self.matched_rows, self.block)
        else:
            total = sum(self.weights)
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


def plan_mixture(split: str, mixture: LanceMixture, settings: SplitSettings) -> MixturePlan:
    """Pin and plan every source of ``mixture`` and lay out the mixture (main process)."""
    plans = tuple(
        build_plan(
            f"{split}/{name}",
            pin_source(source, f"{split}.sources[{j}]"),
            replace(settings, drop_last=False),
        )
        for j, (source, name) in enumerate(zip(mixture.sources, mixture.names, strict=True))
    )
    _check_columns_agree(split, mixture.names, [plan.source for plan in plans])
    rows = [plan.matched_rows for plan in plans]
    positions = epoch_positions(mixture.epoch, mixture.samples, rows, mixture.counts, mixture.block)
    if positions == 0:
        short = min(range(len(rows)), key=lambda j: rows[j] / mixture.counts[j])
        raise ConfigError(
            "block",
            mixture.block,
            f"source '{mixture.names[short]}' has {rows[short]} row(s), fewer than its {mixture.counts[short]} per "
            "block, so epoch='first_exhausted' has no whole block",
            f"use block <= {max(1, rows[short] * mixture.block // mixture.counts[short])}, or epoch='samples'",
        )
    return MixturePlan(
        split,
        plans,
        tuple(mixture.names),
        tuple(mixture.weights or ()),
        tuple(mixture.counts or ()),
        mixture.block,
        mixture.epoch,
        mixture.samples,
        settings.strategy,
        settings.batch_size,
        settings.drop_last,
        positions,
        schedule=mixture.schedule,
        on_schedule_change=mixture.on_schedule_change,
    )


def _check_columns_agree(split: str, names: list[str], sources: list[PinnedSource]) -> None:
    """`ConfigError` unless every source reads the first one's columns with the same types and
    none reads the column the mixture adds."""
    fields = [_fields(source) for source in sources]
    if MIXTURE_SOURCE in sources[0].columns:
        raise ConfigError(
            f"{split}.sources[0].columns",
            list(sources[0].columns),
            f"a mixture adds the column {MIXTURE_SOURCE!r} (each row's source index), which a source already reads",
            f"leave {MIXTURE_SOURCE!r} out of the sources' columns",
        )
    for j, (source, here) in enumerate(zip(sources[1:], fields[1:], strict=True), start=1):
        if here != fields[0]:
            raise ConfigError(
                f"{split}.sources[{j}].columns",
                list(source.columns),
                f"source '{names[j]}' reads {here}; '{names[0]}' reads {fields[0]}",
                "read the same columns, with the same types, from every source",
            )


def _fields(source: PinnedSource) -> str:
    schema = source.open().schema
    return ", ".join(f"{name}: {schema.field(name).type}" for name in source.columns)
