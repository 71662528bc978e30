"""Each split's plan for `LanceDataModule`: which splits a stage reads, each pinned and planned
once from its source, and checked against the topology and the columns before any loader is built.

Guarantees:
- `SplitPlans.needed` names the splits a trainer stage reads (every configured one for ``None``);
  a stage whose split is not configured is a `ConfigError` naming it and the fix.
- `SplitPlans.plan` pins the source to one dataset version and plans the split from it and one
  frozen `SplitSettings`, by `plan_split`, in the main process before any worker starts: through
  the materialized view when the data module materializes (a mixture is read as it is), and through
  the remote cache (a remote split read by take). Plans do not depend on the topology, so planning
  before ``fit`` costs nothing twice. A split planned in place of its source (`LanceDataModule.plan_instead`)
  keeps the ``_position`` shifts of the wider read; planning a split again drops them.
- `SplitPlans.check` runs at every ``setup``: every plan fits the world size (`check_fits`), null
  fills name columns a split reads, and every column read converts (`check_read_schema`); bad input
  raises `ConfigError` naming parameter, value, fix.
- It holds no data module, trainer or loader: everything it uses is given to its constructor or to
  each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lance_lightning.arguments import check_fill_nulls
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.cache import RemoteCache
from lance_lightning.materialize.view import MaterializedView
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.plan.planner import check_fits
from lance_lightning.plan.split import plan_split
from lance_lightning.produce.schema import check_read_schema
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import LanceSource
from lance_lightning.vocabulary import SPLITS_OF_STAGE, STAGE_OF_SPLIT, BatchTransform, Split


class SplitPlans:
    """The plans of a data module's splits (see the module docstring).

    Args:
        sources: Each split's configured source (``None``: not configured).
        settings: How each split is planned besides its source (`lance_lightning.arguments.split_settings`).
        arguments: The data module's arguments, defaults resolved: its ``materialize``,
            ``remote_cache``, ``retry``, ``fill_nulls`` and ``transform`` are read.
    """

    def __init__(
        self, sources: Mapping[Split, Any], settings: Mapping[Split, SplitSettings], arguments: Mapping[str, Any]
    ) -> None:
        self.sources = sources
        self.settings = settings
        self.materialize: MaterializedView | None = arguments["materialize"]
        self.remote_cache: RemoteCache = arguments["remote_cache"]
        self.retry: RetryPolicy = arguments["retry"]
        self.fill_nulls: Mapping[str, Any] = arguments["fill_nulls"]
        self.transform: BatchTransform | None = arguments["transform"]
        self.plans: dict[Split, Plan] = {}
        #: Per split planned in place of its source: ``(start, offset)`` pairs kept on its ``_position``.
        self.position_shifts: dict[Split, list[tuple[int, int]]] = {}

    def needed(self, stage: str | None) -> tuple[Split, ...]:
        """The configured splits ``stage`` reads (all configured ones for ``None``) not planned yet."""
        needed = SPLITS_OF_STAGE.get(stage or "", tuple(s for s, src in self.sources.items() if src))
        required = {stage_: split for split, stage_ in STAGE_OF_SPLIT.items()}.get(stage or "")
        if required and self.sources[required] is None:
            raise ConfigError(
                required,
                None,
                f"trainer stage '{stage}' reads the {required} split, which is not configured",
                f"set `data.{required}` (LanceDataModule({required}=LanceSource(uri=...)))",
            )
        return tuple(split for split in needed if self.sources[split] is not None and split not in self.plans)

    def plan(
        self, split: Split, source: LanceSource | None = None, position_shifts: list[tuple[int, int]] | None = None
    ) -> Plan:
        """Pin and plan ``split`` from ``source``, else from its configured source (through the view,
        if materializing); ``position_shifts`` keep the ``_position`` of a wider read."""
        if source is None:
            source = self.sources[split]
            if self.materialize is not None and not isinstance(source, LanceMixture):
                source = self.materialize.apply(source, split)
        settings = self.settings[split]
        self.position_shifts.pop(split, None)
        self.plans[split] = self.remote_cache.apply(split, plan_split(split, source, settings), settings, self.retry)
        if position_shifts:
            self.position_shifts[split] = list(position_shifts)
        return self.plans[split]

    def check(self, world_size: int) -> None:
        """Check that every planned split fits ``world_size`` ranks and its columns convert."""
        for plan in self.plans.values():
            check_fits(plan, world_size)
        check_fill_nulls(self.fill_nulls, self.plans)
        check_read_schema(self.plans, self.fill_nulls, self.transform)
