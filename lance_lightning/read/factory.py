"""The reader of a plan: the one place that picks how a kind of plan is read.

Guarantees:
- `plan_reader` returns, for any `Plan` (`lance_lightning.plan.contract`), the reader of one rank's
  batches of one epoch from unit ``start`` on: a `MixtureReader` for a mixture, a `PackedReader`
  for packed token windows, a `ClipReader` for media clips, else a `PlanReader`. All four have the
  same interface (``layout``, ``groups``, ``read_group``), which is all the producer and the
  dataset use.
- A new kind of plan is one more branch here (and one in `lance_lightning.plan.split`).
"""

from __future__ import annotations

from typing import Any

from lance_lightning.plan.contract import Plan
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.read.clips import ClipReader
from lance_lightning.read.mixture_reader import MixtureReader
from lance_lightning.read.packed import PackedReader
from lance_lightning.read.reader import TAKE_GROUP_BYTES, PlanReader
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy


def plan_reader(
    plan: Plan,
    epoch: int,
    world_size: int,
    rank: int,
    start: int,
    retry: RetryPolicy = DEFAULT_POLICY,
    take_group_bytes: int = TAKE_GROUP_BYTES,
    bad_rows: Any = None,
) -> PlanReader | PackedReader | ClipReader | MixtureReader:
    """The reader of ``plan``'s batches for ``rank`` of ``world_size`` in ``epoch``, from ``start``;
    ``bad_rows`` (the split's policy) handles media a clip reader cannot decode."""
    if isinstance(plan, MixturePlan):
        return MixtureReader(plan, epoch, world_size, rank, start, retry=retry, bad_rows=bad_rows)
    if not isinstance(plan, ReadPlan):
        raise TypeError(f"no reader for a {type(plan).__name__}: a ReadPlan or a MixturePlan")
    if plan.clipped:
        return ClipReader(plan, epoch, world_size, rank, start, retry=retry, bad_rows=bad_rows)
    kind = PackedReader if plan.packed else PlanReader
    return kind(plan, epoch, world_size, rank, start, retry=retry, take_group_bytes=take_group_bytes)
