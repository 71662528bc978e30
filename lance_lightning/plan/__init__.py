"""Pure read planning: epoch order, batch layout and the plan that ties them to a source.

Names are imported on first use, so a process that needs one light module of the plan (the
filter-scan child reads `lance_lightning.plan.rowset`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EpochOrder": "lance_lightning.plan.order",
    "Layout": "lance_lightning.plan.layout",
    "ReadPlan": "lance_lightning.plan.planner",
    "build_plan": "lance_lightning.plan.survey",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
