"""Weighted mixtures of sources: `LanceMixture`, the train split's config, and its planning.

Guarantees:
- `LanceMixture`'s arguments are typed (LightningCLI reads them from YAML by ``class_path``) and
  validated in ``__init__``: weights (one per source, positive, finite) or a schedule
  (`lance_lightning.plan.schedule`), names (unique), the epoch rule and ``block``; each failure
  is a `ConfigError` naming the parameter, the value and the fix.
- `plan_mixture` lays a mixture out over its sources' plans, which the planning entry
  (`lance_lightning.plan.split.plan_split`) pinned and planned as plain row sources in the main
  process (each its own order under the split's shuffle strategy); it checks that all read the
  same columns with the same Arrow types (up to list item names: `plain_type`; and not the
  ``source`` column the mixture adds), and
  that ``epoch="first_exhausted"`` leaves a whole block.
- The plan is a `MixturePlan` (`lance_lightning.plan.mixture_plan`): positions mapped to
  (source, unit) in O(1), purely.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError
from lance_lightning.plan.blocks import block_counts, epoch_positions
from lance_lightning.plan.contract import SplitSettings
from lance_lightning.plan.mixture_plan import MixturePlan, plain_type
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.schedule import MixtureSchedule, parse_schedule
from lance_lightning.source import LanceSource, PinnedSource
from lance_lightning.vocabulary import MIXTURE_SOURCE


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
        #: The schedule as given (stages of plain types, kept for the hyperparameters) and as parsed.
        self.schedule, self.interpolate, self.step_samples = schedule, interpolate, step_samples
        self.parsed_schedule: MixtureSchedule | None = None
        if schedule is not None:
            self.parsed_schedule = parse_schedule(schedule, interpolate, step_samples, len(self.sources), self.epoch)
        elif interpolate != "constant" or step_samples is not None:
            name, value = ("interpolate", interpolate) if interpolate != "constant" else ("step_samples", step_samples)
            raise ConfigError(name, value, "is only used with a `schedule`", "drop it, or add a `schedule`")
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
        #: How each source's version is shown when a resume re-pinned it (`at_versions`): a name the
        #: config gave (a tag, ``asof``) and where it points now; "" shows the number only.
        self.pinned_by = [""] * len(self.sources)

    def at_versions(self, versions: list[int | None], pinned_by: list[str] | None = None) -> LanceMixture:
        """This mixture with source ``j`` pinned to ``versions[j]`` (a resume re-pins the versions
        its checkpoint was read at), shown with ``pinned_by[j]`` (see `pinned_by`)."""
        sources = [
            replace(source, version=version, asof=None) for source, version in zip(self.sources, versions, strict=True)
        ]
        mixture = LanceMixture(
            sources,
            self.weights,
            self.names,
            self.epoch,
            self.samples,
            self.block,
            self.schedule,
            self.interpolate,
            self.step_samples,
            self.on_schedule_change,
        )
        mixture.pinned_by = list(pinned_by) if pinned_by is not None else [""] * len(sources)
        return mixture

    def __repr__(self) -> str:
        text = (
            f"LanceMixture(sources={self.sources!r}, weights={self.weights!r}, names={self.names!r}, "
            f"epoch={self.epoch!r}, samples={self.samples!r}, block={self.block!r}"
        )
        if self.schedule is not None:
            text += (
                f", schedule={self.schedule!r}, interpolate={self.interpolate!r}, step_samples={self.step_samples!r}"
            )
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


def plan_mixture(
    split: str, mixture: LanceMixture, plans: tuple[ReadPlan, ...], settings: SplitSettings
) -> MixturePlan:
    """The plan of ``mixture`` over ``plans``, its sources' own plans in ``mixture.sources`` order."""
    _check_columns_agree(split, mixture.names, [plan.source for plan in plans])
    rows = [plan.matched_rows for plan in plans]
    positions = epoch_positions(mixture.epoch, mixture.samples, rows, mixture.counts, mixture.block)
    if positions == 0:  # only under epoch='first_exhausted', whose weights are fixed
        counts = mixture.counts
        if counts is None:
            raise ValueError("epoch='first_exhausted' needs fixed weights (counts per block); counts is None")
        short = min(range(len(rows)), key=lambda j: rows[j] / counts[j])
        raise ConfigError(
            "block",
            mixture.block,
            f"source '{mixture.names[short]}' has {rows[short]} row(s), fewer than its {counts[short]} per "
            "block, so epoch='first_exhausted' has no whole block",
            f"use block <= {max(1, rows[short] * mixture.block // counts[short])}, or epoch='samples'",
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
        schedule=mixture.parsed_schedule,
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
    return ", ".join(f"{name}: {plain_type(schema.field(name).type)}" for name in source.columns)
