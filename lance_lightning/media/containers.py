"""Open media: a PyAV container over a seekable file object, its stream, and a pool that reuses them.

Guarantees:
- `open_video` / `open_audio` parse a file's headers once (for MP4, the ``moov`` index) and
  return an `OpenVideo` / `OpenAudio` holding the container, its first video/audio stream, the
  stream's rate, length and time base, and the file object. A video's length and times are its
  own stream's, from its frame index (`lance_lightning.media.frame_index`: every frame's time,
  taken once), never the container's duration; an audio stream's start is its own
  ``start_time`` (after the encoder's delay: the whole-stream decode's first sample). An Ogg
  audio container is reopened from its file before each window but the first
  (`OpenAudio.start_window`), reading its headers again. They take the file: ``close()``
  closes the container and then the file, and is safe to call twice (a failed open leaves the
  file open, the caller's).
- The file object only needs ``read``, ``seek``, ``tell`` (a ``lance.BlobFile``, an
  ``io.BytesIO``, an open file). PyAV reads it through an AVIO buffer of `AVIO_BUFFER_BYTES`,
  seeking past what a clip does not need; the codec's own threads are off (reader threads decode
  clips in parallel instead).
- A file that is not media of that kind (corrupt, truncated, no such stream, no decoder, unknown
  length) raises `BadMedia` with a readable ``reason``; an ``OSError`` from the file object's own
  ``read`` passes through unchanged (it is I/O, not media). `BadMedia` pickles with its reason.
- `decode_from` yields a stream's frames decoded forward from the keyframe at or before a time,
  never starting after it (unless the stream starts after it); it seeks back further only if the
  demuxer lands too late, never to a negative timestamp (AVI: FFmpeg refuses it) nor more than
  a second before the stream's start.
- `MediaPool` keeps at most ``capacity`` open media keyed by the caller's hashable keys, least
  recently checked in evicted (and closed) first. ``checkout`` removes an entry, so one thread
  uses it at a time; one lock guards the map and nothing is closed while it is held.
- `CountingFile` wraps a file object and counts the bytes and ``read`` calls that pass through.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Generator, Hashable
from fractions import Fraction
from typing import Any, Protocol

import av
import av.error
import numpy as np
from av.video.reformatter import VideoReformatter

from lance_lightning.errors import BadMedia
from lance_lightning.media.frame_index import coarse_audio, frame_index, seek_floor

#: PyAV's AVIO buffer over the file object (its largest read). On a 600-frame 128x128 H.264 MP4 a
#: 16-frame clip reads ~43 KB with 4 KiB or 16 KiB (7 or 3 reads); bigger buffers save reads but
#: the open reads a whole buffer of the first packet (16 KiB: 41 KB of headers, 64 KiB: 139 KB).
AVIO_BUFFER_BYTES = 16 * 1024


class MediaFile(Protocol):
    """The file object media is read from (the module docstring): ``close`` is called by ``close()``."""

    def read(self, size: int = -1, /) -> bytes: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...
    def close(self) -> None: ...


class _CountedFile(MediaFile, Protocol):
    """What `CountingFile` passes through besides `MediaFile`'s calls."""

    def readinto(self, buffer: Any, /) -> int | None: ...
    def seekable(self) -> bool: ...
    def readable(self) -> bool: ...
    @property
    def closed(self) -> bool: ...


@dataclasses.dataclass(eq=False)
class OpenMedia:
    """An opened container and the stream decoded from it; times are in seconds."""

    container: Any
    stream: Any
    file: MediaFile
    time_base: Fraction
    #: The stream's first timestamp, in ``time_base`` units and in seconds.
    start_pts: int
    start_time: float
    duration: float
    #: The lowest timestamp a seek goes to (`seek_floor`).
    seek_floor: int

    def close(self) -> None:
        """Close the container, then the file object; a second call does nothing."""
        try:
            self.container.close()
        finally:
            self.file.close()


@dataclasses.dataclass(eq=False)
class OpenVideo(OpenMedia):
    fps: float
    #: Every frame's presentation time in ``time_base`` units, sorted (`frame_index`).
    frame_pts: np.ndarray
    height: int
    width: int
    #: Converts this video's frames to RGB (and resizes), reused for every frame: one converter
    #: per open video, on the decoding thread (PyAV makes one per frame otherwise, each starting a
    #: pool of threads: 17 of a 128x128 clip's 20 ms).
    reformatter: Any = dataclasses.field(default_factory=VideoReformatter)

    @property
    def frames(self) -> int:
        """Frames in the stream: those a whole-stream decode gives."""
        return len(self.frame_pts)


