"""A corpus of small media files made the way users' files are made, and the oracle for each: a
whole-stream decode with plain PyAV (no code of this package).

Use it from any test::

    from tests.media_corpus import corpus, write_corpus, whole_video, whole_audio

    files = write_corpus(tmp_path)          # writes every file, returns their descriptions
    for item in files:                      # `MediaFile`: name, path, kind, container, codecs, ...
        item.frames / item.samples          # the count a whole-stream decode gives
        item.data                           # the file's bytes (also `corpus()` without writing)

Guarantees:
- `corpus()` encodes every file once per process (a few seconds; cached), with the PyAV wheel's
  own encoders, deterministically for a given wheel. `write_corpus(folder)` writes the same bytes
  to ``folder/<name>`` and returns the descriptions, in a fixed order.
- Each `MediaFile`'s counts and times come from a whole-stream decode of its bytes
  (`whole_video`, `whole_audio`), not from the encoder's settings or the container's header:
  ``frames`` / ``samples`` are the decoded count of the first video / audio stream, ``start_time``
  the first decoded frame's (sample's) time in seconds, ``frame_times`` every decoded frame's time.
- Videos (64x48 or 48x32, 24-60 frames): H.264 in MP4 (24 fps; B-frames with a longer AAC
  track; 29.97 fps; 60 fps), MOV (H.264 with a shorter AAC track), Matroska (H.264 + a longer
  AAC track; variable frame rate; starting at 1.25 s), MP4 at a variable frame rate, MP4 cut at a
  non-keyframe (an edit list hides its first 5 frames), WebM (VP9 + a slightly longer Opus track;
  VP8 alone), AVI (MPEG-4 Part 2 with MP3 audio; its header counts one frame more than decode) and
  MPEG-TS (H.264 + MP2 audio, starting at 1.0 s; no frame count in the header).
- Audio (about 2.3 s, mono and stereo, 16-48 kHz): WAV (PCM), FLAC, MP3 (LAME, with its
  encoder-delay header), M4A (AAC in MP4, with priming samples in an edit list), Ogg/Opus
  (pre-skip), and Opus in WebM and AAC in Matroska (timed in milliseconds, no stream duration).
  AAC: a whole-stream decode keeps the encoder's end padding (``samples`` is then up to a frame
  more than the length clips are planned on: ``duration_samples``, the container's duration, or
  for Matroska/WebM audio its packets' span less a millisecond).
  ``tolerance`` is the largest absolute difference a window of a lossy codec may have
  against the whole-stream decode (0.0: must be bit-exact); the values are those documented in
  `lance_lightning.media.audio`.
- Encoders used (all present in PyAV 18.1 / FFmpeg 8.1's wheel, checked by `missing_encoders`):
  libx264, mpeg4, libvpx, libvpx-vp9, aac, libmp3lame, libopus, mp2, flac, pcm_s16le. A wheel
  without one of them skips the files that need it (`missing_encoders()` names them).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from lance_lightning.media.synthetic import moving_shapes, tone

#: Largest absolute difference of a window against the whole-stream decode, per audio codec
#: (samples in [-1, 1]); lossless codecs are exact.
AUDIO_TOLERANCE = {"pcm_s16le": 0.0, "flac": 0.0, "mp3": 1e-3, "aac": 0.05, "opus": 5e-3}


@dataclasses.dataclass(frozen=True)
class MediaFile:
    """One corpus file and what a whole-stream decode of it gives."""

    name: str  # file name, with the usual extension
    kind: str  # "video" or "audio": the stream clips are cut from
    container: str  # FFmpeg format name it was muxed with
    codecs: tuple[str, ...]  # decoder of each stream (FFmpeg's name), the clipped stream's first
    data: bytes = dataclasses.field(repr=False)
    #: Video: decoded frames of the first video stream, their times (s), the nominal rate, size.
    frames: int = 0
    frame_times: tuple[float, ...] = dataclasses.field(default=(), repr=False)
    fps: float = 0.0
    height: int = 0
    width: int = 0
    #: Audio: decoded samples per channel of the first audio stream, its rate and channels.
    samples: int = 0
    sample_rate: int = 0
    channels: int = 0
    #: Audio: samples per channel the container's duration gives (without AAC's end padding).
    duration_samples: int = 0
    #: The first decoded frame's / sample's time, seconds.
    start_time: float = 0.0
    #: Largest absolute difference allowed against the whole decode (audio; 0.0: exact).
    tolerance: float = 0.0
    #: What makes this file a case (audio track longer, start offset, B-frames, ...).
    note: str = ""
    path: Path | None = None


def whole_video(data: bytes) -> list[av.VideoFrame]:
    """Every frame of the first video stream, decoded from the start by plain PyAV."""
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


def whole_video_rgb(data: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    """uint8 ``[N, H, W, 3]``: every frame as PyAV's ``reformat(format="rgb24")`` gives it."""
    frames = []
    for frame in whole_video(data):
        if size is not None:
            frame = frame.reformat(width=size[1], height=size[0], format="rgb24")
        frames.append(frame.to_ndarray(format="rgb24"))
    return np.stack(frames)


