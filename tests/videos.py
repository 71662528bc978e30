"""Small real video and audio datasets for tests: encoded with `lance_lightning.media.synthetic`.

Guarantees: `write_videos` writes ``rows`` MP4s (lengths varying per row, 24 fps) as a Lance blob
column ``video`` (or plain binary with ``blob=False``) beside ``id`` and ``label``; rows listed in
``truncated`` hold only the first half of their file, rows in ``garbage`` random bytes, rows in
``short`` fewer frames than any clip here asks for. `write_audio` does the same for FLAC tones.
Each video is encoded once per process (cached), so datasets written from the same rows in one
process hold the same bytes. `write_corpus_media` writes the files of `tests.media_corpus` of
one kind (every container and codec) the same way, ``label`` being the row and ``name`` the file's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.media.synthetic import encode_audio, encode_video, moving_shapes, tone
from tests.media_corpus import MediaFile, corpus

FPS = 24
BLOB = {"lance-encoding:blob": "true"}


def video_frames(row: int) -> int:
    """Frames of row ``row``'s video."""
    return 40 + 8 * (row % 4)


@functools.cache
def _video(row: int, frames: int, size: int) -> bytes:
    """Row ``row``'s MP4, encoded once per process: datasets written from the same rows hold the same bytes."""
    return encode_video(moving_shapes(row % 3, frames, size, size, seed=row), fps=FPS)


def write_videos(
    path: Path | str,
    rows: int = 12,
    *,
    size: int = 32,
    blob: bool = True,
    truncated: tuple[int, ...] = (),
    garbage: tuple[int, ...] = (),
    short: tuple[int, ...] = (),
    fragment_rows: int | None = None,
) -> str:
    videos = []
    for row in range(rows):
        frames = 3 if row in short else video_frames(row)
        data = _video(row, frames, size)
        if row in truncated:
            data = data[: len(data) // 2]
        if row in garbage:
            data = np.random.default_rng(row).integers(0, 256, len(data), dtype=np.uint8).tobytes()
        videos.append(data)
    return _write(path, "video", videos, blob, rows, fragment_rows)


def write_audio(
    path: Path | str, rows: int = 8, *, sample_rate: int = 16000, channels: int = 1, truncated: tuple[int, ...] = ()
) -> str:
    files = []
    for row in range(rows):
        data = encode_audio(
            tone(row % 3, 1.5 + 0.25 * (row % 3), sample_rate, seed=row, channels=channels), sample_rate
        )
        files.append(data[: len(data) // 3] if row in truncated else data)
    return _write(path, "audio", files, True, rows, None)


def write_corpus_media(path: Path | str, kind: str, names: tuple[str, ...] | None = None) -> list[MediaFile]:
    """The corpus files of ``kind`` ("video" or "audio"; only ``names`` when given) as a Lance
    blob column ``kind`` beside ``id``, ``label`` (the row) and ``name``; their descriptions, by row."""
    items = [item for item in corpus() if item.kind == kind and (names is None or item.name in names)]
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field(kind, pa.large_binary(), metadata=BLOB),
            pa.field("label", pa.int64()),
            pa.field("name", pa.string()),
        ]
    )
    rows = range(len(items))
    data = {"id": rows, kind: [item.data for item in items], "label": rows, "name": [item.name for item in items]}
    lance.write_dataset(pa.table(data, schema=schema), str(path), max_rows_per_file=4)
    return items


def _write(path: Path | str, column: str, values: list[bytes], blob: bool, rows: int, fragment_rows: int | None) -> str:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field(column, pa.large_binary(), metadata=BLOB if blob else None),
            pa.field("label", pa.int64()),
        ]
    )
    table = pa.table({"id": range(rows), column: values, "label": [r % 3 for r in range(rows)]}, schema=schema)
    lance.write_dataset(table, str(path), max_rows_per_file=fragment_rows or rows)
    return str(path)
