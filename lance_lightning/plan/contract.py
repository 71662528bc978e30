"""The plan contract: what every stage may ask of a split's plan, whatever kind it is.

Guarantees:
- `Plan` names everything the stages after planning (the cursor, the loader, the dataset, the
  producer, the schema check, the device guard, the monitor, the data module) read from a plan.
  Both kinds of plan satisfy it: `lance_lightning.plan.planner.ReadPlan` (one source, rows or
  packed windows) and `lance_lightning.plan.mixture_plan.MixturePlan` (weighted sources). A third kind
  implements these members, one planning branch in `lance_lightning.plan.split` and one reader
  in `lance_lightning.read.factory`; nothing else changes. ``tests/unit/test_layering.py`` checks
  that modules outside ``plan/`` and the kind-specific readers ask a plan for nothing else.
- A plan is a frozen, picklable value of the data (no topology): one sequence of
  ``matched_rows`` units per epoch that `Layout` shards over any number of ranks.
- `SplitSettings` is the one value a split is planned from besides its source, built once per
  split by the data module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lance_lightning.plan.layout import Layout
from lance_lightning.plan.packing import TokenPacking
from lance_lightning.plan.rowset import RowSet
from lance_lightning.plan.strategies import FilterRead, ShuffleStrategy
from lance_lightning.source import PinnedSource


@dataclass(frozen=True)
class SplitSettings:
    """How one split is planned, besides its source."""

    strategy: ShuffleStrategy
    filter_read: FilterRead
    batch_size: int
    drop_last: bool
    #: Pad the tail step so every rank has a batch; predict does not (it runs no collective per step).
    pad: bool = True
    packing: TokenPacking | None = None


@runtime_checkable
class Plan(Protocol):
    """What a split's plan answers (module docstring)."""

    @property
    def split(self) -> str: ...

    @property
    def matched_rows(self) -> int:
        """Units per epoch (rows, windows with packing, samples of a mixture)."""

    @property
    def batch_size(self) -> int: ...

    @property
    def drop_last(self) -> bool: ...

    @property
    def strategy(self) -> ShuffleStrategy: ...

    @property
    def method(self) -> str:
        """How rows are read: ``"scan"`` or ``"take"``."""

    @property
    def matches(self) -> RowSet | None:
        """The single source's matching rows (``None``: all match, or several sources)."""

    @property
    def row_bytes(self) -> int:
        """Estimated Arrow bytes per unit of the read columns (sizes read groups)."""

    @property
    def source(self) -> PinnedSource:
        """The first source: all sources read the same columns with the same types."""

    @property
    def sources(self) -> tuple[PinnedSource, ...]:
        """Every pinned source the plan reads, in ``source`` column order."""

    @property
    def source_names(self) -> tuple[str, ...]:
        """A name per source, for messages and metrics."""

    @property
    def added_columns(self) -> tuple[str, ...]:
        """Columns the plan's batches carry beyond the sources' (a mixture's ``source``)."""

    @property
    def packed(self) -> bool:
        """Whether the units are packed token windows."""

    @property
    def unit(self) -> str:
        """What ``matched_rows`` counts, in words: ``row``, ``window`` or ``sample``."""

    def layout(self, world_size: int, start: int = 0) -> Layout: ...

    def identity(self) -> dict[str, Any]:
        """Plain description of everything that determines the epoch order (no credentials)."""

    def explain(self, world_size: int = 1) -> str: ...

    def source_counts(self, epoch: int, end: int) -> dict[str, int]:
        """Units of each source among the first ``end`` of ``epoch`` (empty for one source)."""

    def scheduled_shares(self, epoch: int, end: int) -> dict[str, float]:
        """Each source's share of the first ``end`` units of ``epoch`` as the mixture's weights or
        schedule set it (the monitor logs it beside the delivered share; empty for one source)."""

    def resume_identity(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's plan identity ``saved`` as this plan compares it to `identity` on resume:
        ``saved`` itself, except where the plan's resume policy accepts a difference (a mixture
        with ``on_schedule_change="continue"`` takes its current weights or schedule)."""
