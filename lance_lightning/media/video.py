"""Decode one training clip of a video: a few frames at a fixed step, read and decoded from the
keyframe before the clip, never from the file's start unless the clip is near it.

Guarantees:
- `decode_video_clip` returns frame indices ``start + round(i * step)`` for ``i < frames`` of a
  video of ``n`` frames, where ``start = floor(fraction * (n - span))`` and
  ``span = round((frames - 1) * step) + 1``: a ``fraction`` of 0 starts at the first frame, 1 ends
  at the last. A clip with ``span > n`` raises `BadMedia` before anything is decoded.
- `ClipPlace` (TorchCodec's vocabulary) changes this: a sampling range ``[range_start,
  range_end)`` of frame indices (``start = range_start + floor(fraction * (last - range_start))``,
  ``last = min(range_end, n) - 1``), or a regular-timestamp start (the first frame at or after
  ``at_seconds``); frames past the last one: ``repeat_last`` repeats the last frame, ``wrap``
  repeats the clip's own frames from its first (``[a, b, c, a, b]``), ``error`` raises `BadMedia`
  (the default; the rule is `lance_lightning.media.place.follow_policy`, shared with audio).
  Repeated frames are decoded once.
- ``n`` and every frame's time come from the video stream's frame index
  (`lance_lightning.media.frame_index`), never from the container's duration: no clip reaches
  past the last frame, whatever the other tracks' lengths or the stream's start time.
- The frames are exactly those a decode of the whole video from its start gives at those
  indices (RGB by PyAV's ``reformat(format="rgb24")``), also at variable frame rates: for each
  target it takes the first frame whose time is at least halfway between the target's indexed
  time and the previous frame's. ``timestamps`` are the taken frames' own presentation times, in
  seconds (the stream's: a video starting at 1.25 s has its first frame at 1.25).
- It decodes forward from the keyframe at or before the first target and stops once the last
  target is taken; a container reused from a `MediaPool` seeks again, reading no headers.
- ``frames`` is uint8 ``[T, 3, H, W]``, a channels-first view of one ``[T, H, W, 3]`` array that
  each frame is copied into once from PyAV's buffer (``frames.transpose(0, 2, 3, 1)`` is
  C-contiguous; ``torch.from_numpy`` takes the view as is). ``size=(H, W)`` resizes with the same
  ``reformat``; None keeps the stream's size.
- A decode that ends before the last target, or any PyAV/FFmpeg error, raises `BadMedia` with a
  readable reason; the caller should then close the media rather than check it back in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import av.error
import numpy as np

from lance_lightning.errors import BadMedia
from lance_lightning.media.containers import OpenVideo, decode_from
from lance_lightning.media.place import ClipPlace, follow_policy


@dataclasses.dataclass(frozen=True)
class VideoClip:
    #: uint8 ``[T, 3, H, W]``.
    frames: np.ndarray
    #: float64 ``[T]``: each frame's presentation time in seconds.
    timestamps: np.ndarray


def frame_step(opened: OpenVideo, frame_step: int | None = None, fps: float | None = None) -> float:
    """The step between a clip's frames in source frames: ``frame_step``, or the video's rate over
    a target ``fps`` (e.g. 30 fps sampled at 10 fps: 3.0); 1.0 when neither is given."""
    if frame_step is not None and fps is not None:
        raise ValueError(f"give frame_step or fps, not both (got {frame_step} and {fps})")
    if fps is not None:
        if not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be a finite number > 0, got {fps}")
        return opened.fps / fps
    if frame_step is None:
        return 1.0
    if isinstance(frame_step, bool) or not isinstance(frame_step, int) or frame_step < 1:
        raise ValueError(f"frame_step must be an int >= 1, got {frame_step!r}")
    return float(frame_step)


def clip_indices(
    frame_times: np.ndarray, step: float, count: int, fraction: float, place: ClipPlace = ClipPlace()
) -> np.ndarray:
    """The source frame indices of a clip of ``count`` frames every ``step`` frames of a video
    whose frames are at ``frame_times`` (seconds, sorted): starting at ``fraction`` of the
    sampling range (by default ``floor(fraction * (n - span))``), or at ``place.at_seconds``;
    frames past the last one follow ``place.policy``. `BadMedia` when the clip cannot be placed."""
    frames = len(frame_times)
    offsets = np.round(np.arange(count) * step).astype(np.int64)
    span = int(offsets[-1]) + 1
    if place.at_seconds is not None:
        start = int(np.searchsorted(frame_times, place.at_seconds - 1e-9, side="left"))
        if start >= frames or (place.range_end is not None and place.at_seconds >= place.range_end):
            end = frame_times[-1] if place.range_end is None else place.range_end
            raise BadMedia(f"the clip's regular start {place.at_seconds:.3f}s is at or after the end ({end:.3f}s)")
    else:
        low = 0 if place.range_start is None else int(place.range_start)
        low += frames if low < 0 else 0
        if not 0 <= low < frames:
            raise BadMedia(f"sampling_range_start {place.range_start} is not a frame of the video's {frames}")
        if place.range_end is None:
            last = frames - span
        else:
            end = int(place.range_end) + frames if place.range_end < 0 else int(place.range_end)
            last = min(end, frames) - 1
        start = low + math.floor(fraction * max(last - low, 0))
    indices = start + offsets
    placed = follow_policy(indices, frames, place.policy)
    if placed is not None:
        return placed
    if span > frames:
        raise BadMedia(f"clip of {count} frames every {step:g} frames spans {span} frames, the video has {frames}")
    raise BadMedia(
        f"clip of {count} frames every {step:g} frames from frame {start} reaches frame {int(indices[-1])}, "
        f"past the video's {frames} frames (policy 'error'; policy: repeat_last or wrap fills it)"
    )


def decode_video_clip(
    opened: OpenVideo,
    fraction: float,
    frames: int,
    step: float,
    size: tuple[int, int] | None = None,
    place: ClipPlace = ClipPlace(),
) -> VideoClip:
    """``frames`` frames every ``step`` source frames, starting at ``fraction`` of the video (of
    its sampling range, or at ``place.at_seconds``; past the end as ``place.policy`` says)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if frames < 1 or not step > 0:
        raise ValueError(f"need frames >= 1 and step > 0, got frames={frames}, step={step}")
    times = opened.frame_pts.astype(np.float64) * float(opened.time_base)
    indices = clip_indices(times, step, frames, fraction, place)
    distinct = np.unique(indices)
    if len(distinct) == len(indices) and bool(np.all(distinct == indices)):
        return _decode_indices(opened, indices, size)
    clip = _decode_indices(opened, distinct, size)  # repeated or wrapped frames: each decoded once
    where = np.searchsorted(distinct, indices)
    pixels = np.ascontiguousarray(clip.frames.transpose(0, 2, 3, 1)[where])
    return VideoClip(frames=pixels.transpose(0, 3, 1, 2), timestamps=clip.timestamps[where])