def whole_audio(data: bytes, sample_rate: int | None = None, channels: int | None = None) -> np.ndarray:
    """float32 ``[channels, samples]`` of the first audio stream decoded from the start by plain
    PyAV, through ``av.AudioResampler(format="fltp", layout, rate)`` (flushed at the end): at the
    stream's own rate and layout when not given."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        rate = sample_rate or stream.codec_context.sample_rate
        layout = {1: "mono", 2: "stereo"}[channels or stream.codec_context.channels]
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
        out = [o for frame in container.decode(stream) for o in resampler.resample(frame)]
    out += resampler.resample(None)
    return np.concatenate([frame.to_ndarray() for frame in out], axis=1)


def missing_encoders() -> list[str]:
    """Encoders the corpus uses that this PyAV wheel lacks (their files are left out)."""
    return [name for name in _ENCODERS if name not in av.codecs_available]


_ENCODERS = ("libx264", "mpeg4", "libvpx", "libvpx-vp9", "aac", "libmp3lame", "libopus", "mp2", "flac", "pcm_s16le")


@dataclasses.dataclass(frozen=True)
class _Video:
    name: str
    container: str
    codec: str
    fps: Fraction
    frames: int = 36
    size: tuple[int, int] = (48, 64)
    options: tuple[tuple[str, str], ...] = ()
    #: Seconds of the first frame (its pts / fps); VFR: each frame's duration in ticks of 1/fps.
    start: float = 0.0
    durations: tuple[int, ...] | None = None
    audio: str | None = None  # audio encoder
    audio_seconds: float = 0.0  # the audio track's length relative to the video's: +0.3 = longer
    note: str = ""


@dataclasses.dataclass(frozen=True)
class _Audio:
    name: str
    container: str
    codec: str
    sample_rate: int
    channels: int
    seconds: float = 2.3
    note: str = ""


H264 = (("g", "12"), ("keyint_min", "12"), ("sc_threshold", "0"), ("threads", "1"), ("bf", "0"))
H264_B = (("g", "12"), ("keyint_min", "12"), ("sc_threshold", "0"), ("threads", "1"), ("bf", "2"))
VIDEOS = (
    _Video("h264.mp4", "mp4", "libx264", Fraction(24), note="the baseline: H.264 in MP4"),
    _Video(
        "h264_bframes_aac.mp4",
        "mp4",
        "libx264",
        Fraction(24),
        options=H264_B,
        audio="aac",
        audio_seconds=0.4,
        note="B-frames (an edit list shifts pts), a longer AAC track",
    ),
    _Video("h264_2997.mp4", "mp4", "libx264", Fraction(30000, 1001), frames=40, note="29.97 fps"),
    _Video("h264_60.mp4", "mp4", "libx264", Fraction(60), frames=60, size=(32, 48), note="60 fps"),
    _Video(
        "h264_aac_short.mov",
        "mov",
        "libx264",
        Fraction(25),
        audio="aac",
        audio_seconds=-0.5,
        note="MOV with a shorter AAC track",
    ),
    _Video(
        "h264_aac.mkv",
        "matroska",
        "libx264",
        Fraction(24),
        frames=48,
        audio="aac",
        audio_seconds=0.25,
        note="Matroska, H.264 + a longer AAC track: no frame count in the header, duration covers audio",
    ),
    _Video(
        "h264_start125.mkv",
        "matroska",
        "libx264",
        Fraction(24),
        frames=48,
        start=1.25,
        note="Matroska starting at 1.25 s",
    ),
    _Video(
        "h264_vfr.mkv",
        "matroska",
        "libx264",
        Fraction(24),
        frames=30,
        durations=tuple([1, 1, 2, 1, 3, 1, 1, 2] * 4)[:30],
        note="variable frame rate",
    ),
    _Video(
        "h264_cut.mp4",
        "mp4",
        "libx264",
        Fraction(24),
        start=-5 / 24,
        note="cut at a non-keyframe (as `ffmpeg -ss -c copy` cuts): an edit list hides 5 decoded frames",
    ),
    _Video(
        "h264_vfr.mp4",
        "mp4",
        "libx264",
        Fraction(30),
        frames=30,
        durations=tuple([2, 1, 1, 3, 1, 2, 1, 1] * 4)[:30],
        note="variable frame rate in MP4 (as phones record)",
    ),
    _Video(
        "vp9_opus.webm",
        "webm",
        "libvpx-vp9",
        Fraction(24),
        frames=48,
        audio="libopus",
        audio_seconds=0.3,
        options=(("g", "12"), ("threads", "1"), ("deadline", "realtime"), ("cpu-used", "8")),
        note="WebM, VP9 + a slightly longer Opus track",
    ),
    _Video(
        "vp8.webm",
        "webm",
        "libvpx",
        Fraction(30),
        frames=30,
        options=(("g", "10"), ("threads", "1"), ("deadline", "realtime"), ("cpu-used", "8")),
        note="WebM, VP8 alone",
    ),
    _Video(
        "mpeg4_mp3.avi",
        "avi",
        "mpeg4",
        Fraction(25),
        frames=40,
        options=(("g", "10"),),
        audio="libmp3lame",
        audio_seconds=0.0,
        note="AVI, MPEG-4 Part 2 + MP3: no timestamps before the first frame",
    ),
    _Video(
        "h264_mp2.ts",
        "mpegts",
        "libx264",
        Fraction(24),
        frames=36,
        start=1.0,
        audio="mp2",
        audio_seconds=0.2,
        note="MPEG-TS starting at 1 s, H.264 + MP2",
    ),
)
AUDIOS = (
    _Audio("pcm.wav", "wav", "pcm_s16le", 44100, 2, note="WAV, 16-bit PCM"),
    _Audio("mono.flac", "flac", "flac", 48000, 1, note="FLAC"),
    _Audio("stereo.mp3", "mp3", "libmp3lame", 44100, 2, note="MP3 (LAME): bit reservoir, encoder delay header"),
    _Audio("mono22k.mp3", "mp3", "libmp3lame", 22050, 1, note="MP3 at 22.05 kHz (MPEG-2 layer III)"),
    _Audio("stereo.m4a", "ipod", "aac", 44100, 2, note="M4A: AAC with priming samples (edit list)"),
    _Audio("mono16k.m4a", "ipod", "aac", 16000, 1, note="M4A: AAC at 16 kHz"),
    _Audio("stereo.opus", "ogg", "libopus", 48000, 2, note="Ogg/Opus: pre-skip, needs 80 ms pre-roll"),
    _Audio("opus.webm", "webm", "libopus", 48000, 1, note="WebM audio: Opus timed in milliseconds"),
    _Audio("aac.mka", "matroska", "aac", 22050, 2, note="Matroska audio: AAC timed in milliseconds"),
)


def _audio_frames(samples: np.ndarray, rate: int, codec_context) -> list[av.AudioFrame]:
    """``samples`` (float [channels, S]) as frames of the encoder's frame size and format."""
    layout = "mono" if samples.shape[0] == 1 else "stereo"
    size = codec_context.frame_size or 1024
    frames = []
    fmt = codec_context.format.name
    for start in range(0, samples.shape[1], size):
        chunk = samples[:, start : start + size]
        if fmt.startswith("s16"):
            array = np.round(chunk * 32767).astype(np.int16)
        elif fmt.startswith("s32"):
            array = np.round(chunk * 2147483647).astype(np.int32)
        else:
            array = chunk.astype(np.float32)
        if not codec_context.format.is_planar:
            array = array.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(array), format=fmt, layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
        frames.append(frame)
    return frames


