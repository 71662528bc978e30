"""Row identity: which row of the pinned dataset each batch row is, and where it sits in the epoch.

Guarantees:
- With identity on (``LanceDataModule(row_identity=...)``), every converted batch gains the keys
  of `lance_lightning.vocabulary.IDENTITY_KEYS`, int64 tensors of one entry per row, before the
  transform runs (so a transform, a ``predict_step`` and a writer all see them):
  ``_rowaddr`` (the row's address in the pinned version, ``fragment_id << 32 | offset``, what
  Lance's ``_rowaddr`` is), ``_rowid`` (Lance's ``_rowid``: the stable row id when the dataset has
  stable row ids, else the row address), ``_position`` (the row's index in the epoch's order, as
  the plan orders it: the same whatever the rank, worker, thread, batch size or resume point) and
  ``_epoch`` (the data epoch). A read restricted to some fragments of a wider read (a prediction
  writer's rerun, `lance_lightning.write.predict_run.restricted`) keeps the wider read's
  ``_position`` values (``shifts``: the offset added from each start of the read's own sequence),
  so per-row draws do not change; a replaced row keeps its slot's, as in the wider read.
- A row replaced by the bad-row policy carries its replacement's address and id, and its slot's
  ``_position`` and ``_epoch`` (its draws, `lance_lightning.transforms.RowRandom`, are the slot's).
- Addresses cost no I/O when the pinned version has no deletions and no stable row ids (computed
  from fragment sizes); otherwise one retried ``take`` of ``_rowid``/``_rowaddr`` per batch.
- `check_identity` refuses, with `ConfigError` in the main process, what identity cannot describe:
  packed windows (cut across documents), clips (several share a row: ``_clip_row`` names it), a
  mixture's samples, a remote cache's local copy (its addresses are not the dataset's), a source
  column named like a key. Asked for explicitly, such a
  split is refused; by default (``row_identity: null``, the predict split) it is read without identity
  (`identity_problem`), so a configuration that worked before identity existed still works. A materialized view's rows
  are named in the view, the dataset the split reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lance_lightning.errors import ConfigError
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.produce.badrows import ReplaceBadRow
from lance_lightning.read.lance_io import row_ids
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy, describe_rows
from lance_lightning.source import PinnedSource
from lance_lightning.vocabulary import (
    DEFAULT_IDENTITY_SPLITS,
    EPOCH,
    EPOCH_POSITION,
    IDENTITY_KEYS,
    ROW_ADDRESS,
    ROW_ID,
    SPLITS,
)


class RowIdentity:
    """The identity keys of a batch's rows, for one epoch of one source.

    Args:
        source: The pinned source the rows are read from.
        epoch: The data epoch being read.
        retry: How the look-up of addresses rides out transient storage errors.
        shifts: ``(start, offset)`` pairs, ascending starts: a row at epoch-order position ``p`` of
            this read, the last start ``<= p`` giving ``offset``, gets ``_position`` ``p + offset``
            (a restricted read's rows keep the positions of the wider read); ``None``: nothing.
    """

    def __init__(
        self,
        source: PinnedSource,
        epoch: int,
        retry: RetryPolicy = DEFAULT_POLICY,
        shifts: list[tuple[int, int]] | None = None,
    ) -> None:
        self.source = source
        self.epoch = epoch
        self.retry = retry
        self.shifts = shifts

    def keys(self, positions: np.ndarray, sequence: np.ndarray) -> dict[str, torch.Tensor]:
        """The identity keys of rows at dataset ``positions`` and epoch-order positions ``sequence``."""
        positions = np.asarray(positions, dtype=np.int64)
        address, row_id = self.addresses(positions)
        sequence = np.array(sequence, dtype=np.int64)
        if self.shifts:
            starts, offsets = np.array(self.shifts, dtype=np.int64).reshape(-1, 2).T
            sequence += offsets[np.maximum(np.searchsorted(starts, sequence, side="right") - 1, 0)]
        return {
            ROW_ADDRESS: torch.from_numpy(address),
            ROW_ID: torch.from_numpy(row_id),
            EPOCH_POSITION: torch.from_numpy(sequence),
            EPOCH: torch.full((len(positions),), self.epoch, dtype=torch.int64),
        }

    def addresses(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row addresses, Lance row ids) of the live-row ``positions``, as int64."""
        if len(positions) == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        source = self.source
        return self.retry.call(
            lambda: _addresses(source, positions),
            what=describe_rows(positions, "row address look-up", ["_rowaddr", "_rowid"]),
            uri=source.uri,
            version=source.version,
        )


def _addresses(source: PinnedSource, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dataset = source.open(reads=True)
    if not dataset.has_stable_row_ids:  # Lance's row id is the row address
        address = row_ids(source, dataset, positions).astype(np.uint64).view(np.int64)
        return address, address
    table = dataset.take(positions, columns=["_rowaddr", "_rowid"])
    address = table.column("_rowaddr").to_numpy().astype(np.uint64).view(np.int64)
    return address, table.column("_rowid").to_numpy().astype(np.uint64).view(np.int64)


def check_identity_settings(row_identity: Any, packing: Any, bad_rows: Any, device_transform: Any) -> frozenset[str]:
    """The splits whose batches carry row identity, from the data module's ``row_identity``: ``None``
    (predict, none with ``packing``), ``True`` (every split), ``False`` (none) or a list of splits.
    `ConfigError` for any other value, for identity with packing, and for identity with a
    ``device_transform`` that replaces bad rows (its replacement rows would carry no identity)."""
    if row_identity is None:
        return frozenset(() if packing is not None else DEFAULT_IDENTITY_SPLITS)
    if isinstance(row_identity, bool):
        splits = frozenset(SPLITS if row_identity else ())
    elif isinstance(row_identity, (list, tuple)) and all(split in SPLITS for split in row_identity):
        splits = frozenset(row_identity)
    else:
        raise ConfigError(
            "row_identity",
            row_identity,
            "must be true, false, null (predict only) or a list of splits",
            f"set row_identity: [predict] (splits: {', '.join(SPLITS)}), true or false",
        )
    if splits and packing is not None:
        raise ConfigError(
            "row_identity",
            row_identity,
            "packed token windows are cut across documents and have no single dataset row",
            "set row_identity: false with packing",
        )
    if splits and device_transform is not None and isinstance(bad_rows, ReplaceBadRow):
        raise ConfigError(
            "row_identity",
            row_identity,
            "a device_transform that replaces bad rows (bad_rows=ReplaceBadRow) cannot give its "
            "replacement rows their identity yet",
            "set row_identity: false, or move the transform that rejects rows to `transform`",
        )
    return splits


def check_identity(split: str, plan: Any) -> None:
    """`ConfigError` unless row identity can describe the rows of ``plan`` (the ``split``'s)."""
    problem = identity_problem(split, plan)
    if problem is not None:
        raise ConfigError("row_identity", split, *problem)


def identity_problem(split: str, plan: Any) -> tuple[str, str] | None:
    """Why row identity cannot describe the rows of ``plan`` (problem, fix), or ``None`` if it can.
    A split that has identity by default (``row_identity: null``) and cannot is read without it."""
    if plan.packed:
        return (
            f"split '{split}' packs token windows (packing is set), whose rows are cut across documents "
            "and have no single dataset row",
            f"leave '{split}' out of row_identity (row_identity=False), or turn packing off",
        )
    if plan.clipped:
        return (
            f"split '{split}' reads clips (clips is set): several clips share a dataset row, which each "
            f"batch names in '_clip_row'",
            f"leave '{split}' out of row_identity (row_identity=False)",
        )
    if not isinstance(plan, ReadPlan):
        return (
            f"split '{split}' is a LanceMixture: its rows come from several datasets, which row identity "
            "does not name yet",
            f"leave '{split}' out of row_identity, or train on one LanceSource",
        )
    if plan.source.stands_for is not None:
        return (
            f"split '{split}' reads a local copy of its matching rows (remote_cache), whose row addresses "
            "are not the dataset's",
            f"set remote_cache=RemoteCache(enabled=False), or leave '{split}' out of row_identity",
        )
    clash = sorted(set(IDENTITY_KEYS) & {column for source in plan.sources for column in source.columns})
    if clash:
        return (
            f"split '{split}' reads column(s) {clash}, which row identity adds to every batch",
            "rename or drop those columns, or leave the split out of row_identity",
        )
    return None
