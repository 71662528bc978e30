"""Where the user's ``transform`` runs: each batch table converted to tensors, then transformed,
with the bad-row policy applied to rows the transform rejects.

Guarantees:
- `TransformStep` converts a table (`lance_lightning.produce.convert`; packed windows gain
  ``cu_seqlens``/``max_seqlen``), runs the transform on the batch and measures both in the
  loader's `StageClock` (``convert``, ``transform``). It runs on the reader threads of the process
  that reads (the training process, or a DataLoader worker): `lance_lightning.produce.producer`.
- A row the transform rejects with `RowError` is handled by the split's policy
  (`lance_lightning.produce.badrows`): raised naming the row, or replaced by the same row on every
  run, rank count and resume; each is counted once as ``bad_rows``. Other errors pass through.
- `finish` returns the rows' dataset positions beside the batch (bad ones replaced), for a
  ``device_transform``'s own guard (`lance_lightning.device.guard`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from lance_lightning.errors import RowError
from lance_lightning.metrics.clock import StageClock
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.packing import sequence_bounds
from lance_lightning.produce.badrows import BadRowPolicy, replacement
from lance_lightning.produce.convert import to_torch_batch
from lance_lightning.vocabulary import MIXTURE_SOURCE, Batch


class TransformStep:
    """Converts and transforms one batch table, applying the policy to rows the transform rejects.

    Args:
        policy: `RaiseOnBadRow` or `ReplaceBadRow`.
        plan: The split's plan: replacements are read from its source, among its matching rows; a
            mixture's row is named in its own source; packed windows gain ``cu_seqlens`` and
            ``max_seqlen`` (`lance_lightning.read.packed`).
        transform: The batch transform; ``None`` converts only.
        fill_nulls: Per-column null fill values, as for `to_torch_batch`.
        clock: Where ``convert``/``transform`` times and the ``bad_rows`` count go.
    """

    def __init__(
        self,
        policy: BadRowPolicy,
        plan: Plan,
        transform: Callable[[Batch], Any] | None,
        fill_nulls: dict[str, Any],
        clock: StageClock,
    ) -> None:
        self.policy = policy
        self.plan = plan
        self.transform = transform
        self.fill_nulls = fill_nulls
        self.clock = clock

    def __call__(self, table: pa.Table, positions: np.ndarray) -> Any:
        """The finished batch of ``table``, whose row ``i`` is dataset position ``positions[i]``."""
        return self.finish(table, positions)[0]

    def finish(self, table: pa.Table, positions: np.ndarray) -> tuple[Any, np.ndarray]:
        """The finished batch, and the positions of its rows (bad ones replaced)."""
        positions = np.asarray(positions)
        # Each pass fixes one bad row; a replacement was checked first, so it cannot fail again.
        for _ in range(table.num_rows + 1):
            with self.clock.measure("convert", rows=table.num_rows):
                batch = self.convert(table)
            if self.transform is None:
                return batch, positions
            try:
                with self.clock.measure("transform", rows=table.num_rows):
                    return self.transform(batch), positions
            except RowError as error:
                if not 0 <= error.index < table.num_rows:
                    raise
                self.clock.add("bad_rows", 1)
                table, positions = self._replace(table, positions, error)
        raise AssertionError("unreachable: every pass replaces one row")  # pragma: no cover

    def convert(self, table: pa.Table) -> Batch:
        """``table`` as tensors, unmeasured: all a batch needs when there is no transform (no
        row can be bad then), so the caller may measure a whole read group at once."""
        batch = to_torch_batch(table, self.fill_nulls)
        if self.plan.packed:
            batch["cu_seqlens"], batch["max_seqlen"] = sequence_bounds(batch["document_ids"])
        return batch

    def _replace(self, table: pa.Table, positions: np.ndarray, error: RowError) -> tuple[pa.Table, np.ndarray]:
        index = error.index
        position = int(positions[index])
        row_id = None
        if self.policy.id_column is not None and self.policy.id_column in table.column_names:
            row_id = table.column(self.policy.id_column)[index].as_py()

        def transforms(row: pa.Table) -> bool:
            try:
                self.transform(to_torch_batch(row, self.fill_nulls))
            except RowError:
                return False
            return True

        plan = self.plan
        source = plan.source
        if MIXTURE_SOURCE in plan.added_columns:  # a mixture's row: named in its own source
            source = plan.sources[table.column(MIXTURE_SOURCE)[index].as_py()]
        candidate, row = replacement(
            self.policy,
            source,
            plan.matched_rows,
            plan.matches,
            position,
            row_id,
            error,
            table.column_names,
            transforms,
        )
        fixed = pa.concat_tables([table.slice(0, index), row.cast(table.schema), table.slice(index + 1)])
        fixed_positions = positions.copy()
        fixed_positions[index] = candidate
        return fixed, fixed_positions