def _add_audio(output, codec: str, rate: int, channels: int):
    stream = output.add_stream(codec, rate=rate, layout="mono" if channels == 1 else "stereo")
    if codec == "libmp3lame":
        stream.codec_context.bit_rate = 64000 * channels
    stream.codec_context.thread_count = 1
    return stream


def _encode_video(spec: _Video) -> bytes:
    height, width = spec.size
    pixels = moving_shapes(len(spec.name) % 4, spec.frames, height, width, seed=len(spec.name))
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=spec.container, container_options={"fflags": "+bitexact"}) as output:
        options = dict(spec.options or (H264 if spec.codec == "libx264" else ()))
        stream = output.add_stream(spec.codec, rate=spec.fps, options=options)
        stream.height, stream.width, stream.pix_fmt = height, width, "yuv420p"
        stream.codec_context.thread_count = 1
        tick = 1 / spec.fps
        ticks = round(spec.start * spec.fps)
        video_packets = []
        for index, frame_pixels in enumerate(pixels):
            frame = av.VideoFrame.from_ndarray(frame_pixels, format="rgb24")
            frame.pts, frame.time_base = ticks, tick
            ticks += spec.durations[index] if spec.durations else 1
            video_packets += stream.encode(frame)
        video_packets += stream.encode(None)
        packets = list(video_packets)
        if spec.audio:
            rate = 48000 if spec.audio == "libopus" else 44100
            audio = _add_audio(output, spec.audio, rate, 2)
            seconds = float(ticks * tick) - spec.start + spec.audio_seconds
            samples = tone(1, seconds, rate, seed=2, channels=2)
            offset = round(spec.start * rate)
            for frame in [*_audio_frames(samples, rate, audio.codec_context), None]:
                if frame is not None:
                    frame.pts += offset
                packets += audio.encode(frame)
        # Interleave by time, as a recorder writes them.
        packets.sort(key=lambda p: float((p.dts if p.dts is not None else p.pts) * p.time_base))
        for packet in packets:
            output.mux(packet)
    return buffer.getvalue()


