"""Stream facts of a video or audio file, probed when ``prepare`` writes it (``videofolder``,
``audiofolder``), with the bundled FFmpeg (PyAV).

Guarantees:
- `probe(column, data)` opens ``data`` exactly as the clip decoder does
  (`lance_lightning.media.containers.open_video` / ``open_audio``) and returns its facts as the
  columns of `MEDIA_FIELDS`: for a video, ``video_frames`` (the frames a whole-stream decode
  gives: the frame index of `lance_lightning.media.frame_index`, never the container's duration
  nor a header's count), ``video_fps`` (the stream's average rate), ``video_start`` (the first
  frame's time, s), ``video_duration`` (``video_frames / video_fps``, as clips are timed),
  ``width``, ``height``, ``video_codec`` (FFmpeg's decoder name); for audio,
  ``audio_sample_rate``, ``audio_channels``, ``audio_samples`` (samples per channel clips are
  planned on, at the stream's own rate), ``audio_start`` (s), ``audio_duration`` (s) and
  ``audio_codec``.
- A file that does not open as media of the column's kind (not media, truncated headers, no such
  stream, no decoder, no frame rate or length) gives a problem sentence instead (the caller skips
  and lists it, or refuses it, by ``on_bad_file``, like an image that does not decode). It never
  raises for bad bytes.
- Nothing is decoded beyond what opening needs (MP4/MOV/AVI: the index read with the headers;
  Matroska/WebM/MPEG-TS: the video's packets demuxed once, not decoded).
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

#: The probed columns, per media column.
MEDIA_FIELDS: dict[str, list[pa.Field]] = {
    "video": [
        pa.field("video_frames", pa.int64()),
        pa.field("video_fps", pa.float64()),
        pa.field("video_start", pa.float64()),
        pa.field("video_duration", pa.float64()),
        pa.field("width", pa.int64()),
        pa.field("height", pa.int64()),
        pa.field("video_codec", pa.string()),
    ],
    "audio": [
        pa.field("audio_sample_rate", pa.int64()),
        pa.field("audio_channels", pa.int64()),
        pa.field("audio_samples", pa.int64()),
        pa.field("audio_start", pa.float64()),
        pa.field("audio_duration", pa.float64()),
        pa.field("audio_codec", pa.string()),
    ],
}
#: The probed column holding a stream's length, per kind: what the clip reader checks an opened
#: file against (frames of a video, samples of an audio stream at its own rate).
LENGTH_COLUMN = {"video": "video_frames", "audio": "audio_samples"}


def probe(column: str, data: bytes) -> tuple[str | None, dict[str, Any]]:
    """``(None, facts)`` for a file that opens as ``column``'s kind ("video" or "audio"), else
    ``(problem, {})`` with a sentence saying why not."""
    from lance_lightning.errors import BadMedia
    from lance_lightning.media.containers import open_audio, open_video

    try:
        opened = open_video(io.BytesIO(data)) if column == "video" else open_audio(io.BytesIO(data))
    except BadMedia as error:
        return f"is not a readable {column} file ({error.reason})", {}
    try:
        return None, _facts(column, opened)
    finally:
        opened.close()


def _facts(column: str, opened: Any) -> dict[str, Any]:
    codec = opened.stream.codec_context.name
    if column == "video":
        return {
            "video_frames": opened.frames,
            "video_fps": opened.fps,
            "video_start": opened.start_time,
            "video_duration": opened.duration,
            "width": opened.width,
            "height": opened.height,
            "video_codec": codec,
        }
    return {
        "audio_sample_rate": opened.sample_rate,
        "audio_channels": opened.stream.codec_context.channels,
        "audio_samples": opened.samples,
        "audio_start": opened.start_time,
        "audio_duration": opened.samples / opened.sample_rate,
        "audio_codec": codec,
    }
