"""The plan contract: what every stage may ask of a split's plan, whatever kind it is.

Guarantees:
- `Plan` names only what the stages after planning (the cursor, the loader, the dataset, the
  producer, the schema check, the bad-row policy, the data module) read from every plan, and
  each kind answers each member with its own value: `lance_lightning.plan.planner.ReadPlan` (one
  source, rows or packed windows) and `lance_lightning.plan.mixture_plan.MixturePlan` (weighted
  sources). What one kind alone has stays on its class, and a stage that needs it checks the
  kind first (``isinstance``): a `ReadPlan`'s ``matches`` and packing ``documents``; a
  `MixturePlan`'s ``source_counts``, ``scheduled_shares`` (the monitor) and ``resume_identity``
  (the cursor). A third kind implements these members, one planning branch in
  `lance_lightning.plan.split`, one reader in `lance_lightning.read.factory` and one branch
  choosing its bad-row replacements in `lance_lightning.produce.badrows`; nothing else changes.
  ``tests/unit/test_layering.py`` checks that modules outside ``plan/`` and the kind-specific
  readers ask a plan for nothing else, unless they checked its kind.
- Every plan is built by `lance_lightning.plan.split.plan_split` (the one planning entry).
- A plan is a frozen, picklable value of the data (no topology): one sequence of
  ``matched_rows`` units per epoch that `Layout` shards over any number of ranks.
- `SplitSettings` is the one value a split is planned from besides its source, built once per
  split by the data module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lance_lightning.media.samplers import ClipSampler
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.packing import TokenPacking
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
    #: With a clip sampler the units are clips of the media column (`lance_lightning.plan.clips`).
    clips: ClipSampler | None = None


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
    def row_bytes(self) -> int:
        """Estimated Arrow bytes per unit of the read columns (sizes read groups)."""

    @property
    def source(self) -> PinnedSource:
        """The first source: all sources read the same columns with the same types."""

    @property
    def sources(self) -> tuple[PinnedSource, ...]:
        """Every pinned source the plan reads, in ``source`` column order."""

    @property
    def packed(self) -> bool:
        """Whether the units are packed token windows."""

    @property
    def clipped(self) -> bool:
        """Whether the units are clips of media rows (`lance_lightning.plan.clips`)."""

    @property
    def unit(self) -> str:
        """What ``matched_rows`` counts, in words: ``row``, ``window``, ``clip`` or ``sample``."""

    def layout(self, world_size: int, start: int = 0) -> Layout: ...

    def identity(self) -> dict[str, Any]:
        """Plain description of everything that determines the epoch order (no credentials)."""

    def explain(self, world_size: int = 1) -> str: ...
