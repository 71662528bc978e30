"""Decode one training window of an audio stream, resampled, read from just before the window.

Guarantees:
- `decode_audio_clip` returns float32 ``[channels, round(seconds * sample_rate)]`` (1 = mono,
  2 = stereo, mixed by FFmpeg's resampler) starting at output sample
  ``round(fraction * (total - count))``, where ``total`` is the stream's length at
  ``sample_rate``: ``start = fraction * (duration - seconds)`` rounded to that rate's sample grid.
  ``start`` is in seconds from the stream's start, which is the whole-stream decode's first
  sample (after an MP3's encoder delay, an AAC's priming samples, an Opus pre-skip). A window
  longer than the stream raises `BadMedia` before anything is decoded.
- `window_indices` places it in TorchCodec's vocabulary (`lance_lightning.media.place.ClipPlace`,
  seconds on that clock, rounded to the output's sample grid): a sampling range ``[a, b)``
  (``first = low + round(fraction * (high - 1 - low))``, ``high`` the end or, by default, one past
  the last start where the window fits) or a regular start (``at_seconds``; at or after the end:
  `BadMedia`); samples past ``total`` follow the ``policy`` (`follow_policy`: ``repeat_last``
  repeats sample ``total - 1``, ``wrap`` the window's own samples from its first, ``error`` raises
  `BadMedia`). Without a range this is the rule above. Only ``[first, min(first + count, total))``
  is decoded; a filled window is those samples at the policy's indices.
- The samples are those of the whole stream decoded and resampled with
  ``av.AudioResampler(format="fltp", layout=..., rate=sample_rate)`` at the same indices, within
  `tolerance` of the codec: bit for bit for PCM (WAV) and lossless codecs (FLAC, ...); MP3 1e-3,
  Opus 5e-3, AAC 0.05 (its noise-coded bands are random in the decoder; see `TOLERANCE`), at
  every window start including the first and the last. Decoding starts `preroll` before the
  window (lossy decoders: 0.1 s for MP3 and AAC, 0.2 s for Opus), below the stream's start when
  the window is near it (the encoder's priming frames are decoded and discarded as in a
  whole-stream decode), and on a source sample on the grid both rates share (so the resampler's
  phase matches), far enough before the window that the resampling filter has warmed up; what
  comes before the window is cut off by the frames' timestamps (Matroska and WebM time audio in
  milliseconds: frames are placed on the stream's frame grid instead, `coarse_audio`).
- It seeks to the frame at or before that sample (`decode_from`) and stops decoding once the
  window is full; a stream that ends first (before the window or inside it), or any PyAV/FFmpeg
  error, raises `BadMedia`. An Ogg file is reopened before each window it serves but its first
  (`OpenAudio.start_window`: FFmpeg's Ogg demuxer can mistime packets when it seeks again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import av
import av.error
import numpy as np

from lance_lightning.errors import BadMedia
from lance_lightning.media.containers import OpenAudio, decode_from
from lance_lightning.media.place import ClipPlace, follow_policy

LAYOUTS = {1: "mono", 2: "stereo"}
#: Decoders whose output is exact: a window equals the whole-stream decode bit for bit.
LOSSLESS = ("flac", "alac", "wavpack", "tta", "ape", "truehd", "mlp")
#: Largest absolute difference (samples in [-1, 1]) of a window against the whole-stream decode
#: resampled the same way, per lossy decoder family (measured on `tests/media_corpus.py`, 21
#: windows a file: MP3 0, Opus 6e-4, AAC 0.037). MP3 converges exactly after `PREROLL_SECONDS`;
#: Opus nearly; AAC regenerates the bands its encoder coded as noise (PNS) from the decoder's
#: random state, which depends on every frame decoded since the start: those samples differ
#: with the same energy (AAC without PNS is exact), by up to the noise's own amplitude.
TOLERANCE = {"mp3": 1e-3, "aac": 0.05, "opus": 5e-3}
#: The tolerance of a lossy codec not listed (not measured: as AAC's).
DEFAULT_TOLERANCE = 0.05
#: Seconds decoded and discarded before a window, per decoder family: MP3's frames reach back
#: into earlier frames' bytes (the bit reservoir, up to 511 bytes: several frames at low bit
#: rates) and overlap the previous frame; AAC's overlap the previous frame; Opus needs at least
#: 80 ms (RFC 7845; 80 ms left differences up to 0.018 on the corpus, 200 ms 6e-4).
PREROLL_SECONDS = {"mp3": 0.1, "aac": 0.1, "opus": 0.2}
#: Pre-roll of a lossy codec not listed above.
DEFAULT_PREROLL_SECONDS = 0.2


def _family(codec: str) -> str | None:
    return next((name for name in TOLERANCE if name in codec), None)  # mp3float, libopus, ...


def tolerance(codec: str) -> float:
    """How far a window of ``codec`` (an FFmpeg decoder or encoder name) may be from the
    whole-stream decode: 0.0 for PCM and lossless codecs, `TOLERANCE` for lossy ones."""
    if codec.startswith("pcm_") or codec in LOSSLESS:
        return 0.0
    family = _family(codec)
    return DEFAULT_TOLERANCE if family is None else TOLERANCE[family]


def preroll(codec: str, source_rate: int) -> int:
    """Source samples decoded and discarded before a window of ``codec`` (0 when lossless)."""
    if tolerance(codec) == 0.0:
        return 0
    family = _family(codec)
    seconds = DEFAULT_PREROLL_SECONDS if family is None else PREROLL_SECONDS.get(family, DEFAULT_PREROLL_SECONDS)
    return math.ceil(seconds * source_rate)


@dataclasses.dataclass(frozen=True)
class AudioClip:
    #: float32 ``[channels, round(seconds * sample_rate)]``.
    samples: np.ndarray
    #: The window's first sample, in seconds from the stream's start.
    start: float


def _warmup(source_rate: int, sample_rate: int) -> int:
    """Source samples decoded before a window: FFmpeg's default resampling filter has 32 taps at
    the lower rate, so it reads 16 * ceil(source / rate) source samples on each side of an output
    sample; four times that leaves room."""
    return 64 * math.ceil(source_rate / sample_rate) + 64


def window_indices(total: int, count: int, rate: int, fraction: float, place: ClipPlace = ClipPlace()) -> np.ndarray:
    """The output-sample indices (at ``rate``, into a stream of ``total`` samples) of a window of
    ``count`` samples at ``fraction`` of ``place``'s sampling range, or at its regular start; those
    past the end as ``place.policy`` says. `BadMedia` when the window cannot be placed."""
    if place.at_seconds is not None:
        first = round(place.at_seconds * rate)
        end = total if place.range_end is None else min(round(place.range_end * rate), total)
        if first >= end:
            raise BadMedia(
                f"the window's regular start {place.at_seconds:.3f}s is at or after the end ({end / rate:.3f}s)"
            )
    else:
        low = 0 if place.range_start is None else round(place.range_start * rate)
        if low >= total:
            raise BadMedia(
                f"sampling_range_start {place.range_start or 0:g}s is at or after the audio's end ({total / rate:.3f}s)"
            )
        high = total - count + 1 if place.range_end is None else min(round(place.range_end * rate), total)
        high = max(high, low + 1)  # a window longer than the room left starts at the range's start
        first = low + round(fraction * (high - 1 - low))
    indices = first + np.arange(count, dtype=np.int64)
    placed = follow_policy(indices, total, place.policy)
    if placed is not None:
        return placed
    if count > total:
        raise BadMedia(f"a window of {count / rate:g}s is longer than the audio ({total / rate:.3f}s)")
    raise BadMedia(
        f"the window from {first / rate:.3f}s to {(first + count) / rate:.3f}s reaches past the audio's end "
        f"({total / rate:.3f}s; policy 'error'; policy: repeat_last or wrap fills it)"
    )


def decode_audio_clip(
    opened: OpenAudio,
    fraction: float,
    seconds: float,
    sample_rate: int,
    channels: int,
    place: ClipPlace = ClipPlace(),
) -> AudioClip:
    """``seconds`` of audio at ``sample_rate`` with ``channels`` channels, at ``fraction`` of the
    stream (of ``place``'s sampling range, or at its regular start; past the end as its policy says)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if channels not in LAYOUTS or sample_rate < 1 or not seconds > 0:
        raise ValueError(
            f"need channels 1 or 2, sample_rate >= 1, seconds > 0; got {channels}, {sample_rate}, {seconds}"
        )
    count = round(seconds * sample_rate)
    total = opened.samples * sample_rate // opened.sample_rate
    indices = window_indices(total, count, sample_rate, fraction, place)
    first = int(indices[0])
    decoded = _decode_samples(opened, first, min(count, total - first), sample_rate, channels)
    if int(indices[-1]) - first == count - 1:  # inside the stream: the samples as decoded
        return AudioClip(samples=decoded, start=first / sample_rate)
    return AudioClip(samples=np.ascontiguousarray(decoded[:, indices - first]), start=first / sample_rate)


def _decode_samples(opened: OpenAudio, first: int, count: int, sample_rate: int, channels: int) -> np.ndarray:
    """Output samples ``[first, first + count)`` of the stream resampled to ``sample_rate``."""
    source_rate = opened.sample_rate
    # Start on the shared grid: `unit` source samples are exactly `unit * sample_rate / source_rate` outputs.
    unit = source_rate // math.gcd(source_rate, sample_rate)
    begin = max(0, (first * source_rate - _warmup(source_rate, sample_rate) * sample_rate) // (unit * sample_rate))
    begin *= unit
    # Lossy decoders need frames before ``begin`` decoded and thrown away (`preroll`).
    # Below 0 (before the stream's start): the encoder's priming frames are decoded too.
    seek_at = begin - preroll(opened.stream.codec_context.name, source_rate)
    window = _Window(np.empty((channels, count), np.float32), first)
    opened.start_window()
    resampler = av.AudioResampler(format="fltp", layout=LAYOUTS[channels], rate=sample_rate)
    try:
        with contextlib.closing(decode_from(opened, opened.start_time + (seek_at + 0.5) / source_rate)) as decoded:
            for frame in decoded:
                if frame.pts is None:
                    raise BadMedia("a decoded audio frame has no timestamp")
                frame_start = _position(frame, opened)
                if frame_start + frame.samples <= begin:
                    continue
                if window.position is None:
                    if frame_start < begin:
                        frame = _tail(frame, begin - frame_start, opened)
                    # Output index of the frame's first sample (exact on the grid; rounded after a gap).
                    window.position = round(Fraction(max(frame_start, begin) * sample_rate, source_rate))
                window.take(resampler.resample(frame))
                if window.filled == count:
                    break
            else:
                if window.position is not None:  # the stream ended: flush the resampler
                    window.take(resampler.resample(None))
    except av.error.FFmpegError as error:
        raise BadMedia(f"decoding the audio failed: {error}") from error
    if window.filled < count:
        raise BadMedia(
            f"the audio ended {count - window.filled} samples short of the window at {first / sample_rate:.3f}s "
            f"+ {count / sample_rate:g}s, though its header says {opened.duration:.3f}s"
        )
    return window.samples


@dataclasses.dataclass
class _Window:
    """The output window ``[first, first + count)`` filled from resampled frames as they come."""

    samples: np.ndarray
    first: int
    #: Output index of the next resampled sample; None before the first frame.
    position: int | None = None
    filled: int = 0

    def take(self, frames: Iterable[Any]) -> None:
        if self.position is None:
            raise RuntimeError("a window takes frames only once its position is set")
        count = self.samples.shape[1]
        for frame in frames:
            data = frame.to_ndarray()
            low = max(self.first - self.position, 0)
            high = min(data.shape[1], self.first + count - self.position)
            if high > low:
                at = self.position + low - self.first
                self.samples[:, at : at + high - low] = data[:, low:high]
                self.filled += high - low
            self.position += data.shape[1]


def _position(frame: Any, opened: OpenAudio) -> int:
    """The source-sample index of ``frame``'s first sample: from its timestamp, snapped to the
    stream's frame grid when timestamps are coarser than a sample (Matroska/WebM milliseconds)."""
    position = round((frame.pts - opened.start_pts) * opened.time_base * opened.sample_rate)
    if opened.grid is None:
        return position
    end_of_first, size = opened.grid
    k = round((position - end_of_first) / size)
    snapped = end_of_first + k * size if k >= 0 else end_of_first - frame.samples + (k + 1) * size
    # Off the grid by more than a rounded timestamp can be (frames of another size): the timestamp.
    half_tick = math.ceil(opened.time_base * opened.sample_rate / 2)
    return snapped if abs(snapped - position) <= half_tick else position


def _tail(frame: Any, cut: int, opened: OpenAudio) -> Any:
    """``frame`` without its first ``cut`` samples."""
    data = frame.to_ndarray()
    step = 1 if frame.format.is_planar else len(frame.layout.channels)  # packed: samples interleaved
    tail = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(data[:, cut * step :]), format=frame.format.name, layout=frame.layout
    )
    tail.sample_rate, tail.time_base = frame.sample_rate, opened.time_base
    tail.pts = frame.pts + round(Fraction(cut, opened.sample_rate) / opened.time_base)
    return tail