@dataclasses.dataclass(eq=False)
class OpenAudio(OpenMedia):
    sample_rate: int
    #: Samples per channel in the stream, at ``sample_rate``.
    samples: int
    #: For timestamps coarser than a sample: (end of the first frame, frame size) in samples.
    grid: tuple[int, int] | None = None
    #: The open options when the container is reopened before every window but its first (Ogg:
    #: FFmpeg's demuxer, seeking again after a decode stopped mid-page, can mistime the packets
    #: after the landing point, so a window ends short or holds other samples); None: reused.
    reopen_options: dict[str, str] | None = None
    decoded: bool = False

    def start_window(self) -> None:
        """Make the container ready to decode a window: reopened if `reopen_options` says so and a
        window was decoded from it before."""
        if self.reopen_options is not None and self.decoded:
            self.container.close()
            self.file.seek(0)
            self.container, self.stream = _open_container(self.file, "audio", self.reopen_options)
        self.decoded = True


def open_video(file: MediaFile) -> OpenVideo:
    """The first video stream of ``file``, headers parsed and its frames indexed
    (`lance_lightning.media.frame_index`); `BadMedia` when there is none."""
    container, stream, _ = _open_stream(file, "video", {})
    try:
        fps = stream.average_rate or stream.guessed_rate
        if not fps:
            raise BadMedia("the video stream has no frame rate")
        index = frame_index(container, stream)
        start_pts = int(index[0])  # the first frame's time, not the container's start
        return OpenVideo(
            container=container,
            stream=stream,
            file=file,
            time_base=stream.time_base,
            start_pts=start_pts,
            start_time=float(start_pts * stream.time_base),
            duration=len(index) / float(fps),
            seek_floor=seek_floor(stream, start_pts),
            fps=float(fps),
            frame_pts=index,
            height=stream.codec_context.height,
            width=stream.codec_context.width,
        )
    except BaseException:
        container.close()
        raise


def open_audio(file: MediaFile) -> OpenAudio:
    """The first audio stream of ``file``, headers parsed; `BadMedia` when there is none."""
    # One packet is enough to know an audio stream (the default probes 5 s: a whole WAV file).
    options = {"probesize": "32"}
    if _starts_with(file, b"fLaC"):
        options["fflags"] = "+fastseek"  # FFmpeg reads a FLAC SEEKTABLE only with this flag
    container, stream, times = _open_stream(file, "audio", options)
    try:
        start_pts, start_time, duration = times
        rate = stream.codec_context.sample_rate
        if not rate or not duration:
            raise BadMedia("the audio stream has no sample rate or no known duration")
        samples, grid = round(duration * rate), None
        if stream.time_base > Fraction(1, rate):  # timed coarser than a sample (Matroska, WebM)
            counted, grid = coarse_audio(container, stream, rate)
            if counted is not None:  # no duration of its own: its packets', not the container's
                samples, duration = counted, counted / rate
        ogg = "ogg" in container.format.name.split(",")
        if ogg:
            samples -= stream.codec_context.delay  # Ogg's duration counts the pre-skip the decoder drops
        return OpenAudio(
            container=container,
            stream=stream,
            file=file,
            time_base=stream.time_base,
            start_pts=start_pts,
            start_time=start_time,
            duration=duration,
            seek_floor=seek_floor(stream, start_pts),
            sample_rate=rate,
            samples=samples,
            grid=grid,
            reopen_options=options if ogg else None,
        )
    except BaseException:
        container.close()
        raise


def _starts_with(file: MediaFile, magic: bytes) -> bool:
    start = file.tell()
    try:
        return file.read(len(magic)) == magic
    finally:
        file.seek(start)


def _open_stream(file: MediaFile, kind: str, options: dict[str, str]) -> tuple[Any, Any, tuple[int, float, float]]:
    container, stream = _open_container(file, kind, options)
    try:
        start_pts = stream.start_time or 0
        if stream.duration:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / av.time_base
        return container, stream, (start_pts, float(start_pts * stream.time_base), duration)
    except BaseException:
        container.close()
        raise


