"""Clips as the plan's unit, pure: each matching media row stands for a fixed number of clips per
epoch, and where the clip at a unit starts is a function of (seed, epoch, unit) alone.

Guarantees:
- With a sampler (`lance_lightning.media.samplers`), a split's units are clips: unit ``u`` is clip
  ``u % per_item`` of the ``u // per_item``-th matching row (`ClipUnits`). The shuffle strategy
  orders clips as it orders rows, and filters, the layout, ranks, equal batches, mixtures, the
  cursor and resume all count clips (``matched_rows`` counts clips).
- Where a clip starts is `start_fractions`: a fraction in ``[0, 1]`` of the room the media leaves
  after the clip. ``starts="random"``: clip ``k`` of ``K`` draws uniformly in the ``k``-th of
  ``K`` equal parts of that room, from a keyed hash of ``(seed, epoch, unit)`` (a new draw each
  epoch, the same on every rank, worker count, batch size and resume; a row's clips never pile up
  on one start); ``starts="even"``: clip ``k`` of ``K`` at ``k / (K - 1)`` (the middle for
  ``K = 1``), the same every epoch; regular timestamps (``seconds_between_clip_starts`` of
  `VideoClips` and `AudioClips`) take the even fractions, from which the decoder reads ``k``.
  The decoder turns the fraction into frames or samples (within the sampler's sampling range, if
  it has one): planning needs no media length and opens no media file.
- No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lance_lightning.media.samplers import ClipSampler
from lance_lightning.plan.bijection import derive_key, subkeys


def start_fractions(sampler: ClipSampler, epoch: int, units: np.ndarray) -> np.ndarray:
    """Where each clip of ``units`` starts, as a fraction of the room left after it (float64)."""
    units = np.asarray(units, dtype=np.int64)
    if sampler.starts == "even" or sampler.seconds_between_clip_starts is not None:
        if sampler.per_item == 1:
            return np.full(len(units), 0.5)
        return (units % sampler.per_item) / (sampler.per_item - 1)
    bits = subkeys(derive_key(sampler.seed, int(epoch)), units)
    draws = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return ((units % sampler.per_item) + draws) / sampler.per_item


@dataclass(frozen=True)
class ClipUnits:
    """A split's clips: ``rows`` matching media rows, ``sampler.per_item`` clips each."""

    sampler: ClipSampler
    rows: int

    @property
    def clips(self) -> int:
        return self.rows * self.sampler.per_item

    def rows_of(self, units: np.ndarray) -> np.ndarray:
        """The matching-row index of each clip unit."""
        return np.asarray(units, dtype=np.int64) // self.sampler.per_item
