"""Where a stream's frames are: a video's frame index (every frame's presentation time, taken
once when it opens) and the lowest timestamp any stream is sought to.

Guarantees:
- `frame_index(container, stream)` returns int64 presentation timestamps (in the stream's
  ``time_base``), sorted, one per frame a whole-stream decode gives: its length is the frame count
  clips are planned on, and frame ``i`` of a clip is the decoded frame at ``index[i]``. It never
  comes from the container's duration (which covers every track: a longer audio track in
  Matroska/WebM added frames that do not exist) nor from a header's count alone (an AVI header
  counted a dropped, empty frame).
- MP4/MOV and AVI: from the index the demuxer read with the headers (no further read). Entries
  marked discarded (edit lists) and empty packets are left out. MP4 lists decode times: they are
  shifted so the first is the stream's first presentation time, which is exact for constant frame
  rates and for variable ones without B-frames.
- Other containers (Matroska, WebM, MPEG-TS, ...), or an index that does not list every frame:
  the video stream's packets are demuxed (not decoded) once, from the start, and their
  timestamps kept: this reads the whole file once per open (the open media stays in the pool).
- A stream whose frames carry no timestamps, or that has none, raises `BadMedia`.
- `coarse_audio`: an audio stream timed coarser than a sample (Matroska and WebM: milliseconds)
  gets a frame grid (the first frame's end and the frame size, from its first two decoded
  frames) on which frames are placed instead of by their rounded timestamps, and, when it has no
  duration of its own (the container's covers the video too), its length from its packets' span
  less one tick (the whole-stream decode is never shorter). This demuxes the stream once.
- `seek_floor`: seeks never go to a negative timestamp unless the stream starts below 0 (AVI has
  none before its first frame: FFmpeg refuses such a seek), nor below an indexed stream's first
  entry (MP4's AAC priming packet, before the start, is the lowest), nor more than a second
  before the stream's start.
"""

from __future__ import annotations

import math
from typing import Any

import av.error
import numpy as np

from lance_lightning.errors import BadMedia

#: Demuxers whose index lists every frame (MP4's sample tables, AVI's idx1).
INDEXED_FORMATS = ("mov", "mp4", "avi")


def frame_index(container: Any, stream: Any) -> np.ndarray:
    """Sorted int64 presentation timestamps of every frame of ``stream``, in its ``time_base``."""
    names = set(container.format.name.split(","))
    if names & set(INDEXED_FORMATS) and stream.frames:
        listed = [e for e in stream.index_entries if e.size > 0]
        entries = [e for e in listed if not e.is_discard]  # an edit list's cut frames are decoded, not shown
        # The header's count may include an empty (dropped) frame the index leaves out.
        if entries and stream.frames - 1 <= len(listed) <= stream.frames:
            times = np.sort(np.array([e.timestamp for e in entries], dtype=np.int64))
            start = stream.start_time if stream.start_time is not None else int(times[0])
            return times + (start - times[0])
    return _demuxed(container, stream)


def _demuxed(container: Any, stream: Any) -> np.ndarray:
    """Timestamps of the stream's non-empty packets, demuxed from the start (no decode)."""
    times = []
    try:
        for packet in container.demux(stream):
            if packet.size == 0 or packet.is_discard:
                continue  # the flush packet at the end, an empty (dropped) frame, or one an edit list cuts
            if packet.pts is None:
                raise BadMedia("a video packet has no timestamp: its frames cannot be placed")
            times.append(packet.pts)
    except av.error.FFmpegError as error:
        raise BadMedia(f"reading the video's packets failed: {error}") from error
    if not times:
        raise BadMedia("the video stream has no frames")
    return np.sort(np.array(times, dtype=np.int64))


def seek_floor(stream: Any, start_pts: int) -> int:
    """The lowest timestamp to seek ``stream`` to: its index's first (MP4's AAC priming packet
    lies before the start and must be decoded for the first samples to be right), else a second
    before the stream's start (MPEG-TS seeks by decode times, which begin before the
    presentation times) but never a negative timestamp unless the stream starts below 0 (AVI has
    none before its first frame: FFmpeg refuses the seek with "Operation not permitted")."""
    entries = stream.index_entries
    if entries is not None and len(entries):
        return min(int(entries[0].timestamp), start_pts)
    if start_pts <= 0:
        return start_pts
    return max(0, start_pts - math.ceil(1 / stream.time_base))


def coarse_audio(container: Any, stream: Any, rate: int) -> tuple[int | None, tuple[int, int]]:
    """For an audio stream timed coarser than a sample (Matroska and WebM: milliseconds): the
    samples its packets span when the stream has no duration of its own (None when it has), less
    one tick (a rounded last timestamp never promises a sample the decode lacks), and its frame
    grid ``(offset, size)``: frame ``k >= 1`` starts at sample ``offset + (k - 1) * size`` (the
    first frame, shortened by a pre-skip, ends at ``offset``). Demuxes the stream once and decodes
    its first two frames."""
    ticks = None
    try:
        if not stream.duration:
            end = max(
                (p.pts + (p.duration or 0) for p in container.demux(stream) if p.size and p.pts is not None),
                default=None,
            )
            if end is not None:
                ticks = end - (stream.start_time or 0) - 1
            container.seek(seek_floor(stream, stream.start_time or 0), stream=stream, backward=True)
        frames = container.decode(stream)
        first, second = next(frames, None), next(frames, None)
    except av.error.FFmpegError as error:
        raise BadMedia(f"reading the audio's packets failed: {error}") from error
    if first is None or second is None:
        raise BadMedia("the audio stream has fewer than two frames")
    samples = None if ticks is None else math.floor(ticks * stream.time_base * rate)
    return samples, (first.samples, second.samples)
