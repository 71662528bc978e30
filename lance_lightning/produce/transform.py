"""Where the user's ``transform`` runs: each batch table converted to tensors, then transformed,
with the bad-row policy applied to rows the transform rejects.

Guarantees:
- `TransformStep` converts a table (`lance_lightning.produce.convert`; packed windows gain
  ``cu_seqlens``/``max_seqlen``), runs the transform on the batch and measures both in the
  loader's `StageClock` (``convert``, ``transform``). It runs on the reader threads of the process
  that reads (the training process, or a DataLoader worker): `lance_lightning.produce.producer`.
- A row the transform rejects with `RowError` is handled by the split's policy in the one bad-row
  loop (`lance_lightning.produce.badrows.transform_with_policy`, which the device guard shares):
  raised naming the row, or replaced by the same row on every run, rank count and resume; each
  is counted once as ``bad_rows``. Other errors pass through.
- `finish` returns the rows' dataset positions beside the batch (bad ones replaced), for a
  ``device_transform``'s own guard (`lance_lightning.device.guard`).
- With an ``identity`` (`lance_lightning.produce.identity`), each converted batch carries its
  rows' identity keys before the transform runs, a replaced row its replacement's address.
- With ``blob_files``, each batch carries those blob columns as lists of seekable ``lance.BlobFile``
  objects (`lance_lightning.read.blobs.open_blob_files`), in row order, before the transform runs.
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
from lance_lightning.produce.badrows import BadRowPolicy, transform_with_policy
from lance_lightning.produce.convert import to_torch_batch
from lance_lightning.produce.identity import RowIdentity
from lance_lightning.read.blobs import open_blob_files
from lance_lightning.vocabulary import Batch


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
        identity: Adds the rows' identity keys to each converted batch (``None``: none).
        blob_files: Blob columns handed on as file objects (the plan does not read them).
    """

    def __init__(
        self,
        policy: BadRowPolicy,
        plan: Plan,
        transform: Callable[[Batch], Any] | None,
        fill_nulls: dict[str, Any],
        clock: StageClock,
        identity: RowIdentity | None = None,
        blob_files: tuple[str, ...] = (),
    ) -> None:
        self.policy = policy
        self.identity = identity
        self.blob_files = blob_files
        self.plan = plan
        self.transform = transform
        self.fill_nulls = fill_nulls
        self.clock = clock

    def __call__(self, table: pa.Table, positions: np.ndarray) -> Any:
        """The finished batch of ``table``, whose row ``i`` is dataset position ``positions[i]``."""
        return self.finish(table, positions)[0]

    def finish(
        self, table: pa.Table, positions: np.ndarray, sequence: np.ndarray | None = None
    ) -> tuple[Any, np.ndarray]:
        """The finished batch, and the positions of its rows (bad ones replaced); ``sequence``: the
        rows' positions in the epoch's order (for the identity keys)."""
        return transform_with_policy(_TableForm(self, sequence), table, positions, self.policy, self.plan, self.clock)

    def convert(self, table: pa.Table, positions: np.ndarray, sequence: np.ndarray | None = None) -> Batch:
        """``table`` as tensors (with the identity keys of rows at dataset ``positions`` and epoch
        positions ``sequence``), unmeasured: all a batch needs when there is no transform (no row
        can be bad then), so the caller may measure a whole read group at once."""
        batch = to_torch_batch(table, self.fill_nulls)
        if self.plan.packed:
            batch["cu_seqlens"], batch["max_seqlen"] = sequence_bounds(batch["document_ids"])
        if self.identity is not None:
            if sequence is None:
                raise ValueError("TransformStep: row identity keys need the rows' epoch positions (sequence)")
            batch.update(self.identity.keys(positions, sequence))
        for name in self.blob_files:
            batch[name] = open_blob_files(self.plan.source, name, positions)
        return batch


class _TableForm:
    """A host batch as the bad-row loop holds it (`lance_lightning.produce.badrows.BatchForm`): the
    table read, converted and transformed (measured) on each pass."""

    def __init__(self, step: TransformStep, sequence: np.ndarray | None) -> None:
        self.step = step
        self.sequence = sequence

    def attempt(self, table: pa.Table, positions: np.ndarray) -> Any:
        step = self.step
        with step.clock.measure("convert", rows=table.num_rows):
            batch = step.convert(table, positions, self.sequence)
        if step.transform is None:
            return batch
        with step.clock.measure("transform", rows=table.num_rows):
            return step.transform(batch)

    def value(self, table: pa.Table, column: str, index: int) -> Any:
        return table.column(column)[index].as_py() if column in table.column_names else None

    def columns(self, table: pa.Table) -> list[str]:
        return table.column_names

    def accepts(self, row: pa.Table, positions: np.ndarray, index: int) -> bool:
        # A candidate is tried in the bad row's slot (its epoch position seeds the draws); its
        # address is the bad row's here, its own once it is spliced in and the batch converted again.
        sequence = None if self.sequence is None else self.sequence[index : index + 1]
        try:
            batch = self.step.convert(row, positions[index : index + 1], sequence)
            if self.step.transform is not None:  # only a transform rejects rows
                self.step.transform(batch)
        except RowError:
            return False
        return True

    def splice(self, table: pa.Table, index: int, row: pa.Table) -> pa.Table:
        return pa.concat_tables([table.slice(0, index), row.cast(table.schema), table.slice(index + 1)])
