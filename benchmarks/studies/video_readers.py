"""The readers the video benchmark measures: this loader and the plain-``DataLoader`` baselines.

Guarantees:
- Every reader decodes the same clips: `sampler` for this loader, `ClipItems` for the baselines
  (clip ``k`` of `CLIPS_PER_ITEM` at a random start in the ``k``-th part of its video, every
  `FRAME_STEP`-th frame, resized to `OUT_SIZE`); the PyAV baselines decode with the package's own
  `open_video` and `decode_video_clip` and keep nothing open.
- Bytes and requests are counted where they happen, as cumulative ``(bytes, requests)`` `Meter`
  functions: Lance's I/O statistics (`lance_meter`), the S3 proxy's count (`proxy_meter`), and
  `CountingFile`/`MeteredFile` for what PyAV asks for.
- `epoch` checks every batch's video (``uint8 [B, T, 3, H, W]``) and counts its clips; `Phase`
  holds the clips, seconds, bytes and requests of one reader's epochs.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.studies.video_data import ARGS, CLIPS_PER_ITEM, FRAME_STEP, OUT_SIZE
from lance_lightning import LanceDataModule, LanceSource, RemoteCache, RowShuffle, VideoClips
from lance_lightning.media.containers import CountingFile, open_video
from lance_lightning.media.decoders import close_decoders
from lance_lightning.media.video import decode_video_clip


# -- counting -----------------------------------------------------------------------------------
class MeteredFile(CountingFile):
    """`CountingFile` that also sums the seconds spent in ``read``/``readinto``/``seek`` (I/O time)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.io_seconds = 0.0

    def read(self, size: int = -1) -> bytes:
        started = time.perf_counter()
        try:
            return super().read(size)
        finally:
            self.io_seconds += time.perf_counter() - started

    def readinto(self, buffer: Any) -> int:
        started = time.perf_counter()
        try:
            return super().readinto(buffer)
        finally:
            self.io_seconds += time.perf_counter() - started

    def seek(self, offset: int, whence: int = 0) -> int:
        started = time.perf_counter()
        try:
            return super().seek(offset, whence)
        finally:
            self.io_seconds += time.perf_counter() - started


Meter = Callable[[], tuple[float, float]]  # () -> cumulative (bytes, requests)


def lance_meter(dataset: lance.LanceDataset) -> Meter:
    """Cumulative (bytes, requests) read through ``dataset``'s handle (Lance's I/O statistics)."""
    total = [0.0, 0.0]

    def meter() -> tuple[float, float]:
        stats = dataset.io_stats_incremental()
        total[0] += stats.read_bytes
        total[1] += stats.read_iops
        return total[0], total[1]

    meter()
    return meter


def proxy_meter(proxy: Any) -> Meter:
    """Cumulative (GET body bytes, requests of every method) the S3 proxy forwarded, for every process."""
    return lambda: (float(proxy.bytes_sent), float(proxy.forwarded))


# -- the clip choice shared by every reader ---------------------------------------------------
def sampler(open_files: int, seed: int = 0) -> VideoClips:
    """The clips every reader decodes (``seed`` 1 for a second loader in the same process: samplers
    that differ keep separate pools of open videos)."""
    return VideoClips(
        column="video",
        frames=ARGS.frames,
        frame_step=FRAME_STEP,
        clips_per_item=CLIPS_PER_ITEM,
        size=list(OUT_SIZE),
        starts="random",
        seed=seed,
        open_files=open_files,
    )


class ClipItems(Dataset):
    """Map-style: item ``u`` is clip ``u % K`` of video ``u // K``, starting at a random point of the
    ``k``-th of ``K`` equal parts of the room the clip leaves (the loader's ``starts="random"``)."""

    def __init__(self, labels: list[int], frames: int) -> None:
        self.labels = labels
        self.frames = frames
        self.bytes_read = 0
        self.read_calls = 0
        self._rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.labels) * CLIPS_PER_ITEM

    def fraction(self, unit: int) -> float:
        if self._rng is None:  # one stream per process: a new start on every access
            self._rng = np.random.default_rng(torch.initial_seed() % 2**63)
        return ((unit % CLIPS_PER_ITEM) + float(self._rng.random())) / CLIPS_PER_ITEM

    def decode(self, file: Any, unit: int) -> dict[str, Any]:
        counted = CountingFile(file)
        opened = open_video(counted)
        try:
            clip = decode_video_clip(opened, self.fraction(unit), self.frames, float(FRAME_STEP), OUT_SIZE)
        finally:
            opened.close()
            self.bytes_read += counted.bytes_read
            self.read_calls += counted.read_calls
        return self.item(unit, torch.from_numpy(clip.frames), torch.from_numpy(clip.timestamps))

    def item(self, unit: int, video: torch.Tensor, times: torch.Tensor) -> dict[str, Any]:
        row = unit // CLIPS_PER_ITEM
        return {"id": row, "label": self.labels[row], "video": video, "video_timestamps": times}


