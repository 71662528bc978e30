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
- With packing (rows are token windows cut across documents) `ReplaceBadRow` is refused with
  `ConfigError` when the data module is made (`check_packed_policy`).
- Every bad row is counted once, as ``bad_rows`` in the loader's `StageClock` (and so in the
  data metrics), whatever the policy.
- The policies act where the transform runs, through one loop, `transform_with_policy`: on the
  host in `lance_lightning.produce.transform.TransformStep`, on the device in
  `lance_lightning.device.guard.DeviceRowGuard` (for a ``device_transform``, e.g.
  ``DecodeImage(device="cuda")``; the rows' positions travel beside the batch). Each stage says
  only how it holds a batch (a `BatchForm`); the loop raises or replaces the same way for both,
  choosing the same replacement rows (`replacement`) with the same counts and error text.
- A replacement is chosen among the split's matching rows (`ReadPlan.matches`). A mixture's bad
  row is named in its own source (a mixture refuses `ReplaceBadRow` when the data module is made).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch

from lance_lightning.checks import check_int
from lance_lightning.errors import BadRowError, ConfigError, RowError
from lance_lightning.metrics.clock import StageClock
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.rowset import RowSet
from lance_lightning.produce.convert import Ragged
from lance_lightning.read.lance_io import read_positions
from lance_lightning.source import PinnedSource
from lance_lightning.vocabulary import MIXTURE_SOURCE, Batch

log = logging.getLogger("lance_lightning")
B = TypeVar("B")


class BadRowPolicy:
    """Base class of the policies; ``id_column`` names the column quoted in messages."""

    def __init__(self, id_column: str | None = "id") -> None:
        if id_column is not None and (not isinstance(id_column, str) or not id_column):
            raise ConfigError(
                "bad_rows.id_column",
                id_column,
                "must be a column name or None",
                'set id_column="id" (or your id column), or None',
            )
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
        check_int("bad_rows.seed", seed, None, "set seed: 0")
        check_int("bad_rows.max_attempts", max_attempts, 1, "set max_attempts: 16")
        self.seed = seed
        self.max_attempts = max_attempts

    def candidate(self, position: int, attempt: int, rows: int) -> int:
        """Index (among the split's ``rows`` matching rows) of replacement ``attempt`` for ``position``."""
        digest = hashlib.blake2b(f"{self.seed}:{position}:{attempt}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % rows


def check_packed_policy(policy: BadRowPolicy, packing: Any) -> None:
    """`ConfigError` for `ReplaceBadRow` with packing: a packed batch's rows are windows cut across
    documents, which no replacement row can stand for."""
    if packing is not None and isinstance(policy, ReplaceBadRow):
        raise ConfigError(
            "bad_rows",
            policy,
            "cannot replace rows of packed token windows (packing is set)",
            "keep the default bad_rows (RaiseOnBadRow) with packing",
        )


class BatchForm(Protocol[B]):
    """How a stage holds a batch ``B`` (the host's table, the device's tensors): what the bad-row
    loop, `transform_with_policy`, asks of it."""

    def attempt(self, batch: B, positions: np.ndarray) -> Any:
        """The transformed batch (or `RowError` for a bad row); its rows are at ``positions``."""

    def value(self, batch: B, column: str, index: int) -> Any:
        """Row ``index``'s value of ``column`` (``None`` when the batch has no such column)."""

    def columns(self, batch: B) -> list[str]:
        """The columns a replacement row is read with."""

    def accepts(self, row: pa.Table, positions: np.ndarray, index: int) -> bool:
        """Whether the one-row table ``row`` transforms in the place of row ``index``."""

    def splice(self, batch: B, index: int, row: pa.Table) -> B:
        """``batch`` with its row ``index`` replaced by ``row``."""


def transform_with_policy(
    form: BatchForm[B], batch: B, positions: np.ndarray, policy: BadRowPolicy, plan: Plan, clock: StageClock
) -> tuple[Any, np.ndarray]:
    """The transformed ``batch`` (its rows at dataset ``positions``) and its rows' positions: a row
    the transform rejects with `RowError` is counted as ``bad_rows`` in ``clock``, then raised
    naming it, or replaced by `replacement`'s row, and the batch is transformed again."""
    positions = np.asarray(positions)
    # Each pass fixes one bad row; a replacement was checked first, so it cannot fail again.
    for _ in range(len(positions) + 1):
        try:
            return form.attempt(batch, positions), positions
        except RowError as error:
            if not 0 <= error.index < len(positions):
                raise
            clock.add("bad_rows", 1)
            batch, positions = _replace(form, batch, positions, error, policy, plan)
    raise AssertionError("unreachable: every pass replaces one row")  # pragma: no cover


def _replace(
    form: BatchForm[B], batch: B, positions: np.ndarray, error: RowError, policy: BadRowPolicy, plan: Plan
) -> tuple[B, np.ndarray]:
    """``batch`` and ``positions`` with the bad row ``error.index`` replaced (or `BadRowError`)."""
    index = error.index
    row_id = None if policy.id_column is None else form.value(batch, policy.id_column, index)
    if plan.clipped:  # the reader replaced bad media already; a clip stands for no one row to read again
        raise BadRowError(
            f"bad row: clip {int(positions[index])} of split '{plan.split}' could not be transformed in column "
            f"{error.column!r}: {error.reason}. With clips, ReplaceBadRow replaces media that does not decode; "
            "fix the transform, or filter the row out",
            None,
            error.column,
            row_id,
        ) from error
    if isinstance(plan, MixturePlan):  # a mixture's row: named in its own source
        source, matches = plan.sources[form.value(batch, MIXTURE_SOURCE, index)], None
    elif isinstance(plan, ReadPlan):
        source, matches = plan.source, plan.matches
    else:  # pragma: no cover - a new kind of plan says where its replacements come from
        raise TypeError(f"no bad-row replacement for a {type(plan).__name__}")

    def transforms(row: pa.Table) -> bool:
        return form.accepts(row, positions, index)

    candidate, row = replacement(
        policy,
        source,
        plan.matched_rows,
        matches,
        int(positions[index]),
        row_id,
        error,
        form.columns(batch),
        transforms,
    )
    fixed = positions.copy()
    fixed[index] = candidate
    return form.splice(batch, index, row), fixed


def replacement(
    policy: BadRowPolicy,
    source: PinnedSource,
    rows: int,
    matches: RowSet | None,
    position: int,
    row_id: Any,
    error: RowError,
    columns: list[str],
    transforms: Callable[[pa.Table], bool],
) -> tuple[int, pa.Table]:
    """``(position, row)`` of the replacement for the bad row at ``position`` (its ``columns``): the
    first candidate of `ReplaceBadRow` that ``transforms``; raises `BadRowError` under
    `RaiseOnBadRow`, or when no candidate transforms."""
    where = f"dataset row {position}" + (f" ({policy.id_column}={row_id!r})" if row_id is not None else "")
    where = f"{where} of {source.uri} (version {source.version}), column {error.column!r}"
    if not isinstance(policy, ReplaceBadRow):
        raise BadRowError(
            f"bad row: {where} could not be transformed: {error.reason}. Fix or delete the "
            "row, filter it out, or pass `bad_rows=ReplaceBadRow()` to replace bad rows",
            position,
            error.column,
            row_id,
        ) from error
    for attempt in range(policy.max_attempts):
        pick = policy.candidate(position, attempt, rows)
        candidate = int(pick if matches is None else matches.select(np.array([pick]))[0])
        if candidate == position:
            continue
        row = read_positions(source, np.array([candidate], dtype=np.int64), scan_mode=False).select(columns)
        if transforms(row):
            log.warning("bad row replaced: %s (%s); using dataset row %d instead", where, error.reason, candidate)
            return candidate, row
    raise BadRowError(
        f"bad row: {where} could not be transformed ({error.reason}), and none of "
        f"{policy.max_attempts} replacement candidates could either. Check the data, or "
        "raise `ReplaceBadRow.max_attempts`",
        position,
        error.column,
        row_id,
    ) from error


def splice(batch: Batch, index: int, row: Batch) -> Batch:
    """``batch`` with its row ``index`` replaced by the one row of ``row`` (same columns)."""
    out: Batch = {}
    for key, value in batch.items():
        new = row[key]
        if isinstance(value, torch.Tensor):
            value = value.clone()
            value[index] = new[0].to(value.device)
        elif isinstance(value, Ragged):
            lengths = value.lengths().clone()
            lengths[index] = len(new.values)
            start, end = int(value.offsets[index]), int(value.offsets[index + 1])
            values = torch.cat([value.values[:start], new.values.to(value.values.device), value.values[end:]])
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
            value = Ragged(values, offsets)
        elif isinstance(value, list):
            value = [*value[:index], new[0], *value[index + 1 :]]
        else:
            raise TypeError(f"column {key!r}: cannot replace a bad row in a {type(value).__name__}")
        out[key] = value
    return out
