"""The video benchmark's synthetic video sets and the settings all of its parts share.

Guarantees:
- `video_set` writes a set's MP4 files and its local Lance table (``id``, ``video`` blob,
  ``label``) once under the cache folder (``done.json`` marks a finished set) and reuses them on
  later runs; the blob column holds the same MP4 bytes as the files on disk.
- The clip settings (`FPS`, `SIDE`, `OUT_SIZE`, `FRAME_STEP`, `CLIPS_PER_ITEM`) and the
  read-aheads section 2 compares (`BUFFER_SIZES`) are defined here once.
- `ARGS` is the one parsed command line: the ``video`` study fills it in place in the main process;
  worker processes leave it empty and use only what their datasets carry.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.media.synthetic import encode_video, moving_shapes

FPS = 24
SIDE = 128
OUT_SIZE = (112, 112)
FRAME_STEP = 2
CLIPS_PER_ITEM = 2
BLOB = {"lance-encoding:blob": "true"}
KIB = 1024
#: ``take_blobs``' default read-ahead.
LANCE_READ_AHEAD = 512 * KIB


def loader_read_ahead() -> int:
    """The ``lance.BlobFile`` read-ahead the loader opens media blobs with (Lance's default unless
    ``lance_lightning.read.clips`` sets ``BLOB_READ_AHEAD``)."""
    import lance_lightning.read.clips as clips

    return int(getattr(clips, "BLOB_READ_AHEAD", LANCE_READ_AHEAD))


#: The read-aheads section 2 compares: Lance's default, 64 KiB, none, and the loader's if another.
BUFFER_SIZES = tuple(dict.fromkeys((LANCE_READ_AHEAD, 64 * KIB, 0, loader_read_ahead())))


@dataclass(frozen=True)
class VideoSet:
    """``videos`` synthetic videos of ``frames`` frames, ``SIDE`` x ``SIDE`` at `FPS`, a keyframe every ``gop``."""

    name: str
    videos: int
    frames: int
    gop: int
    rows_per_file: int

    @property
    def key(self) -> str:
        return f"{self.name}_{self.videos}x{self.frames}_{SIDE}px_g{self.gop}"


FULL_SETS = (VideoSet("short", 48, 48, 24, 16), VideoSet("long", 24, 1440, 24, 8))
QUICK_SETS = (VideoSet("short", 8, 48, 24, 4), VideoSet("long", 4, 240, 24, 4))


@dataclass
class Data:
    """One video set written as MP4 files and as a local Lance table (``id``, ``video`` blob, ``label``)."""

    spec: VideoSet
    files: list[Path]
    uri: str
    sizes: np.ndarray  # bytes of each video
    labels: list[int]

    @property
    def whole(self) -> float:
        """Mean bytes of a whole video."""
        return float(self.sizes.mean())

    def share(self, frames: int) -> float:
        """Mean bytes of a clip's own share of its file: file bytes x clip frames / video frames."""
        return float(self.sizes.mean()) * frames / self.spec.frames


def log(message: str) -> None:
    print(message, flush=True)


# -- data ------------------------------------------------------------------------------------
def video_set(cache: Path, spec: VideoSet) -> Data:
    """The set's MP4 files and Lance table under ``cache``, written once."""
    folder = cache / spec.key
    uri = cache / f"{spec.key}.lance"
    files = [folder / f"{i:04d}.mp4" for i in range(spec.videos)]
    labels = [i % 4 for i in range(spec.videos)]
    done = folder / "done.json"
    if not done.exists():
        log(f"[data] encoding {spec.videos} videos of {spec.frames} frames into {folder} ...")
        started = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(files):
            frames = moving_shapes(labels[i], spec.frames, SIDE, SIDE, seed=i)
            path.write_bytes(encode_video(frames, fps=FPS, gop=spec.gop))
        write_lance(str(uri), [p.read_bytes() for p in files], labels, spec.rows_per_file)
        done.write_text(json.dumps({"videos": spec.videos, "frames": spec.frames}))
        log(f"[data] wrote {folder} and {uri} in {time.perf_counter() - started:.1f} s")
    sizes = np.array([p.stat().st_size for p in files], dtype=np.float64)
    return Data(spec, files, str(uri), sizes, labels)


def write_lance(uri: str, videos: list[bytes], labels: list[int], rows_per_file: int, **options: Any) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("video", pa.large_binary(), metadata=BLOB),
            pa.field("label", pa.int64()),
        ]
    )
    table = pa.table({"id": range(len(videos)), "video": videos, "label": labels}, schema=schema)
    lance.write_dataset(table, uri, mode="overwrite", max_rows_per_file=rows_per_file, **options)


#: The parsed command line (set in the main process; worker processes use only what their datasets carry).
ARGS = argparse.Namespace()
