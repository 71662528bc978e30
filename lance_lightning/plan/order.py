"""The epoch order: which matching row comes at each position of an epoch.

Guarantees:
- ``EpochOrder.matched_indices(seq)`` is a bijection of ``[0, matched_rows)`` for every
  (strategy, seed, epoch): each matching row appears exactly once per epoch.
- The order depends only on (matched rows, strategy, seed, epoch): never on ranks, workers,
  batch size, or where a resumed run starts, so any position can be computed directly (O(1) seek).
- When units are permuted and the last unit is short, it comes last in every epoch, so no batch
  before it straddles two units (a straddling batch costs a second Lance call per group). Unit
  boundaries are then shifted by a per-epoch offset (row ``i`` of the rotated sequence of rows is
  row ``(i + offset) % matched_rows``), so which rows form the short unit, and the tail that
  ``drop_last`` skips, change from epoch to epoch; the one unit that crosses the end of the rows
  is two ranges.
- Pure: no I/O. Memory is one permutation of the units (shards or clumps), plus small caches.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from lance_lightning.strategies import ShuffleStrategy

_UNITS, _WITHIN_UNIT, _WINDOW, _ROTATION = 1, 2, 3, 4
_CACHE_SIZE = 64


def seeded_rng(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """A generator determined by (seed, epoch, stream): identical on every platform and process."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, *stream])))


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
        self._order: np.ndarray | None = None
        self._rotation = 0
        if strategy.permute_units and self._short < self._unit:
            full = seeded_rng(strategy.seed, epoch, _UNITS).permutation(self._units - 1)
            self._order = np.append(full, self._units - 1)
            self._rotation = int(seeded_rng(strategy.seed, epoch, _ROTATION).integers(self._unit))
        elif strategy.permute_units:
            self._order = seeded_rng(strategy.seed, epoch, _UNITS).permutation(self._units)
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    @property
    def unit_rows(self) -> int:
        return self._unit

    @property
    def units(self) -> int:
        return self._units

    def matched_indices(self, seq: np.ndarray) -> np.ndarray:
        """Indices (into the matching rows) of the rows at sequence positions ``seq``."""
        seq = np.asarray(seq, dtype=np.int64)
        if self._strategy.window_rows:
            seq = self._unwindow(seq, self._strategy.window_rows)
        slot, offset = seq // self._unit, seq % self._unit  # the short unit, if any, is the last slot
        unit = self._order[slot] if self._order is not None else slot
        if self._strategy.shuffle_within_unit:
            offset = self._permute_within(unit, offset, _WITHIN_UNIT, self._unit)
        rows = unit * self._unit + offset
        return (rows + self._rotation) % self.matched_rows if self._rotation else rows

    def _unwindow(self, seq: np.ndarray, window: int) -> np.ndarray:
        win, offset = seq // window, seq % window
        return win * window + self._permute_within(win, offset, _WINDOW, window)

    def _permute_within(self, group: np.ndarray, offset: np.ndarray, stream: int, size: int) -> np.ndarray:
        """Apply the per-group permutation of stream ``stream`` to ``offset`` within each group."""
        out = np.empty_like(offset)
        groups, inverse = np.unique(group, return_inverse=True)
        members = np.argsort(inverse, kind="stable")  # positions of each group, group after group
        edges = np.searchsorted(inverse[members], np.arange(len(groups) + 1))
        for g, first, end in zip(groups.tolist(), edges[:-1].tolist(), edges[1:].tolist()):
            rows = members[first:end]
            out[rows] = self._group_permutation(stream, g, size)[offset[rows]]
        return out

    def _group_permutation(self, stream: int, group: int, size: int) -> np.ndarray:
        key = (stream, group)
        perm = self._cache.get(key)
        if perm is None:
            length = self._group_length(stream, group, size)
            perm = seeded_rng(self._strategy.seed, self.epoch, stream, group).permutation(length)
            self._cache[key] = perm
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return perm

    def _group_length(self, stream: int, group: int, size: int) -> int:
        if stream == _WITHIN_UNIT:
            return self._short if group == self._units - 1 else size
        return min(size, self.matched_rows - group * size)