def _open_container(file: MediaFile, kind: str, options: dict[str, str]) -> tuple[Any, Any]:
    """The container over ``file`` and its first ``kind`` stream, decoded on the calling thread."""
    try:
        container = av.open(file, mode="r", buffer_size=AVIO_BUFFER_BYTES, container_options=options)
    except av.error.FFmpegError as error:
        raise BadMedia(f"not a readable media file: {error}") from error
    try:
        streams = getattr(container.streams, kind)
        if not streams:
            raise BadMedia(f"the file has no {kind} stream")
        stream = streams[0]
        if stream.codec_context is None:
            raise BadMedia(f"no decoder for the {kind} stream's codec")
        stream.codec_context.thread_count = 1
        return container, stream
    except BaseException:
        container.close()
        raise


def decode_from(opened: OpenMedia, seconds: float) -> Generator[Any, None, None]:
    """Frames of ``opened.stream`` decoded forward from the keyframe at or before ``seconds``.

    The first frame yielded starts at or before ``seconds`` (or is the stream's first). A demuxer
    that lands after the time, or past the last keyframe (MPEG-TS seeks by decode times and lands
    on the next keyframe), or that refuses the seek (FFmpeg's FLAC demuxer inside a file's last
    frames: EPERM), is asked again for a point 1, 2, 4... seconds earlier, down to
    ``opened.seek_floor`` (`seek_floor`)."""
    lowest = opened.seek_floor
    seek_to, back = seconds, 1.0
    while True:
        ticks = math.floor((Fraction(seek_to) - Fraction(opened.start_time)) / opened.time_base) + opened.start_pts
        ticks = max(ticks, lowest)
        try:
            opened.container.seek(ticks, stream=opened.stream, backward=True, any_frame=False)
        except av.error.FFmpegError:
            if ticks <= lowest:
                raise
            seek_to, back = seek_to - back, back * 2
            continue
        frames = opened.container.decode(opened.stream)
        first = next(frames, None)
        if first is not None and first.time is None:
            raise BadMedia("a decoded frame has no timestamp")
        landed = first is not None and first.time <= seconds  # none: it landed past the last keyframe
        if landed or ticks <= lowest:
            if first is not None:
                yield from itertools.chain((first,), frames)
            return
        seek_to, back = seek_to - back, back * 2


class MediaPool:
    """At most ``capacity`` open media, reused across clips and epochs; thread-safe."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[Hashable, OpenMedia] = OrderedDict()

    def checkout(self, key: Hashable) -> OpenMedia | None:
        """The media open under ``key``, removed from the pool until checked in; None if absent."""
        with self._lock:
            return self._open.pop(key, None)

    def checkin(self, key: Hashable, opened: OpenMedia) -> None:
        """Keep ``opened`` under ``key`` as the most recent; close what falls beyond ``capacity``
        (and a media already kept under ``key``: one per key)."""
        with self._lock:
            kept = self._open.pop(key, None)
            closing = [kept] if kept is not None and kept is not opened else []
            self._open[key] = opened
            while len(self._open) > self.capacity:
                closing.append(self._open.popitem(last=False)[1])
        _close_all(closing)

    def clear(self) -> None:
        """Close every media in the pool."""
        with self._lock:
            closing = list(self._open.values())
            self._open.clear()
        _close_all(closing)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def _close_all(closing: list[OpenMedia]) -> None:
    for opened in closing:
        try:
            opened.close()
        except (OSError, av.error.FFmpegError):
            pass  # closing is best effort: the memory is released either way


class CountingFile:
    """Delegates to ``file``, counting ``bytes_read`` and ``read_calls`` (reads and readintos)."""

    def __init__(self, file: _CountedFile) -> None:
        self.file = file
        self.bytes_read = 0
        self.read_calls = 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.bytes_read += len(data)
        self.read_calls += 1
        return data

    def readinto(self, buffer: Any) -> int | None:
        count = self.file.readinto(buffer)
        self.bytes_read += count or 0
        self.read_calls += 1
        return count

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def seekable(self) -> bool:
        return self.file.seekable()

    def readable(self) -> bool:
        return self.file.readable()

    def close(self) -> None:
        self.file.close()

    @property
    def closed(self) -> bool:
        return self.file.closed
