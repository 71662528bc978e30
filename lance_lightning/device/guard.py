"""The bad-row policy on the device: a ``device_transform`` that rejects a row is handled as on the host.

Guarantees: `DeviceRowGuard` runs the device transform on a device batch (e.g.
``DecodeImage(device="cuda")``) through the same bad-row loop as the host's
`lance_lightning.produce.transform.TransformStep`
(`lance_lightning.produce.badrows.transform_with_policy`): a row it rejects with `RowError` is
counted once as ``bad_rows`` and raised naming it, or replaced by the same row (same seed,
position and attempt), so batch sizes and the data cursor stay exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lance_lightning.errors import RowError
from lance_lightning.metrics.clock import StageClock
from lance_lightning.plan.contract import Plan
from lance_lightning.produce import badrows
from lance_lightning.produce.badrows import BadRowPolicy, transform_with_policy
from lance_lightning.produce.convert import to_torch_batch
from lance_lightning.vocabulary import Batch


class DeviceRowGuard:
    """Runs the device transform on a device batch, applying the policy to rows it rejects.

    Called with the batch and its rows' dataset positions (kept beside it, on the host); a rejected row
    is described, or replaced by the same candidate `TransformStep` would pick, exactly as on the
    host: the candidate is read, converted, transformed on the host, moved and transformed on the
    device, then put in the bad row's place, and the whole batch is transformed again.

    Args:
        policy: `RaiseOnBadRow` or `ReplaceBadRow`.
        plan: The split's read plan (source, matching rows and their positions).
        transform: The host transform (``None``: none), run on candidates.
        fill_nulls: Per-column null fill values, as for `to_torch_batch`.
        device_transform: The transform that runs on the device batch.
        to_device: Moves a host batch to the device as the data module does.
        clock: Where the ``bad_rows`` count goes.
    """

    def __init__(
        self,
        policy: BadRowPolicy,
        plan: Plan,
        transform: Callable[[Batch], Batch] | None,
        fill_nulls: Mapping[str, Any],
        device_transform: Callable[[Batch], Batch],
        to_device: Callable[[Batch], Batch],
        clock: StageClock,
    ) -> None:
        self.policy = policy
        self.plan = plan
        self.transform = transform
        self.fill_nulls = fill_nulls
        self.device_transform = device_transform
        self.to_device = to_device
        self.clock = clock

    def __call__(self, batch: Batch, shipped: Any) -> Any:
        if shipped is None:
            return self.device_transform(batch)
        positions = torch.as_tensor(shipped).cpu().numpy().astype(np.int64)  # a copy: replacements edit it
        return transform_with_policy(self, batch, positions, self.policy, self.plan, self.clock)[0]

    # -- the device batch as the bad-row loop holds it (`lance_lightning.produce.badrows.BatchForm`) --
    def attempt(self, batch: Batch, positions: np.ndarray) -> Any:
        return self.device_transform(batch)

    def value(self, batch: Batch, column: str, index: int) -> Any:
        values = batch.get(column)
        if isinstance(values, torch.Tensor) and values.dim() == 1:
            return values[index].item()
        return values[index] if isinstance(values, list) else None

    def columns(self, batch: Batch) -> list[str]:
        return list(self.plan.source.columns)

    def accepts(self, row: pa.Table, positions: np.ndarray, index: int) -> bool:
        try:
            self.device_transform(self._prepared(row))
        except RowError:
            return False
        return True

    def splice(self, batch: Batch, index: int, row: pa.Table) -> Batch:
        return badrows.splice(batch, index, self._prepared(row))

    def _prepared(self, row: pa.Table) -> Batch:
        """``row`` as the device transform receives it: converted, host-transformed, on the device."""
        batch = to_torch_batch(row, self.fill_nulls)
        return self.to_device(self.transform(batch) if self.transform is not None else batch)
