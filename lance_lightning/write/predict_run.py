"""The writer's dealings with Lightning: which source the predict split reads, the same split
restricted to a run's unfinished fragments, and steps every rank finishes together.

Guarantees: `predict_source` refuses (`ConfigError`) a predict split whose row addresses do not
name rows of the dataset it reads (no data module, a mixture, a local view, identity off);
`restricted` reads exactly the rows of the given fragments at the given version (`unpinned`: all
the rows of a pinned source again, at its version), and
`position_shifts` gives those rows the ``_position`` of the uninterrupted run (so `RowRandom`,
`RandomFlip` or a seeded `DeviceAugment` draw the same); `fragments_to_read` gives every rank a
row (finished fragments are added when fewer unfinished rows are left than ranks);
`Slots` names the row each epoch position of the uninterrupted read is (a replaced bad row is
told from its slot); `together` never leaves a rank waiting at a collective for a rank whose
step failed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lance_lightning.errors import ConfigError
from lance_lightning.source import LanceSource, PinnedSource


def together(trainer: Any, action: Any) -> None:
    """Run ``action`` on every rank, then agree: a rank whose action failed raises its error, the
    others a `RuntimeError` (no rank is left waiting at a collective for one that stopped)."""
    error: BaseException | None = None
    try:
        action()
    except Exception as raised:  # noqa: BLE001 - re-raised below, after every rank knows
        error = raised
    if not trainer.strategy.reduce_boolean_decision(error is None, all=True):
        raise error or RuntimeError("prediction writer: another rank failed (see its error); nothing was committed")


def size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def predict_source(datamodule: Any) -> PinnedSource:
    """The pinned source of the data module's predict split (`ConfigError` for what the writer cannot name rows of)."""
    plan = getattr(datamodule, "plans", {}).get("predict")
    if plan is None or not hasattr(datamodule, "plan_instead"):
        raise ConfigError(
            "LancePredictionWriter",
            type(datamodule).__name__,
            "needs a LanceDataModule with a predict split",
            "pass datamodule=LanceDataModule(predict=LanceSource(...)) to trainer.predict",
        )
    if not hasattr(plan, "source") or plan.source.stands_for is not None or "predict" not in datamodule.identity_splits:
        raise ConfigError(
            "LancePredictionWriter",
            "predict split",
            "writes to the one dataset the predict split reads, with row identity on, from the dataset itself",
            "predict from one LanceSource, without materialize or a remote cache, with row_identity on for predict",
        )
    return plan.source


def fragments_to_read(order: list[int], expected: dict[int, int], unfinished: list[int], ranks: int) -> list[int]:
    """``unfinished`` (none when empty), plus finished fragments of ``order`` (the largest first)
    until they hold at least ``ranks`` rows: a predict split with fewer rows than ranks is refused."""
    if not unfinished:
        return []
    reading = list(unfinished)
    for fragment in sorted((f for f in order if f not in unfinished), key=lambda f: -expected[f]):
        if sum(expected[f] for f in reading) >= ranks:
            break
        reading.append(fragment)
    return sorted(reading, key=order.index)


def restricted(source: PinnedSource, version: int, fragments: list[int]) -> LanceSource:
    """``source`` at ``version`` reading only the rows of ``fragments`` (ranges of row addresses)."""
    spans: list[list[int]] = []
    for fragment in sorted(fragments):
        if spans and spans[-1][1] == fragment:
            spans[-1][1] = fragment + 1
        else:
            spans.append([fragment, fragment + 1])
    ranges = " OR ".join(f"(_rowaddr >= {a << 32} AND _rowaddr < {b << 32})" for a, b in spans)
    where = ranges if source.filter is None else f"({source.filter}) AND ({ranges})"
    return LanceSource(source.location, list(source.columns), where, version, source.storage_options)


def unpinned(source: PinnedSource) -> LanceSource:
    """``source`` as the `LanceSource` that pins it again: the same dataset, columns, filter and version."""
    return LanceSource(source.location, list(source.columns), source.filter, source.version, source.storage_options)


def position_shifts(order: list[int], expected: dict[int, int], reading: list[int]) -> list[tuple[int, int]]:
    """``(start, offset)`` pairs giving the rows of a read of ``reading`` (fragments in ``order``)
    the epoch positions they have in a read of all of ``order`` (`RowIdentity`'s ``shifts``)."""
    full, whole, restricted, shifts = {}, 0, 0, []
    for fragment in order:
        full[fragment], whole = whole, whole + expected[fragment]
    for fragment in sorted(reading, key=order.index):
        if expected[fragment]:
            shifts.append((restricted, full[fragment] - restricted))
            restricted += expected[fragment]
    return shifts


class Slots:
    """The row address each epoch position of the uninterrupted predict read names (the read is in
    storage order, so position ``p`` is the ``k``-th matching row of its fragment): a batch row
    whose ``_rowaddr`` is not its slot's is a replacement the bad-row policy put there."""

    def __init__(self, source: PinnedSource, order: list[int], expected: dict[int, int]) -> None:
        self.source, self.order = source, order
        self.starts = np.cumsum([0] + [expected[f] for f in order])[:-1]
        self.offsets: dict[int, np.ndarray] = {}

    def addresses(self, positions: np.ndarray) -> np.ndarray:
        """The slot addresses of ``positions`` (epoch positions of the uninterrupted read)."""
        positions = np.asarray(positions, dtype=np.int64)
        index = np.searchsorted(self.starts, positions, side="right") - 1
        out = np.empty(len(positions), dtype=np.int64)
        for where in np.unique(index).tolist():
            rows = index == where
            fragment = self.order[where]
            out[rows] = (fragment << 32) | self._offsets(fragment)[positions[rows] - int(self.starts[where])]
        return out

    def _offsets(self, fragment: int) -> np.ndarray:
        """The offsets of the fragment's rows the read matches (its live rows matching the filter)."""
        if fragment not in self.offsets:
            piece = self.source.fragment(fragment)
            if self.source.filter is None and piece.metadata.deletion_file is None:
                self.offsets[fragment] = np.arange(piece.metadata.physical_rows, dtype=np.int64)
            else:
                rows = piece.to_table(columns=[], filter=self.source.filter, with_row_address=True)
                self.offsets[fragment] = rows.column("_rowaddr").to_numpy().astype(np.int64) & 0xFFFFFFFF
        return self.offsets[fragment]
