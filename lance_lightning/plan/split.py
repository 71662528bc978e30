"""Planning: the one function every plan of the package is built by.

Guarantees:
- `plan_split` is the only caller of the planning steps (`lance_lightning.plan.survey`'s setup
  I/O, `lance_lightning.plan.planner.plan_reads`, `lance_lightning.plan.mixture.plan_mixture`);
  ``tests/unit/plan/test_planning_entry.py`` fails when another module calls a step or
  constructs a plan. Its callers: the data module (each configured split), the remote cache (a
  split again over its local copy) and `lance_lightning.load.dataset.LanceMapDataset`.
- It returns the split's `Plan` (`lance_lightning.plan.contract`): a `ReadPlan` for a
  `LanceSource` (pinned here, in the calling process) or an already `PinnedSource` (planned as
  pinned: a local copy keeps the ``stands_for`` it was given), a `MixturePlan` for a
  `LanceMixture` (every source pinned here and planned as one source, without ``drop_last``).
- Setup I/O happens here once per call; the result depends only on the data and ``settings``.
  A source without matching rows is a `ConfigError` naming the split, unless ``allow_empty``
  (the map dataset's: it then has no rows).
- A new kind of plan is one more branch here (and one reader in `lance_lightning.read.factory`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import overload

from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.mixture import LanceMixture, plan_mixture
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan, plan_reads
from lance_lightning.plan.survey import survey, survey_clips, survey_tokens
from lance_lightning.source import LanceSource, PinnedSource, pin_source


@overload
def plan_split(
    split: str, source: LanceSource | PinnedSource, settings: SplitSettings, *, allow_empty: bool = False
) -> ReadPlan: ...


@overload
def plan_split(
    split: str, source: LanceMixture, settings: SplitSettings, *, allow_empty: bool = False
) -> MixturePlan: ...


def plan_split(
    split: str,
    source: LanceSource | PinnedSource | LanceMixture,
    settings: SplitSettings,
    *,
    allow_empty: bool = False,
) -> Plan:
    """The plan of ``split`` read from ``source`` under ``settings`` (module docstring)."""
    if isinstance(source, LanceMixture):
        each = replace(settings, drop_last=False)
        plans = tuple(
            _plan_source(f"{split}/{name}", _pin_member(source, j, split), each, allow_empty)
            for j, name in enumerate(source.names)
        )
        return plan_mixture(split, source, plans, settings)
    pinned = source if isinstance(source, PinnedSource) else pin_source(source, split)
    return _plan_source(split, pinned, settings, allow_empty)


def _pin_member(mixture: LanceMixture, j: int, split: str) -> PinnedSource:
    """Source ``j`` of ``mixture`` pinned, shown as a resume re-pinned it (`LanceMixture.pinned_by`)."""
    pinned = pin_source(mixture.sources[j], f"{split}.sources[{j}]")
    return replace(pinned, pinned_by=mixture.pinned_by[j]) if mixture.pinned_by[j] else pinned


def _plan_source(split: str, source: PinnedSource, settings: SplitSettings, allow_empty: bool) -> ReadPlan:
    """Survey (setup I/O) and plan the rows (or the windows with packing, the clips with a clip
    sampler) of one pinned source."""
    surveyed = survey(split, source, allow_empty=allow_empty, sample_rows=settings.clips is None)
    if settings.packing is not None:
        surveyed = survey_tokens(split, source, surveyed, settings.packing)
    if settings.clips is not None:
        surveyed = survey_clips(split, source, surveyed, settings.clips)
    return plan_reads(split, source, surveyed, settings)
