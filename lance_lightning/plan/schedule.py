"""Mixture schedules: weights that change over training, as a pure function of the sample index.

Guarantees:
- The schedule's axis is the mixture's global sample index ``g = epoch * samples + position``
  (``samples``: positions per epoch, so schedules need ``epoch="samples"``). Nothing about it
  depends on the world size, the batch size, the workers or the trainer's step: a boundary stays
  at the same sample after an elastic resume. ``until_step`` is converted once, at construction,
  with the ``step_samples`` the user plans (samples per optimizer step).
- `parse_schedule` validates the stages (one weight per source, finite and >= 0, one positive per
  stage, boundaries strictly increasing, the last stage open-ended) and raises `ConfigError`
  naming the field (``schedule[1].weights[0]``), the value and the fix.
- Shares: stage ``i`` holds ``w_i / sum(w_i)`` (float64). ``"constant"``: a sample takes the
  shares of its stage. ``"linear"``: stage ``i`` starts at its shares and moves linearly to the
  next stage's at its end, ``s = s_i + (s_{i+1} - s_i) * ((g - start_i) / (end_i - start_i))``;
  the last stage holds its shares.
- Granularity: block ``b`` of epoch ``e`` (``block`` samples) takes the shares at its first
  sample ``g = e * samples + b * block`` and turns them into whole counts by largest remainder of
  ``share * block`` (ties to the lower source index; a count may be 0), the rule of
  `lance_lightning.plan.blocks.block_counts`. So every whole block holds its counts exactly,
  within ``1/block`` of the shares scheduled at its first sample.
- `epoch_blocks` is every block's counts of one epoch, their prefix sums (the draws of each source
  in the earlier blocks of the epoch) and the scheduled shares: O(blocks) numpy work per epoch,
  cached for the few epochs in use; positions then map in O(1) each.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError

INTERPOLATIONS = ("constant", "linear")
_STAGE_KEYS = ("until_step", "until_sample", "weights")


@dataclass(frozen=True)
class MixtureSchedule:
    """Stages of weights over the mixture's sample index (module docstring)."""

    #: Each stage's end (``until_sample``), for every stage but the last (open-ended).
    ends: tuple[int, ...]
    #: Each stage's weights, one per source (normalised to shares).
    weights: tuple[tuple[float, ...], ...]
    interpolate: str = "constant"
    #: Each stage's ``until_step`` as configured (``None``: given as ``until_sample``, or the last).
    steps: tuple[int | None, ...] = field(default=(), compare=False)
    step_samples: int | None = field(default=None, compare=False)

    @property
    def starts(self) -> tuple[int, ...]:
        return (0, *self.ends)

    @functools.cached_property
    def shares(self) -> np.ndarray:
        """(stages, sources) float64: each stage's weights over their sum."""
        rows = []
        for weights in self.weights:
            total = float(sum(weights))
            rows.append([w / total for w in weights])
        return np.asarray(rows, dtype=np.float64)

    def shares_at(self, g: np.ndarray) -> np.ndarray:
        """(len(g), sources): the scheduled shares at global sample indices ``g``."""
        g = np.asarray(g, dtype=np.int64)
        stage = np.searchsorted(np.asarray(self.ends, dtype=np.int64), g, side="right")
        shares = self.shares[stage]
        if self.interpolate == "linear" and self.ends:
            ramp = stage < len(self.ends)
            i = stage[ramp]
            start = np.asarray(self.starts, dtype=np.int64)[i]
            end = np.asarray(self.ends, dtype=np.int64)[i]
            t = (g[ramp] - start) / (end - start)
            shares[ramp] = self.shares[i] + (self.shares[i + 1] - self.shares[i]) * t[:, None]
        return shares

    def identity(self) -> dict[str, Any]:
        """Plain description (part of the mixture plan's identity): stages by sample."""
        ends = [*self.ends, None]
        return {
            "interpolate": self.interpolate,
            "stages": [{"until_sample": e, "weights": list(w)} for e, w in zip(ends, self.weights, strict=True)],
        }

    def lines(self, names: tuple[str, ...], samples: int, block: int) -> list[str]:
        """``explain``'s lines: the axis, the granularity and every stage with its sample range."""
        out = [
            f"  schedule ({self.interpolate}) over the mixture sample g = epoch x {samples:,} + position; each "
            f"block of {block:,} takes the shares at its first sample (exact per block within 1/{block:,}):"
        ]
        for i, start in enumerate(self.starts):
            end = self.ends[i] if i < len(self.ends) else None
            span = f"samples [{start:,}, {'end' if end is None else f'{end:,}'})"
            step = self.steps[i] if i < len(self.steps) else None
            if step is not None:
                span += f" = until step {step:,} at {self.step_samples:,} samples/step"
            epochs = f"epoch {start / samples:.2f} to " + ("the end" if end is None else f"{end / samples:.2f}")
            shares = self.shares[i]
            if self.interpolate == "linear" and end is not None:
                after = self.shares[i + 1]
                mix = ", ".join(f"{n} {a:.4f} -> {b:.4f}" for n, a, b in zip(names, shares, after, strict=True))
            else:
                mix = ", ".join(f"{n} {a:.4f}" for n, a in zip(names, shares, strict=True))
            out.append(f"    stage {i}: {span} ({epochs}): {mix}")
        return out