def _encode_audio(spec: _Audio) -> bytes:
    samples = tone(2, spec.seconds, spec.sample_rate, seed=len(spec.name), channels=spec.channels)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=spec.container, container_options={"fflags": "+bitexact"}) as output:
        stream = _add_audio(output, spec.codec, spec.sample_rate, spec.channels)
        for frame in [*_audio_frames(samples, spec.sample_rate, stream.codec_context), None]:
            output.mux(stream.encode(frame))
    return buffer.getvalue()


def _described_video(spec: _Video, data: bytes) -> MediaFile:
    frames = whole_video(data)
    with av.open(io.BytesIO(data)) as container:
        codecs = tuple(s.codec_context.name for s in container.streams if s.type in ("video", "audio"))
    return MediaFile(
        name=spec.name,
        kind="video",
        container=spec.container,
        codecs=codecs,
        data=data,
        frames=len(frames),
        frame_times=tuple(float(f.time) for f in frames),
        fps=float(spec.fps),
        height=frames[0].height,
        width=frames[0].width,
        start_time=float(frames[0].time),
        note=spec.note,
    )


def _described_audio(spec: _Audio, data: bytes) -> MediaFile:
    with av.open(io.BytesIO(data)) as container:
        first = next(container.decode(audio=0))
        stream = container.streams.audio[0]
        decoder = stream.codec_context.name
        if stream.duration:
            duration = round(stream.duration * stream.time_base * spec.sample_rate)
        else:  # Matroska/WebM audio: its packets' span, less one millisecond tick (rounded timestamps)
            container.seek(0)
            end = max(p.pts + p.duration for p in container.demux(stream) if p.size)
            duration = math.floor((end - (stream.start_time or 0) - 1) * stream.time_base * spec.sample_rate)
        if spec.container == "ogg":  # Ogg's duration counts Opus's pre-skip, which the decoder drops
            duration -= stream.codec_context.delay
    decoded = whole_audio(data)
    return MediaFile(
        name=spec.name,
        kind="audio",
        container=spec.container,
        codecs=(decoder,),
        data=data,
        samples=decoded.shape[1],
        duration_samples=duration,
        sample_rate=spec.sample_rate,
        channels=spec.channels,
        start_time=float(first.time),
        tolerance=AUDIO_TOLERANCE[{"libmp3lame": "mp3", "libopus": "opus"}.get(spec.codec, spec.codec)],
        note=spec.note,
    )


@functools.cache
def corpus() -> tuple[MediaFile, ...]:
    """Every corpus file this wheel can encode, encoded once per process (videos, then audio)."""
    missing = set(missing_encoders())
    files = [
        _described_video(spec, _encode_video(spec))
        for spec in VIDEOS
        if spec.codec not in missing and spec.audio not in missing
    ]
    files += [_described_audio(spec, _encode_audio(spec)) for spec in AUDIOS if spec.codec not in missing]
    return tuple(files)


def write_corpus(folder: Path | str) -> list[MediaFile]:
    """Write every corpus file to ``folder/<name>``; their descriptions, with ``path`` set."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for item in corpus():
        path = folder / item.name
        path.write_bytes(item.data)
        written.append(dataclasses.replace(item, path=path))
    return written


def by_name(name: str) -> MediaFile:
    """The corpus file called ``name``."""
    return next(item for item in corpus() if item.name == name)
