"""Pure read planning: epoch order, batch layout and the plan that ties them to a source."""

from lance_lightning.plan.layout import Layout
from lance_lightning.plan.order import EpochOrder
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.survey import build_plan

__all__ = ["EpochOrder", "Layout", "ReadPlan", "build_plan"]