class WholeBlobClips(ClipItems):
    """Reads the whole blob of the clip's video (``read_blobs``) and decodes the clip from ``BytesIO``."""

    def __init__(self, uri: str, labels: list[int], frames: int, options: dict[str, str] | None) -> None:
        super().__init__(labels, frames)
        self.uri, self.options = uri, options
        self._dataset: lance.LanceDataset | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dataset": None}  # a worker opens its own handle

    def dataset(self) -> lance.LanceDataset:
        if self._dataset is None or self._pid != os.getpid():  # opened in each worker process
            self._dataset, self._pid = lance.dataset(self.uri, storage_options=self.options), os.getpid()
        return self._dataset

    def __getitem__(self, unit: int) -> dict[str, Any]:
        (_, data), *_ = self.dataset().read_blobs("video", indices=[unit // CLIPS_PER_ITEM])
        return self.decode(io.BytesIO(data), unit)


class FileClips(ClipItems):
    """Decodes the clip from the MP4 file on disk with PyAV (an unbuffered file: every read counted)."""

    def __init__(self, files: list[Path], labels: list[int], frames: int) -> None:
        super().__init__(labels, frames)
        self.files = [str(f) for f in files]

    def __getitem__(self, unit: int) -> dict[str, Any]:
        return self.decode(open(self.files[unit // CLIPS_PER_ITEM], "rb", buffering=0), unit)


class TorchCodecFileClips(FileClips):
    """Decodes the clip from the MP4 file on disk with TorchCodec's ``VideoDecoder`` (resized by it)."""

    def __getitem__(self, unit: int) -> dict[str, Any]:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.transforms import Resize

        decoder = VideoDecoder(
            self.files[unit // CLIPS_PER_ITEM], num_ffmpeg_threads=1, transforms=[Resize(size=list(OUT_SIZE))]
        )
        count = decoder.metadata.num_frames
        offsets = np.arange(self.frames) * FRAME_STEP
        first = int(self.fraction(unit) * (count - int(offsets[-1]) - 1))
        batch = decoder.get_frames_at(indices=(first + offsets).tolist())
        return self.item(unit, batch.data, batch.pts_seconds.double())


def torchcodec_error(path: Path) -> str | None:
    """None when TorchCodec's ``VideoDecoder`` decodes ``path`` here, else its error's telling lines."""
    try:
        from torchcodec.decoders import VideoDecoder

        VideoDecoder(str(path)).get_frame_at(0)
    except Exception as error:  # noqa: BLE001 - any failure means: not measurable here
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        telling = [lines[0]] + [line for line in lines if line.startswith(("OSError: lib", "FFmpeg version"))]
        return f"{type(error).__name__}: " + " / ".join(dict.fromkeys(telling))
    return None


def plain_loader(dataset: ClipItems, workers: int) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=ARGS.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
        multiprocessing_context="forkserver" if workers else None,
    )


@dataclass
class Lance:
    """This package's loader over one video set (RowShuffle, the remote cache off)."""

    dm: LanceDataModule
    loader: Any

    @classmethod
    def build(
        cls,
        uri: str,
        workers: int,
        options: dict[str, str] | None = None,
        reader_threads: int | None = None,
        seed: int = 0,
    ) -> Lance:
        if workers == 0:
            close_decoders()  # every configuration starts with nothing open in this process
        dm = LanceDataModule(
            train=LanceSource(uri, columns=["id", "video", "label"], storage_options=options),
            clips=sampler(ARGS.open_files, seed),
            batch_size=ARGS.batch_size,
            shuffle=RowShuffle(seed=0),
            num_workers=workers,
            reader_threads=reader_threads,
            remote_cache=RemoteCache(enabled=False),
        )
        dm.setup("fit")
        return cls(dm, dm.train_dataloader())

    def io(self) -> tuple[float, float]:
        totals = self.loader.metrics_snapshot().totals
        return float(totals.get("io_bytes", 0.0)), float(totals.get("io_requests", 0.0))

    def stages(self) -> tuple[float, float]:
        """Cumulative seconds of the loader's ``read`` (storage) and ``decode`` stages, summed over its threads."""
        totals = self.loader.metrics_snapshot().totals
        return float(totals.get("read_seconds", 0.0)), float(totals.get("decode_seconds", 0.0))

    def close(self) -> None:
        self.dm.teardown("fit")


def epoch(loader: Any) -> int:
    """Read one epoch; the clips it delivered (every batch's video is ``uint8 [B, T, 3, H, W]``)."""
    clips = 0
    for batch in loader:
        video = batch["video"]
        assert video.dtype == torch.uint8 and tuple(video.shape[1:]) == (ARGS.frames, 3, *OUT_SIZE), video.shape
        clips += len(video)
    return clips


@dataclass
class Phase:
    """An epoch, or several, of one reader: clips, seconds, bytes and requests."""

    clips: int
    seconds: float
    bytes: float = float("nan")
    requests: float = float("nan")

    @property
    def rate(self) -> float:
        return self.clips / self.seconds

    def per_clip(self) -> tuple[float, float]:
        return self.bytes / self.clips, self.requests / self.clips


def timed_epochs(loader: Any, meter: Meter | None, min_seconds: float) -> Phase:
    """Whole epochs of ``loader`` until ``min_seconds`` passed, with ``meter``'s (bytes, requests) delta."""
    before = meter() if meter else (float("nan"),) * 2
    clips, started = 0, time.perf_counter()
    while True:
        clips += epoch(loader)
        seconds = time.perf_counter() - started
        if seconds >= min_seconds:
            break
    after = meter() if meter else (float("nan"),) * 2
    return Phase(clips, seconds, after[0] - before[0], after[1] - before[1])


def shutdown(loader: Any) -> None:
    """Stop a plain DataLoader's persistent workers now."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
