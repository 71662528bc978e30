"""Bad rows: what happens when a row's bytes do not decode.

Guarantees:
- A transform reports a bad row by raising `RowError` (e.g. `ImageDecodeError`) with the row's
  index in the batch and the column. Nothing else is treated as a bad row: other errors pass
  through unchanged.
- `RaiseOnBadRow` (the default) raises `BadRowError` naming the dataset row position (its offset
  in the pinned version), the value of the id column when the batch has one, and the column.
  The error keeps its type when it comes out of a DataLoader worker process.
- `ReplaceBadRow` puts another row of the split in the bad row's place and transforms the batch
  again. The replacement depends only on ``(seed, position, attempt)``, so every run, rank count
  and resume picks the same one; batch sizes never change, so every rank still yields the same
  number of batches and the data cursor stays exact.
- Every bad row is counted once, as ``bad_rows`` in the loader's `StageClock` (and so in the
  data metrics), whatever the policy.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from lance_lightning.convert import to_torch_batch
from lance_lightning.errors import ConfigError
from lance_lightning.metrics import StageClock
from lance_lightning.plan.rowset import RowSet
from lance_lightning.read import read_positions
from lance_lightning.source import PinnedSource

Batch = dict[str, Any]
log = logging.getLogger("lance_lightning")


class RowError(ValueError):
    """Raised by a transform: row ``index`` of the batch cannot be transformed in ``column``."""

    def __init__(self, column: str, index: int, reason: str) -> None:
        self.column = column
        self.index = index
        self.reason = reason
        super().__init__(f"column {column!r}: row {index} of the batch: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.column, self.index, self.reason))


class BadRowError(ValueError):
    """A dataset row could not be transformed. Names the row position, id value and column."""

    def __init__(self, message: str, position: int | None = None, column: str | None = None,
                 row_id: Any = None) -> None:
        super().__init__(message)
        self.position = position
        self.column = column
        self.row_id = row_id


class BadRowPolicy:
    """Base class of the policies; ``id_column`` names the column quoted in messages."""

    def __init__(self, id_column: str | None = "id") -> None:
        if id_column is not None and (not isinstance(id_column, str) or not id_column):
            raise ConfigError("bad_rows.id_column", id_column, "must be a column name or None",
                              'set id_column="id" (or your id column), or None')
        self.id_column = id_column

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class RaiseOnBadRow(BadRowPolicy):
    """Stop with `BadRowError` at the first bad row (the default).

    Args:
        id_column: Column whose value is quoted in the error (when the batch has it).
    """


class ReplaceBadRow(BadRowPolicy):
    """Replace a bad row with another row of the split, chosen deterministically.

    Args:
        seed: Chooses the replacement: candidate ``k`` for the row at position ``p`` is the
            matching row ``hash(seed, p, k) % rows``; the first candidate that transforms wins.
        max_attempts: Candidates tried per bad row before giving up with `BadRowError`.
        id_column: Column whose value is quoted in warnings and errors.
    """

    def __init__(self, seed: int = 0, max_attempts: int = 16, id_column: str | None = "id") -> None:
        super().__init__(id_column)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError("bad_rows.seed", seed, "must be an integer", "set seed: 0")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError("bad_rows.max_attempts", max_attempts, "must be an integer >= 1",
                              "set max_attempts: 16")
        self.seed = seed
        self.max_attempts = max_attempts

    def candidate(self, position: int, attempt: int, rows: int) -> int:
        """Index (among the split's ``rows`` matching rows) of replacement ``attempt`` for ``position``."""
        digest = hashlib.blake2b(f"{self.seed}:{position}:{attempt}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % rows


class BadRowGuard:
    """Converts and transforms one batch table, applying the policy to rows the transform rejects.

    Args:
        policy: `RaiseOnBadRow` or `ReplaceBadRow`.
        source: The pinned source the table was read from (replacements are read from it).
        rows: Number of matching rows of the split.
        matches: The matching rows (``None``: match ``i`` is dataset position ``i``).
        transform: The batch transform; ``None`` converts only.
        fill_nulls: Per-column null fill values, as for `to_torch_batch`.
        clock: Where ``convert``/``transform`` times and the ``bad_rows`` count go.
    """

    def __init__(self, policy: BadRowPolicy, source: PinnedSource, rows: int, matches: RowSet | None,
                 transform: Callable[[Batch], Batch] | None, fill_nulls: dict[str, Any], clock: StageClock) -> None:
        self.policy = policy
        self.source = source
        self.rows = rows
        self.matches = matches
        self.transform = transform
        self.fill_nulls = fill_nulls
        self.clock = clock

    def __call__(self, table: pa.Table, positions: np.ndarray) -> Batch:
        """The finished batch of ``table``, whose row ``i`` is dataset position ``positions[i]``."""
        positions = np.asarray(positions)
        # Each pass fixes one bad row; a replacement was checked first, so it cannot fail again.
        for _ in range(table.num_rows + 1):
            with self.clock.measure("convert", rows=table.num_rows):
                batch = self.convert(table)
            if self.transform is None:
                return batch
            try:
                with self.clock.measure("transform", rows=table.num_rows):
                    return self.transform(batch)
            except RowError as error:
                if not 0 <= error.index < table.num_rows:
                    raise
                self.clock.add("bad_rows", 1)
                table, positions = self._replace(table, positions, error)
        raise AssertionError("unreachable: every pass replaces one row")  # pragma: no cover

    def convert(self, table: pa.Table) -> Batch:
        """``table`` as tensors, unmeasured: all a batch needs when there is no transform (no
        row can be bad then), so the caller may measure a whole read group at once."""
        return to_torch_batch(table, self.fill_nulls)

    def _describe(self, table: pa.Table, index: int, position: int, column: str) -> tuple[str, Any]:
        id_column = self.policy.id_column
        row_id = None
        if id_column is not None and id_column in table.column_names:
            row_id = table.column(id_column)[index].as_py()
        where = f"dataset row {position}" + (f" ({id_column}={row_id!r})" if row_id is not None else "")
        return f"{where} of {self.source.uri} (version {self.source.version}), column {column!r}", row_id

    def _replace(self, table: pa.Table, positions: np.ndarray, error: RowError) -> tuple[pa.Table, np.ndarray]:
        index = error.index
        position = int(positions[index])
        where, row_id = self._describe(table, index, position, error.column)
        if not isinstance(self.policy, ReplaceBadRow):
            raise BadRowError(f"bad row: {where} could not be transformed: {error.reason}. Fix or delete the "
                              "row, filter it out, or pass `bad_rows=ReplaceBadRow()` to replace bad rows",
                              position, error.column, row_id) from error
        for attempt in range(self.policy.max_attempts):
            pick = self.policy.candidate(position, attempt, self.rows)
            candidate = int(pick if self.matches is None else self.matches.select(np.array([pick]))[0])
            if candidate == position:
                continue
            row = read_positions(self.source, np.array([candidate], dtype=np.int64), scan_mode=False)
            if self._transforms(row.select(table.column_names)):
                log.warning("bad row replaced: %s (%s); using dataset row %d instead", where, error.reason, candidate)
                fixed = pa.concat_tables([table.slice(0, index), row.select(table.column_names).cast(table.schema),
                                          table.slice(index + 1)])
                fixed_positions = positions.copy()
                fixed_positions[index] = candidate
                return fixed, fixed_positions
        raise BadRowError(f"bad row: {where} could not be transformed ({error.reason}), and none of "
                          f"{self.policy.max_attempts} replacement candidates could either. Check the data, or "
                          "raise `ReplaceBadRow.max_attempts`", position, error.column, row_id) from error

    def _transforms(self, row: pa.Table) -> bool:
        try:
            self.transform(to_torch_batch(row, self.fill_nulls))
        except RowError:
            return False
        return True
