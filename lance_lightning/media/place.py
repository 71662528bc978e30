"""Where a clip may start and what it gets past the media's end, in TorchCodec's sampler
vocabulary: one home for video clips (frame indices) and audio windows (output samples).

Guarantees:
- `ClipPlace` carries a sampler's ``policy``, sampling range and, for regular timestamps, the
  clip's start in seconds (`place_of` makes it from a sampler, its planned fraction and the
  media's clock origin). Videos read the range as frame indices or seconds of the video's time
  (`lance_lightning.media.video.clip_indices`); audio as seconds from its first sample
  (`lance_lightning.media.audio.window_indices`).
- `follow_policy` is the one rule for positions past the end, for frames and samples alike:
  ``repeat_last`` repeats the last position inside the media (``[a, b, c, c, c]``), ``wrap``
  repeats the clip's own positions from its first (``[a, b, c, a, b]``), ``error`` gives None
  (the caller raises `BadMedia` naming its unit). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lance_lightning.media.samplers import ClipSampler


@dataclasses.dataclass(frozen=True)
class ClipPlace:
    """Where a clip may start and what it gets past the end (TorchCodec's vocabulary):
    ``range_start``/``range_end`` bound the starts, ``[start, end)`` (None: the media's first
    position / the last start where the clip fits); ``policy`` is ``repeat_last``, ``wrap`` or
    ``error``. Videos: frame indices (negative from the end), or seconds when ``at_seconds`` is
    given; audio: always seconds from its first sample."""

    policy: str = "error"
    range_start: float | None = None
    range_end: float | None = None
    #: A regular-timestamp clip's start, in seconds on the media's clock.
    at_seconds: float | None = None


def place_of(sampler: ClipSampler, origin: float, fraction: float) -> ClipPlace:
    """The sampler's sampling range and policy; for regular timestamps, clip ``k``'s start,
    ``(range_start or origin) + k * seconds_between_clip_starts`` (its planned fraction is
    ``k / (K - 1)``: `lance_lightning.plan.clips.start_fractions`). ``origin``: the media's first
    position in seconds (a video's first frame time; 0.0 for audio, whose clock starts there)."""
    every, first = sampler.seconds_between_clip_starts, sampler.sampling_range_start
    if every is None:
        return ClipPlace(sampler.policy, first, sampler.sampling_range_end)
    clip = round(fraction * (sampler.per_item - 1))
    start = (origin if first is None else first) + clip * every
    return ClipPlace(sampler.policy, first, sampler.sampling_range_end, at_seconds=start)


def follow_policy(positions: np.ndarray, length: int, policy: str) -> np.ndarray | None:
    """``positions`` (increasing, the first inside ``[0, length)``) with those at or past
    ``length`` replaced as ``policy`` says; None for ``error`` when any is past the end."""
    past = positions >= length
    if not past.any():
        return positions
    if policy == "error":
        return None
    valid = positions[~past]
    if policy == "repeat_last":
        return np.where(past, valid[-1], positions)
    return np.resize(valid, len(positions))  # wrap: the clip's own positions again, from its first
