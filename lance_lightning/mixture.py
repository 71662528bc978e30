"""`LanceMixture`: the train split as a weighted mixture of Lance sources.

Guarantees:
- Arguments are typed (LightningCLI reads them from YAML by ``class_path``) and validated in
  ``__init__``: weights (one per source, positive, finite), names (unique), the epoch rule and
  ``block``; each failure is a `ConfigError` naming the parameter, the value and the fix.
- ``plan`` pins every source in the main process, plans each as a plain row source (its own
  order under the data module's shuffle strategy), checks that all sources read the same columns
  with the same Arrow types, and returns the `MixturePlan` (`lance_lightning.plan.mixture`): one
  sequence of positions that the layout, cursor and resume handle as any plan.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

import pyarrow as pa

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError
from lance_lightning.plan.mixture import MixturePlan, block_counts, epoch_positions
from lance_lightning.plan.survey import build_plan
from lance_lightning.produce.badrows import RaiseOnBadRow
from lance_lightning.produce.schema import read_schema
from lance_lightning.source import LanceSource, pin_source
from lance_lightning.vocabulary import MIXTURE_SOURCE


class LanceMixture:
    """Train samples drawn from several Lance sources in fixed proportions.

    Every block of ``block`` consecutive samples holds each source in proportion to its weight
    (rounded to whole samples, at least one each), in a shuffled order keyed by the shuffle
    strategy's seed and the epoch. Each source is read in its own epoch order (the data module's
    ``shuffle``); batches carry a ``source`` column (int64 index into ``sources``).

    Args:
        sources: The sources; all must read the same columns with the same types.
        weights: One positive weight per source (normalised; need not sum to 1).
        names: A name per source, used in logs and plan summaries; default ``source0``, ...
        epoch: ``"first_exhausted"``: an epoch is the whole blocks until the first source is read
            through (the other sources' rest is skipped that epoch, see ``explain``);
            ``"samples"``: an epoch is ``samples`` samples, sources repeat as needed.
        samples: Samples per epoch with ``epoch="samples"``.
        block: Samples per block (proportions are exact per block, within ``1/block`` overall).
    """

    def __init__(
        self,
        sources: list[LanceSource],
        weights: list[float],
        names: list[str] | None = None,
        epoch: Literal["first_exhausted", "samples"] = "first_exhausted",
        samples: int | None = None,
        block: int = 10_000,
    ) -> None:
        if not isinstance(sources, (list, tuple)) or not sources:
            raise ConfigError("sources", sources, "a mixture needs a non-empty list of sources", "list LanceSources")
        self.sources = [LanceSource(**s) if isinstance(s, dict) else s for s in sources]
        for j, source in enumerate(self.sources):
            if not isinstance(source, LanceSource):
                raise ConfigError(f"sources[{j}]", source, "is not a LanceSource", "give LanceSource(uri=...)")
        if not isinstance(weights, (list, tuple)) or len(weights) != len(self.sources):
            raise ConfigError(
                "weights", weights, f"needs one weight per source ({len(self.sources)})", "give one weight per source"
            )
        for j, weight in enumerate(weights):
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ConfigError(f"weights[{j}]", weight, "must be a finite number", "use a positive number")
            if weight <= 0:
                raise ConfigError(f"weights[{j}]", weight, "must be positive", "use a weight > 0, or drop the source")
        self.weights = [float(w) for w in weights]
        names = [f"source{j}" for j in range(len(self.sources))] if names is None else list(names)
        if len(names) != len(self.sources) or len(set(names)) != len(names) or not all(names):
            raise ConfigError("names", names, "needs one unique, non-empty name per source", "name each source once")
        self.names = names
        self.epoch = check_choice(
            "epoch", epoch, ("first_exhausted", "samples"), "unknown epoch rule", 'use "first_exhausted" or "samples"'
        )
        self.block = check_int("block", block, len(self.sources), f"set `block` to {len(self.sources)} or more")
        if epoch == "samples":
            self.samples = check_int("samples", samples, 1, "set `samples` to the samples per epoch, e.g. 100000")
        elif samples is not None:
            raise ConfigError(
                "samples", samples, 'is only used with epoch="samples"', 'drop it, or set epoch="samples"'
            )
        else:
            self.samples = None
        self.counts = block_counts(self.weights, self.block, self.names)

    def at_versions(self, versions: list[int | None]) -> LanceMixture:
        """This mixture with source ``j`` pinned to ``versions[j]`` (a resume re-pins the versions
        its checkpoint was read at)."""
        sources = [replace(source, version=version) for source, version in zip(self.sources, versions, strict=True)]
        return LanceMixture(sources, self.weights, self.names, self.epoch, self.samples, self.block)

    def __repr__(self) -> str:
        return (
            f"LanceMixture(sources={self.sources!r}, weights={self.weights!r}, names={self.names!r}, "
            f"epoch={self.epoch!r}, samples={self.samples!r}, block={self.block!r})"
        )

    def plan(self, split: str, data: Any) -> MixturePlan:
        """Pin and plan every source, check their columns agree, and lay out the mixture (main process)."""
        _check_settings(data)
        strategy, batch_size = data.shuffle, data.batch_size
        plans = []
        for j, source in enumerate(self.sources):
            pinned = pin_source(source, f"{split}.sources[{j}]")
            plans.append(
                build_plan(
                    f"{split}/{self.names[j]}",
                    pinned,
                    strategy,
                    data.filter_read,
                    batch_size,
                    False,
                    packing=data.packing,
                )
            )
        first = read_schema(plans[0])
        if MIXTURE_SOURCE in first.names:
            raise ConfigError(
                f"{split}.sources[0].columns",
                list(plans[0].source.columns),
                f"a mixture adds the column {MIXTURE_SOURCE!r} (each row's source index), which a source already reads",
                f"leave {MIXTURE_SOURCE!r} out of the sources' columns",
            )
        for j, plan in enumerate(plans[1:], start=1):
            schema = read_schema(plan)
            if _fields(schema) != _fields(first):
                raise ConfigError(
                    f"{split}.sources[{j}].columns",
                    list(plan.source.columns),
                    f"source '{self.names[j]}' reads {_fields(schema)}; '{self.names[0]}' reads {_fields(first)}",
                    "read the same columns, with the same types, from every source",
                )
        rows = [plan.matched_rows for plan in plans]
        positions = epoch_positions(self.epoch, self.samples, rows, self.counts, self.block)
        if positions == 0:
            short = min(range(len(rows)), key=lambda j: rows[j] / self.counts[j])
            raise ConfigError(
                "block",
                self.block,
                f"source '{self.names[short]}' has {rows[short]} row(s), fewer than its {self.counts[short]} per "
                "block, so epoch='first_exhausted' has no whole block",
                f"use block <= {max(1, rows[short] * self.block // self.counts[short])}, or epoch='samples'",
            )
        return MixturePlan(
            split,
            tuple(plans),
            tuple(self.names),
            tuple(self.weights),
            tuple(self.counts),
            self.block,
            self.epoch,
            self.samples,
            strategy,
            batch_size,
            data.drop_last,
            positions,
        )


def _check_settings(data: Any) -> None:
    """Refuse data module settings a mixture does not support (yet)."""
    if data.materialize is not None:
        raise ConfigError(
            "materialize", data.materialize, "a mixture's sources are read in place", "drop `materialize`"
        )
    if type(data.bad_rows) is not RaiseOnBadRow:
        raise ConfigError(
            "bad_rows", data.bad_rows, "a mixture cannot replace bad rows yet", "use RaiseOnBadRow (the default)"
        )


def _fields(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