def _decode_indices(opened: OpenVideo, indices: np.ndarray, size: tuple[int, int] | None) -> VideoClip:
    """The frames at ``indices`` (non-decreasing), decoded forward from the keyframe before the first."""
    frames = len(indices)
    thresholds = _thresholds(opened, indices)
    height, width = size if size is not None else (opened.height, opened.width)
    pixels = np.empty((frames, height, width, 3), np.uint8)
    timestamps = np.empty(frames, np.float64)
    taken = 0
    try:
        # Closed here, so nothing of the decode outlives the call (the media may go to another thread).
        with contextlib.closing(decode_from(opened, float(thresholds[0]))) as decoded:
            for frame in decoded:
                if frame.time is None:
                    raise BadMedia("a decoded frame has no timestamp")
                if frame.time < thresholds[taken]:
                    continue
                first = taken
                while taken < frames and frame.time >= thresholds[taken]:
                    taken += 1
                rgb = opened.reformatter.reformat(frame, width=width, height=height, format="rgb24", threads=1)
                _copy_rgb(rgb, pixels[first])
                pixels[first + 1 : taken] = pixels[first]  # a step under 1 repeats frames
                timestamps[first:taken] = frame.time
                if taken == frames:
                    break
    except av.error.FFmpegError as error:
        raise BadMedia(f"decoding the video failed: {error}") from error
    if taken < frames:
        raise BadMedia(
            f"the video ended before frame {indices[taken]} of the clip "
            f"(at {float(opened.frame_pts[indices[taken]] * opened.time_base):.3f}s), though its index counts "
            f"{opened.frames} frames"
        )
    return VideoClip(frames=pixels.transpose(0, 3, 1, 2), timestamps=timestamps)


def _thresholds(opened: OpenVideo, indices: np.ndarray) -> np.ndarray:
    """Seconds from which a decoded frame answers each target: halfway between the target's time
    in the frame index and the frame before it (half a period before the first frame), so a
    decoder's rounding of a timestamp never moves a frame to a neighbour's slot."""
    pts = opened.frame_pts.astype(np.float64)
    before = np.where(indices > 0, pts[np.maximum(indices - 1, 0)], pts[0] - (pts[1] - pts[0] if len(pts) > 1 else 1.0))
    return (pts[indices] + before) / 2 * float(opened.time_base)


def _copy_rgb(frame: av.VideoFrame, into: np.ndarray) -> None:
    """Copy an rgb24 frame's pixels into ``into`` (``[H, W, 3]``), skipping the rows' padding."""
    plane = frame.planes[0]
    height, width = into.shape[:2]
    # The plane's buffer, as a memoryview: NumPy's stubs take no other buffer type (the same bytes, not copied).
    data = memoryview(plane)
    rows = np.frombuffer(data, np.uint8, count=height * plane.line_size).reshape(height, plane.line_size)
    into[...] = rows[:, : width * 3].reshape(height, width, 3)
