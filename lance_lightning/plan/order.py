"""The epoch order: which matching row comes at each position of an epoch.

Guarantees:
- ``EpochOrder.matched_indices(seq)`` is a bijection of ``[0, matched_rows)`` for every
  (strategy, seed, epoch): each matching row appears exactly once per epoch.
- The order depends only on (matched rows, strategy, seed, epoch): never on ranks, workers,
  batch size, or where a resumed run starts.
- Constant memory, O(positions) work: every permutation (of the units, of the rows inside each
  unit, of each shuffle window) is a keyed bijection (`lance_lightning.plan.bijection`) keyed by
  (seed, epoch, stream, group), evaluated only at the asked positions. Nothing is built per
  epoch, so any position is computed directly: seeking to 90% of an epoch costs what 10% costs.
- When units are permuted and the last unit is short, it comes last in every epoch, so no batch
  before it straddles two units (a straddling batch costs a second Lance call per group). Unit
  boundaries are then shifted by a per-epoch offset (row ``i`` of the rotated sequence of rows is
  row ``(i + offset) % matched_rows``), so which rows form the short unit, and the tail that
  ``drop_last`` skips, change from epoch to epoch; the one unit that crosses the end of the rows
  is two ranges.
- Pure: no I/O.
"""

from __future__ import annotations

import numpy as np

from lance_lightning.plan.bijection import derive_key, permute, subkeys
from lance_lightning.plan.strategies import ShuffleStrategy

_UNITS, _WITHIN_UNIT, _WINDOW, _ROTATION = 1, 2, 3, 4


class EpochOrder:
    """Maps sequence positions of one epoch to indices of matching rows.

    The sequence is built from units of ``unit_rows`` matching rows (the last unit may be short):
    units are permuted when the strategy says so, rows inside a unit optionally permuted, and an
    optional windowed shuffle permutes consecutive windows of ``window_rows`` sequence positions.
    """

    def __init__(self, matched_rows: int, strategy: ShuffleStrategy, epoch: int) -> None:
        if matched_rows < 1:
            raise ValueError("an epoch order needs at least one row")
        self.matched_rows = matched_rows
        self.epoch = epoch
        self._strategy = strategy
        self._unit = min(strategy.unit_rows(matched_rows), matched_rows)
        self._units = -(-matched_rows // self._unit)
        self._short = matched_rows - (self._units - 1) * self._unit
        self._permuted_units = 0  # units permuted among themselves (a short last unit stays last)
        self._rotation = 0
        if strategy.permute_units:
            self._permuted_units = self._units - (1 if self._short < self._unit else 0)
            if self._short < self._unit:
                self._rotation = derive_key(strategy.seed, epoch, _ROTATION) % self._unit

    @property
    def unit_rows(self) -> int:
        return self._unit

    @property
    def units(self) -> int:
        return self._units

    def _key(self, stream: int) -> int:
        return derive_key(self._strategy.seed, self.epoch, stream)

    def matched_indices(self, seq: np.ndarray) -> np.ndarray:
        """Indices (into the matching rows) of the rows at sequence positions ``seq``."""
        seq = np.asarray(seq, dtype=np.int64)
        if self._strategy.window_rows:
            seq = self._permute_within(seq, self._strategy.window_rows, _WINDOW)
        slot, offset = seq // self._unit, seq % self._unit  # the short unit, if any, is the last slot
        unit = slot
        if self._permuted_units > 1:
            unit = slot.copy()
            inside = slot < self._permuted_units
            unit[inside] = permute(slot[inside], self._permuted_units, self._key(_UNITS))
        if self._strategy.shuffle_within_unit:
            offset = self._permute_groups(unit, offset, self._unit, _WITHIN_UNIT)
        rows = unit * self._unit + offset
        return (rows + self._rotation) % self.matched_rows if self._rotation else rows

    def _permute_within(self, seq: np.ndarray, size: int, stream: int) -> np.ndarray:
        """Permute positions inside consecutive groups of ``size`` positions (the last may be short)."""
        group, offset = seq // size, seq % size
        return group * size + self._permute_groups(group, offset, size, stream)

    def _permute_groups(self, group: np.ndarray, offset: np.ndarray, size: int, stream: int) -> np.ndarray:
        """Each group's own permutation (keyed by stream and group) applied to ``offset``; groups
        hold ``size`` rows except a short last one."""
        keys = subkeys(self._key(stream), group)
        last = (self.matched_rows - 1) // size
        short = self.matched_rows - last * size
        if short == size:
            return permute(offset, size, keys)
        out = np.empty_like(offset)
        tail = group == last
        out[~tail] = permute(offset[~tail], size, keys[~tail])
        out[tail] = permute(offset[tail], short, keys[tail])
        return out
