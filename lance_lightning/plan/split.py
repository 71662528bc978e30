"""Planning one split: the one place that tells a plain source from a mixture.

Guarantees:
- `plan_split` pins the configured source of a split (every source of a mixture) in the calling
  process and returns its `Plan` (`lance_lightning.plan.contract`): a `ReadPlan` for a
  `LanceSource`, a `MixturePlan` for a `LanceMixture`. Setup I/O happens here once per call
  (`lance_lightning.plan.survey`); the result depends only on the data and ``settings``.
- A new kind of plan is one more branch here (and one reader in `lance_lightning.read.factory`).
"""

from __future__ import annotations

from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.mixture import LanceMixture, plan_mixture
from lance_lightning.plan.survey import build_plan
from lance_lightning.source import LanceSource, pin_source


def plan_split(split: str, source: LanceSource | LanceMixture, settings: SplitSettings) -> Plan:
    """The plan of ``split`` read from ``source`` under ``settings``."""
    if isinstance(source, LanceMixture):
        return plan_mixture(split, source, settings)
    return build_plan(split, pin_source(source, split), settings)