def parse_schedule(
    schedule: Any, interpolate: Any, step_samples: Any, sources: int, epoch_rule: str
) -> MixtureSchedule:
    """The validated schedule of a mixture of ``sources`` sources (`ConfigError` naming the field)."""
    if epoch_rule != "samples":
        raise ConfigError(
            "schedule",
            schedule,
            f'a schedule runs over the mixture sample index, which needs epoch="samples" (got {epoch_rule!r})',
            'set epoch="samples" and samples=<samples per epoch>, or drop `schedule`',
        )
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ConfigError("schedule", schedule, "must be a non-empty list of stages", _STAGE_FIX)
    interpolate = check_choice(
        "interpolate", interpolate, INTERPOLATIONS, "unknown interpolation", 'use "constant" or "linear"'
    )
    uses_steps = any(isinstance(s, dict) and "until_step" in s for s in schedule)
    if uses_steps:
        check_int(
            "step_samples",
            step_samples,
            1,
            "set `step_samples` to the samples per optimizer step you plan "
            "(batch_size x devices x nodes x accumulate_grad_batches), or give `until_sample`",
        )
    elif step_samples is not None:
        check_int("step_samples", step_samples, 1, "set `step_samples` to a positive integer, or drop it")
    ends: list[int] = []
    weights: list[tuple[float, ...]] = []
    steps: list[int | None] = []
    for i, stage in enumerate(schedule):
        where = f"schedule[{i}]"
        if not isinstance(stage, dict) or set(stage) - set(_STAGE_KEYS) or "weights" not in stage:
            raise ConfigError(where, stage, "is not a stage", _STAGE_FIX)
        weights.append(_stage_weights(f"{where}.weights", stage["weights"], sources))
        last = i == len(schedule) - 1
        given = [key for key in ("until_step", "until_sample") if stage.get(key) is not None]
        if last:
            if given:
                raise ConfigError(
                    f"{where}.{given[0]}", stage[given[0]], "the last stage has no end", f"drop `{given[0]}`"
                )
            continue
        if len(given) != 1:
            raise ConfigError(
                where, stage, "every stage but the last needs exactly one end", "give until_step or until_sample"
            )
        key = given[0]
        value = check_int(f"{where}.{key}", stage[key], 1, f"set `{key}` to a positive integer")
        end = value * step_samples if key == "until_step" else value
        if ends and end <= ends[-1]:
            raise ConfigError(
                f"{where}.{key}",
                value,
                f"ends at sample {end:,}, not after the previous stage's end (sample {ends[-1]:,})",
                "list the stages in training order, each ending after the one before",
            )
        ends.append(end)
        steps.append(value if key == "until_step" else None)
    return MixtureSchedule(
        tuple(ends),
        tuple(weights),
        interpolate,
        tuple(steps),
        step_samples if uses_steps else None,
    )


_STAGE_FIX = "give stages like {until_step: 1000, weights: [0.9, 0.1]}, the last without an end: {weights: [0.5, 0.5]}"


def _stage_weights(where: str, weights: Any, sources: int) -> tuple[float, ...]:
    if not isinstance(weights, (list, tuple)) or len(weights) != sources:
        raise ConfigError(where, weights, f"needs one weight per source ({sources})", "give one weight per source")
    for j, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"{where}[{j}]", weight, "must be a finite number", "use a number >= 0")
        if weight < 0:
            raise ConfigError(f"{where}[{j}]", weight, "must not be negative", "use a weight >= 0 (0: not drawn)")
    if not any(w > 0 for w in weights):
        raise ConfigError(where, weights, "gives no source a positive weight", "give at least one source a weight > 0")
    return tuple(float(w) for w in weights)


def largest_remainder(shares: np.ndarray, block: int) -> np.ndarray:
    """(m, sources) int64 counts summing to ``block`` per row: ``floor(share * block)``, plus one for
    the sources with the largest remainders (ties to the lower index)."""
    exact = shares * block
    counts = np.floor(exact).astype(np.int64)
    left = block - counts.sum(axis=1)
    order = np.argsort(-(exact - counts), axis=1, kind="stable")
    place = np.empty_like(order)
    np.put_along_axis(place, order, np.broadcast_to(np.arange(shares.shape[1]), order.shape), axis=1)
    return counts + (place < left[:, None])


@dataclass(frozen=True)
class EpochBlocks:
    """One epoch's blocks under a schedule (read-only arrays)."""

    #: (blocks, sources): samples of each source in each block.
    counts: np.ndarray
    #: (blocks + 1, sources): samples of each source in the blocks before block ``b``.
    before: np.ndarray
    #: (blocks, sources): the shares scheduled for each block.
    shares: np.ndarray
    #: (blocks + 1, sources): the scheduled samples (share x block) of the blocks before block ``b``.
    shares_before: np.ndarray

    def scheduled(self, end: int, block: int) -> np.ndarray:
        """Each source's scheduled share of the first ``end`` positions (the shares of position 0's
        block when ``end`` is 0): O(1) after the table."""
        if end <= 0:
            return self.shares[0].copy()
        whole, part = divmod(end, block)
        total = self.shares_before[whole].copy()
        if part:
            total += self.shares[whole] * part
        return total / end


@functools.lru_cache(maxsize=4)
def epoch_blocks(schedule: MixtureSchedule, epoch: int, samples: int, block: int) -> EpochBlocks:
    """The blocks of ``epoch`` (``samples`` positions in blocks of ``block``): O(blocks) work."""
    blocks = -(-samples // block)
    first = epoch * samples + np.arange(blocks, dtype=np.int64) * block
    shares = schedule.shares_at(first)
    counts = largest_remainder(shares, block)
    before = np.zeros((blocks + 1, counts.shape[1]), dtype=np.int64)
    np.cumsum(counts, axis=0, out=before[1:])
    shares_before = np.zeros(before.shape, dtype=np.float64)
    np.cumsum(shares * block, axis=0, out=shares_before[1:])
    for array in (counts, before, shares, shares_before):
        array.flags.writeable = False
    return EpochBlocks(counts, before, shares, shares_before)
