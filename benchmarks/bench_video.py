"""Video clips benchmark: bytes and requests per clip, clips/s against two plain-DataLoader
baselines, and resident memory over many epochs, for `LanceDataModule(clips=VideoClips(...))`.

Guarantees:
- Every figure of one result file comes from one run of this script, on data it writes once under
  ``--cache-dir`` (the same MP4 bytes as files on disk and as a Lance blob column); comparisons
  are ratios within that run (the machines are shared and noisy).
- Every reader decodes the same clip: ``--frames`` (16) frames every 2nd frame, resized to
  112x112, a random start in the ``k``-th of 2 equal parts of the video for clip ``k`` of 2 per
  video, videos in a shuffled order; the baselines decode with the package's own PyAV functions
  (`open_video`, `decode_video_clip`), so they differ from the loader only in how the bytes reach
  the decoder and in what is kept open.
- Bytes and requests are counted where they happen: Lance's I/O statistics
  (``io_stats_incremental``, the loader's ``io_bytes``/``io_requests`` metrics), the S3 proxy's
  own count of requests and GET body bytes (every process at once), and `CountingFile` for files on disk
  and for what PyAV itself asks for.
- ``--quick`` runs every section on tiny data (0 workers) in under a minute and never writes
  ``results/video.md`` (its default ``--out`` is under the cache folder).

Sections of the result file:

1. **Bytes per clip**, short (2 s) and long (60 s) videos, local and from an S3 server on loopback
   (moto) behind `tests.fault_proxy.FaultProxy` adding ``--latency-ms`` (20) to every request:
   this loader's first and next epoch, against the whole video's bytes and the clip's own share
   of the file (file bytes x clip frames / video frames), and the whole blob read per clip.
2. **Where a clip's bytes and time go**: one clip decoded the loader's way (``take_blobs``,
   `open_video`, `decode_video_clip`) outside the loader, cold (the video opened for it) and warm
   (its container kept open), with ``lance.BlobFile`` read-aheads of 512 KiB (``take_blobs``'
   default), 64 KiB, none, and the loader's own: bytes, requests, I/O and decode time; and a
   clip's decode split into decoding frames and converting them.
3. **Clips/s**, local: this loader at ``num_workers`` 0 and 2 against a plain ``DataLoader`` over a
   map-style dataset that reads the whole blob per clip (``read_blobs``) and decodes it from
   ``BytesIO``, and a plain ``DataLoader`` over the MP4 files on disk (TorchCodec where its video
   decoder works here, else PyAV over the files, with TorchCodec's error stated); at 0 workers
   also this loader with ``reader_threads=0``, and a what-if row: this loader with PyAV's
   ``VideoFrame.reformat`` patched, in this process and for that row only, to convert on one thread.
4. **Resident memory** of this loader over ``--memory-epochs`` (20) epochs over more videos than
   ``open_files``: RSS of the process and its workers after each epoch.

Usage (from the repository root)::

    uv run python benchmarks/bench_video.py           # full run (~8 minutes on 2 loaded cores)
    uv run python benchmarks/bench_video.py --quick   # smoke run (< 1 minute)

Writes ``benchmarks/results/video.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `common`, `lance_lightning` and `tests.*` from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import common  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from lance_lightning import LanceDataModule, LanceSource, RemoteCache, RowShuffle, VideoClips  # noqa: E402
from lance_lightning.media.containers import CountingFile, decode_from, open_video  # noqa: E402
from lance_lightning.media.decoders import clip_decoder, close_decoders, torchcodec_state  # noqa: E402
from lance_lightning.media.synthetic import encode_video, moving_shapes  # noqa: E402
from lance_lightning.media.video import decode_video_clip  # noqa: E402

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


# -- section 1 and 3: the loader and the baselines ---------------------------------------------
@dataclass
class Speed:
    """Per (set, workers, reader): clips/s of every round and bytes/requests per clip."""

    rates: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    ratios: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    per_clip: dict[tuple[str, int, str], tuple[float, float]] = field(default_factory=dict)
    first: dict[tuple[str, int, str], Phase] = field(default_factory=dict)
    #: This loader's (read, decode) ms per clip from its own metrics, each round.
    stages: dict[tuple[str, int, str], list[tuple[float, float]]] = field(default_factory=dict)


@dataclass
class Reader:
    """One reader of section 3, built once: its loader, how its bytes are counted, how it stops."""

    kind: str
    loader: Any
    meter: Meter | None
    close: Callable[[], None]
    stages: Callable[[], tuple[float, float]] | None = None
    #: Entered around each of this reader's epochs (the what-if row's patch), else nothing.
    around: Callable[[], Any] = contextlib.nullcontext


@contextlib.contextmanager
def reformat_one_thread() -> Iterator[None]:
    """While inside: PyAV's ``VideoFrame.reformat`` converts on one thread (``threads=1``) unless told
    otherwise. The what-if row of section 3: the suggested fix, without changing the package."""
    from av.video.frame import VideoFrame

    original = VideoFrame.reformat

    def reformat(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("threads", 1)
        return original(self, *args, **kwargs)

    VideoFrame.reformat = reformat
    try:
        yield
    finally:
        VideoFrame.reformat = original


def build_reader(kind: str, data: Data, workers: int) -> Reader:
    """Reader ``kind`` over ``data`` (local); bytes are counted where this process can see them."""
    if kind.startswith("lance"):
        t0, fix = kind == "lance-t0", kind == "lance-fix"
        seed = 1 if t0 else 2 if fix else 0  # separate pools of open videos in one process
        lance_reader = Lance.build(data.uri, workers, reader_threads=0 if t0 else None, seed=seed)
        around = reformat_one_thread if fix else contextlib.nullcontext
        return Reader(kind, lance_reader.loader, lance_reader.io, lance_reader.close, lance_reader.stages, around)
    meter: Meter | None = None
    if kind == "whole":
        dataset: ClipItems = WholeBlobClips(data.uri, data.labels, ARGS.frames, None)
        if workers == 0:
            meter = lance_meter(dataset.dataset())
    elif kind == "files":
        dataset = FileClips(data.files, data.labels, ARGS.frames)
        if workers == 0:
            meter = lambda: (float(dataset.bytes_read), float(dataset.read_calls))  # noqa: E731
    else:
        dataset = TorchCodecFileClips(data.files, data.labels, ARGS.frames)
    loader = plain_loader(dataset, workers)
    return Reader(kind, loader, meter, lambda: shutdown(loader))


def measured_epoch(reader: Reader) -> Phase:
    before = reader.meter() if reader.meter else (float("nan"),) * 2
    started = time.perf_counter()
    with reader.around():
        clips = epoch(reader.loader)
    seconds = time.perf_counter() - started
    after = reader.meter() if reader.meter else (float("nan"),) * 2
    return Phase(clips, seconds, after[0] - before[0], after[1] - before[1])


def speed_section(sets: list[Data], files_kind: str) -> Speed:
    """Section 3 (and section 1's local rows): per set and worker count, every reader built once and
    read one epoch (its first), then ``--rounds`` rounds of timed epochs, the order reversed each round."""
    result = Speed()
    for data in sets:
        for workers in ARGS.workers:
            kinds = ["lance", "whole", files_kind] + (["lance-t0", "lance-fix"] if workers == 0 else [])
            readers: list[Reader] = []
            try:
                for kind in kinds:
                    readers.append(build_reader(kind, data, workers))
                    first = measured_epoch(readers[-1])
                    result.first[(data.spec.name, workers, kind)] = first
                    log(f"[speed] {data.spec.name:5} workers {workers} {kind:8} first epoch {first.rate:7.1f} clips/s")
                for rnd in range(ARGS.rounds):
                    rates: dict[str, float] = {}
                    for reader in readers if rnd % 2 == 0 else readers[::-1]:
                        stages = reader.stages() if reader.stages else None
                        with reader.around():
                            timed = timed_epochs(reader.loader, reader.meter, ARGS.min_seconds)
                        key = (data.spec.name, workers, reader.kind)
                        if reader.stages and stages:
                            read, decode = (1e3 * (b - a) / timed.clips for a, b in zip(stages, reader.stages()))
                            result.stages.setdefault(key, []).append((read, decode))
                        rates[reader.kind] = timed.rate
                        result.rates.setdefault(key, []).append(timed.rate)
                        result.per_clip.setdefault(key, timed.per_clip())
                        log(
                            f"[speed] round {rnd + 1} {data.spec.name:5} workers {workers} {reader.kind:8} "
                            f"{timed.rate:7.1f} clips/s ({timed.clips} clips in {timed.seconds:.1f} s), "
                            f"{timed.per_clip()[0] / KIB:,.1f} KiB/clip"
                        )
                    for kind, rate in rates.items():
                        result.ratios.setdefault((data.spec.name, workers, kind), []).append(rate / rates["lance"])
            finally:
                for reader in readers:
                    reader.close()
    return result


# -- section 2: one clip the loader's way, outside the loader ---------------------------------
@dataclass
class ClipCost:
    """Means per clip of the loader's read path with one BlobFile read-ahead (bytes, ms)."""

    take_requests: float  # ``take_blobs`` (the blob's descriptor)
    take_ms: float
    open_bytes: float  # `open_video`: the headers and the MP4 index
    open_requests: float
    cold_bytes: float  # take_blobs + open + the first clip
    cold_requests: float
    cold_ms: float
    cold_io_ms: float
    asked_cold: float  # bytes PyAV asked the file object for (open + first clip)
    warm_bytes: float  # a second clip, the container still open
    warm_requests: float
    warm_ms: float
    warm_io_ms: float
    asked_warm: float


def clip_costs(dataset: lance.LanceDataset, meter: Meter, data: Data, buffer_size: int, clips: int) -> ClipCost:
    """``clips`` videos each opened as the loader opens them (``take_blobs`` + `open_video`), a clip
    decoded from the first half (cold), then one from the second half from the same container (warm)."""
    rng = np.random.default_rng(buffer_size + 1)
    count = data.spec.videos
    rows = rng.permutation(count)[:clips] if clips <= count else rng.integers(0, count, clips)
    sums = np.zeros(14)
    now = time.perf_counter
    for row in rows.tolist():
        (b0, r0), t0 = meter(), now()
        (blob,) = dataset.take_blobs("video", indices=[row], buffer_size=buffer_size)
        t1, (b1, r1) = now(), meter()
        file = MeteredFile(blob)
        opened = open_video(file)
        b2, r2 = meter()
        decode_video_clip(opened, float(rng.random()) / 2, ARGS.frames, float(FRAME_STEP), OUT_SIZE)
        t2, (b3, r3) = now(), meter()
        io_cold, asked_cold = file.io_seconds, file.bytes_read
        decode_video_clip(opened, 0.5 + float(rng.random()) / 2, ARGS.frames, float(FRAME_STEP), OUT_SIZE)
        t3, (b4, r4) = now(), meter()
        opened.close()
        sums += [
            r1 - r0,
            (t1 - t0) * 1e3,
            b2 - b1,
            r2 - r1,
            b3 - b0,
            r3 - r0,
            (t2 - t0) * 1e3,
            io_cold * 1e3,
            asked_cold,
            b4 - b3,
            r4 - r3,
            (t3 - t2) * 1e3,
            (file.io_seconds - io_cold) * 1e3,
            file.bytes_read - asked_cold,
        ]
    return ClipCost(*(sums / len(rows)).tolist())


@dataclass
class DecodeSplit:
    """Median ms per clip on an open container: the package's clip, its frames decoded without
    conversion, and the same frames with the clip's converted one thread at a time (``threads=1``)
    or by one reused ``VideoReformatter``."""

    clip_ms: float
    frames_ms: float
    one_thread_ms: float
    shared_ms: float
    decoded: float  # frames decoded per clip (from the keyframe before the clip to its last frame)


def decode_split(data: Data, clips: int, rounds: int = 7) -> DecodeSplit:
    """`decode_video_clip` against decoding the same frames only, and against converting the clip's
    frames with ``frame.reformat(..., threads=1)`` or one reused ``VideoReformatter``, alternated
    over ``rounds`` on one open MP4 file. ``frame.reformat`` gives every new frame a new
    ``VideoReformatter`` (a new swscale context), with ``threads=0`` (one thread per core) by default."""
    from av.video.reformatter import VideoReformatter

    opened = open_video(open(data.files[0], "rb"))
    fractions = np.random.default_rng(0).random(clips)
    span = (ARGS.frames - 1) * FRAME_STEP
    reformatter = VideoReformatter()
    height, width = OUT_SIZE
    convert: dict[str, Callable[[Any], Any] | None] = {
        "frames": None,
        "one_thread": lambda frame: frame.reformat(width=width, height=height, format="rgb24", threads=1),
        "shared": lambda frame: reformatter.reformat(frame, width=width, height=height, format="rgb24"),
    }
    times: dict[str, list[float]] = {"clip": [], **{name: [] for name in convert}}
    decoded = 0.0

    def frames_only(fraction: float, conversion: Callable[[Any], Any] | None) -> int:
        count = 0
        first = int(fraction * (opened.frames - span - 1))
        wanted = set(range(first, first + span + 1, FRAME_STEP))
        for frame in decode_from(opened, (first - 0.5) / opened.fps):
            count += 1
            index = round((frame.time - opened.start_time) * opened.fps)
            if conversion is not None and index in wanted:
                conversion(frame).to_ndarray()
            if index >= first + span:
                break
        return count

    names = list(times)
    try:
        for rnd in range(rounds):  # clip by clip, the variants in turn (a burst of load hits them alike)
            for number, fraction in enumerate(fractions.tolist()):
                shift = (rnd + number) % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    if name == "clip":
                        decode_video_clip(opened, fraction, ARGS.frames, float(FRAME_STEP), OUT_SIZE)
                    else:
                        decoded += frames_only(fraction, convert[name])
                    times[name].append((time.perf_counter() - started) * 1e3)
    finally:
        opened.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    decoded /= rounds * clips * (len(names) - 1)
    return DecodeSplit(median["clip"], median["frames"], median["one_thread"], median["shared"], decoded)


def costs_section(data: Data, where: str, dataset: lance.LanceDataset, meter: Meter) -> list[tuple[int, ClipCost]]:
    out = []
    for size in BUFFER_SIZES:
        cost = clip_costs(dataset, meter, data, size, ARGS.cost_clips)
        out.append((size, cost))
        log(
            f"[cost] {data.spec.name:5} {where:5} read-ahead {size // KIB:>3} KiB: take_blobs {cost.take_requests:.1f} req "
            f"{cost.take_ms:.1f} ms, open {cost.open_bytes / KIB:,.1f} KiB {cost.open_requests:.1f} req; cold {cost.cold_bytes / KIB:,.1f} KiB "
            f"{cost.cold_requests:.1f} req {cost.cold_ms:.1f} ms (I/O {cost.cold_io_ms:.1f}); warm "
            f"{cost.warm_bytes / KIB:,.1f} KiB {cost.warm_requests:.1f} req {cost.warm_ms:.1f} ms; PyAV asked "
            f"{cost.asked_cold / KIB:,.1f} + {cost.asked_warm / KIB:,.1f} KiB"
        )
    return out


# -- section 1, S3 ------------------------------------------------------------------------------
@dataclass
class S3Rows:
    loader: dict[tuple[str, int], tuple[Phase, ...]] = field(default_factory=dict)
    whole: dict[tuple[str, int], tuple[Phase, ...]] = field(default_factory=dict)
    costs: dict[str, list[tuple[int, ClipCost]]] = field(default_factory=dict)


def s3_section(sets: list[Data]) -> S3Rows:
    from tests.fault_proxy import FaultProxy
    from tests.s3_server import S3Server

    out = S3Rows()
    with S3Server.serving("bench") as s3, FaultProxy.serving(s3.endpoint, ARGS.latency_ms / 1e3) as proxy:
        options = {**s3.storage_options(), "aws_endpoint": proxy.endpoint}
        meter = proxy_meter(proxy)
        for data in sets:
            uri = f"s3://bench/{data.spec.key}.lance"
            write_lance(
                uri,
                [p.read_bytes() for p in data.files],
                data.labels,
                data.spec.rows_per_file,
                storage_options=s3.storage_options(),
            )
            for workers in s3_workers(data):
                out.loader[(data.spec.name, workers)] = s3_epochs("lance", data, workers, options, meter, 2)
            # Bytes and requests per clip of the whole-blob reader do not depend on workers or epochs: one epoch, in process.
            out.whole[(data.spec.name, 0)] = s3_epochs("whole", data, 0, options, meter, 1)
            dataset = lance.dataset(uri, storage_options=options)
            dataset.take_blobs("video", indices=[0])  # the manifest and the file's metadata: not per clip
            out.costs[data.spec.name] = costs_section(data, "S3", dataset, meter)
    return out


def s3_workers(data: Data) -> list[int]:
    """Worker counts of the S3 loader rows: all for the long set, 0 for the short one (its worker
    start costs more than its epochs; per-clip bytes do not depend on workers but for per-worker pools)."""
    if data is ARGS.sets[-1] or 0 not in ARGS.workers:
        return ARGS.workers
    return [0]


def s3_epochs(
    kind: str, data: Data, workers: int, options: dict[str, str], meter: Meter, epochs: int
) -> tuple[Phase, ...]:
    """``epochs`` epochs of one reader from the store, counted by the proxy (setup excluded)."""
    if kind == "lance":
        reader = Lance.build(f"s3://bench/{data.spec.key}.lance", workers, options)
        loader, close = reader.loader, reader.close
    else:
        dataset = WholeBlobClips(f"s3://bench/{data.spec.key}.lance", data.labels, ARGS.frames, options)
        loader = plain_loader(dataset, workers)
        close = lambda: shutdown(loader)  # noqa: E731
    try:
        phases = []
        for _ in range(epochs):
            b0, r0 = meter()
            started = time.perf_counter()
            clips = epoch(loader)
            b1, r1 = meter()
            phases.append(Phase(clips, time.perf_counter() - started, b1 - b0, r1 - r0))
        for number, phase in enumerate(phases):
            log(
                f"[s3] {data.spec.name:5} workers {workers} {kind:5} epoch {number}: {phase.rate:.1f} clips/s, "
                f"{phase.per_clip()[0] / KIB:,.1f} KiB and {phase.per_clip()[1]:.1f} requests per clip"
            )
        return tuple(phases)
    finally:
        close()


# -- section 4: memory --------------------------------------------------------------------------
def rss_total() -> float:
    """Resident memory of this process and every descendant (DataLoader workers, forkserver), MiB."""
    import psutil

    process = psutil.Process()
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


@dataclass
class MemoryRun:
    name: str
    workers: int
    videos: int
    rss: list[float]
    open_after: int | None
    seconds: float


def memory_section(sets: list[Data]) -> list[MemoryRun]:
    runs = []
    data = sets[1]  # more videos than open_files
    for workers in ARGS.workers:
        reader = Lance.build(data.uri, workers)
        rss, started = [], time.perf_counter()
        try:
            for _ in range(ARGS.memory_epochs):
                epoch(reader.loader)
                rss.append(rss_total())
            pool = len(clip_decoder(sampler(ARGS.open_files)).pool) if workers == 0 else None
        finally:
            reader.close()
        run = MemoryRun(data.spec.name, workers, data.spec.videos, rss, pool, time.perf_counter() - started)
        runs.append(run)
        log(
            f"[memory] {data.spec.name} workers {workers}: RSS after each epoch "
            + " ".join(f"{v:.0f}" for v in rss)
            + f" MiB; containers open: {pool}"
        )
    return runs


# -- the result file ---------------------------------------------------------------------------
def code_state() -> str:
    """The commit measured, and the package's media and read files changed in the working tree."""
    import subprocess

    root = HERE.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "lance_lightning/media", "lance_lightning/read"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "not a git checkout"
    if head.returncode != 0:
        return "a copy of the package outside git (the command says which commit)"
    changed = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    return f"commit {head.stdout.strip() or '?'}" + (
        f", with uncommitted changes to {', '.join(changed)}"
        if changed
        else ", no uncommitted changes to the read path"
    )


def kib(value: float) -> str:
    return "—" if value != value else f"{value / KIB:,.1f}"


def num(value: float, digits: int = 1) -> str:
    return "—" if value != value else f"{value:,.{digits}f}"


def bytes_table(sets: list[Data], speed: Speed, s3: S3Rows) -> list[str]:
    lines = [
        "| videos | where | reader | workers | clips/s | KiB per clip | requests per clip | × whole video "
        "| × clip's share |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for data in sets:
        name = data.spec.name
        whole, share = data.whole, data.share(ARGS.frames)

        def row(where: str, reader: str, workers: int, phase: Phase, bytes_per_clip: float, requests: float) -> None:
            lines.append(
                f"| {name} | {where} | {reader} | {workers} | {num(phase.rate)} | {kib(bytes_per_clip)} "
                f"| {num(requests)} | {num(bytes_per_clip / whole, 2)} | {num(bytes_per_clip / share, 1)} |"
            )

        for workers in ARGS.workers:
            first = speed.first[(name, workers, "lance")]
            row("local", "this loader, first epoch", workers, first, *first.per_clip())
            key = (name, workers, "lance")
            steady = Phase(1, 1 / statistics.median(speed.rates[key]))
            row("local", "this loader, later epochs", workers, steady, *speed.per_clip[key])
        key = (name, 0, "whole")
        row(
            "local",
            "whole blob per clip (`read_blobs`)",
            0,
            Phase(1, 1 / statistics.median(speed.rates[key])),
            *speed.per_clip[key],
        )
        for kind, label in (
            ("files", "MP4 file on disk, PyAV (unbuffered file)"),
            ("torchcodec", "MP4 file on disk, TorchCodec"),
        ):
            if (name, 0, kind) in speed.per_clip:  # TorchCodec's own reads are not counted
                median = statistics.median(speed.rates[(name, 0, kind)])
                row("local", label, 0, Phase(1, 1 / median), *speed.per_clip[(name, 0, kind)])
        for workers in s3_workers(data):
            cold, warm = s3.loader[(name, workers)]
            row("S3 +20 ms", "this loader, epoch 0", workers, cold, *cold.per_clip())
            row("S3 +20 ms", "this loader, epoch 1", workers, warm, *warm.per_clip())
        (whole_s3,) = s3.whole[(name, 0)]
        row("S3 +20 ms", "whole blob per clip (`read_blobs`)", 0, whole_s3, *whole_s3.per_clip())
    return lines


def costs_table(sets: list[Data], local: dict[str, list[tuple[int, ClipCost]]], s3: S3Rows) -> list[str]:
    lines = [
        "| videos | where | BlobFile read-ahead | `take_blobs`: requests / ms | `open_video`: KiB / requests "
        "| cold clip: KiB / requests / ms (I/O ms) | warm clip: KiB / requests / ms (I/O ms) "
        "| PyAV asked, cold + warm (KiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for data in sets:
        for where, costs in (("local", local[data.spec.name]), ("S3 +20 ms", s3.costs[data.spec.name])):
            for size, c in costs:
                label = f"{size // KIB} KiB" + (" (the loader's)" if size == loader_read_ahead() else "")
                label += " (Lance's default)" if size == LANCE_READ_AHEAD else ""
                lines.append(
                    f"| {data.spec.name} | {where} | {label} | {c.take_requests:.1f} / {c.take_ms:.1f} "
                    f"| {kib(c.open_bytes)} / {c.open_requests:.1f} "
                    f"| {kib(c.cold_bytes)} / {c.cold_requests:.1f} / {c.cold_ms:.1f} ({c.cold_io_ms:.1f}) "
                    f"| {kib(c.warm_bytes)} / {c.warm_requests:.1f} / {c.warm_ms:.1f} ({c.warm_io_ms:.1f}) "
                    f"| {kib(c.asked_cold)} + {kib(c.asked_warm)} |"
                )
    return lines


def split_table(splits: dict[str, DecodeSplit]) -> list[str]:
    lines = [
        "| videos | clip (`decode_video_clip`) ms | decoding its frames only ms | conversion, resize, copy ms "
        "(the difference) | frames + the clip's converted with `threads=1` ms | frames + the clip's converted "
        "by one reused `VideoReformatter` ms | frames decoded per clip |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, split in splits.items():
        lines.append(
            f"| {name} | {split.clip_ms:.1f} | {split.frames_ms:.1f} | {split.clip_ms - split.frames_ms:.1f} "
            f"| {split.one_thread_ms:.1f} | {split.shared_ms:.1f} | {split.decoded:.0f} |"
        )
    return lines


READERS = {
    "lance": "this loader (`LanceDataModule(clips=VideoClips(...))`, reader_threads default)",
    "lance-t0": "this loader, `reader_threads=0` (one thread, like the plain DataLoader at 0 workers)",
    "lance-fix": "what-if: this loader with PyAV's `VideoFrame.reformat` defaulting to `threads=1` (patched in "
    "this process for this row only: the suggested fix)",
    "whole": "plain DataLoader: whole blob per clip (`read_blobs`) + PyAV from BytesIO",
    "files": "plain DataLoader: MP4 files on disk + PyAV (TorchCodec cannot run here, see below)",
    "torchcodec": "plain DataLoader: MP4 files on disk + TorchCodec `VideoDecoder`",
}


def speed_table(sets: list[Data], speed: Speed, files_kind: str) -> list[str]:
    lines = [
        "| videos | workers | reader | clips/s (median) | × this loader (median of rounds) | KiB per clip | "
        "first epoch clips/s | read / decode ms per clip (the loader's metrics) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for data in sets:
        for workers in ARGS.workers:
            for kind in ["lance", "lance-t0", "lance-fix", "whole", files_kind]:
                key = (data.spec.name, workers, kind)
                if key not in speed.rates:
                    continue
                lines.append(
                    f"| {data.spec.name} | {workers} | {READERS[kind]} | {statistics.median(speed.rates[key]):,.1f} "
                    f"| {statistics.median(speed.ratios[key]):.2f} | {kib(speed.per_clip[key][0])} "
                    f"| {speed.first[key].rate:,.1f} | {stage_ms(speed, key)} |"
                )
    return lines


def stage_ms(speed: Speed, key: tuple[str, int, str]) -> str:
    values = speed.stages.get(key)
    if not values:
        return "—"
    return f"{statistics.median(r for r, _ in values):.1f} / {statistics.median(d for _, d in values):.1f}"


def memory_table(runs: list[MemoryRun]) -> list[str]:
    lines = [
        "| videos | workers | epochs | RSS after epoch 1 / 2 / last (MiB) | max after epoch ≥ 2 (MiB) "
        "| last / epoch 2 | containers open at the end (main process) | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        second = run.rss[1] if len(run.rss) > 1 else run.rss[0]
        lines.append(
            f"| {run.name} ({run.videos}) | {run.workers} | {len(run.rss)} | {run.rss[0]:.0f} / {second:.0f} / "
            f"{run.rss[-1]:.0f} | {max(run.rss[1:] or run.rss):.0f} | {run.rss[-1] / second:.3f} "
            f"| {'—' if run.open_after is None else run.open_after} | {run.seconds:.0f} |"
        )
    return lines


def summary(
    sets: list[Data],
    speed: Speed,
    s3: S3Rows,
    local: dict[str, list[tuple[int, ClipCost]]],
    splits: dict[str, DecodeSplit],
    files_kind: str,
) -> list[str]:
    """Sentences computed from this run's figures."""
    lines = []
    for data in sets:
        name, whole, share = data.spec.name, data.whole, data.share(ARGS.frames)
        later = speed.per_clip[(name, 0, "lance")][0]
        s3_warm = s3.loader[(name, 0)][1]
        costs = dict(local[name])
        cold = ", ".join(f"{costs[size].cold_bytes / KIB:,.1f} KiB with {size // KIB} KiB" for size in costs)
        warm = ", ".join(f"{costs[size].warm_bytes / KIB:,.1f}" for size in costs)
        asked = costs[0].asked_cold if 0 in costs else float("nan")
        lines.append(
            f"- **{name}** ({data.spec.frames} frames, {whole / KIB:,.1f} KiB a video, the clip's share "
            f"{share / KIB:,.1f} KiB): this loader read {later / KIB:,.1f} KiB per clip locally in later epochs at 0 "
            f"workers ({later / whole:.2f}× the whole video, {later / share:.1f}× the clip's share), and "
            f"{s3_warm.per_clip()[0] / KIB:,.1f} KiB in {s3_warm.per_clip()[1]:.1f} requests per clip from S3 in epoch 1. "
            f"Outside the loader a cold clip (open + clip) read {cold} of read-ahead (PyAV itself asked for "
            f"{asked / KIB:,.1f} KiB); a warm clip {warm} KiB in the same order."
        )
        for workers in ARGS.workers:
            ratios = [
                f"{label} {statistics.median(speed.ratios[(name, workers, kind)]):.2f}×"
                for kind, label in (
                    ("lance-t0", "this loader with `reader_threads=0`"),
                    ("lance-fix", "this loader converting frames on one thread (what-if)"),
                    ("whole", "whole blob per clip"),
                    (files_kind, "MP4 files on disk"),
                )
                if (name, workers, kind) in speed.ratios
            ]
            lines.append(f"  - clips/s against this loader's at {workers} workers: {', '.join(ratios)}.")
        split = splits[name]
        lines.append(
            f"  - a clip's decode: {split.clip_ms:.1f} ms, of which {split.clip_ms - split.frames_ms:.1f} ms "
            f"({(split.clip_ms - split.frames_ms) / split.clip_ms:.0%}) converting and resizing its {ARGS.frames} "
            f"frames; converting them with `threads=1` the same clip took {split.one_thread_ms:.1f} ms, with one reused "
            f"`VideoReformatter` {split.shared_ms:.1f} ms."
        )
    return lines


NOTES = [
    "## Notes",
    "",
    "- S3 here is moto (`tests/s3_server.py`), which reads the whole object for each ranged GET (`benchmarks/probes/probe_store_rate.py`): its milliseconds per request include that on top of the proxy's added latency. Bytes and request counts are exact.",
    "- The first epoch at 2 workers includes starting the workers (`forkserver`); later epochs are what a training run sees.",
    "- The least a clip can cost through this read path is what PyAV asks for: from the keyframe before the clip (up to one GOP earlier) to the clip's last frame, in 16 KiB AVIO reads, plus the MP4 index (`moov`, read when the video is opened) unless the video is kept open. The clip's own share is a reference, not a reachable target.",
    "- The baselines keep nothing open: the files baseline reads what PyAV asks for, the whole-blob baseline the whole video. This loader keeps `open_files` videos open per process; with more videos than that (both sets here) under a row shuffle, many clips reopen their video (its `take_blobs`, headers and index).",
    "",
]


def write(
    sets: list[Data],
    speed: Speed,
    s3: S3Rows,
    local: dict,
    splits: dict[str, DecodeSplit],
    memory: list[MemoryRun],
    files_kind: str,
    tc_error: str | None,
    elapsed: float,
    load_start: str,
) -> str:
    kind = "QUICK smoke run (tiny data; not the reference figures)" if ARGS.quick else "full run"
    sets_line = "; ".join(
        f"**{d.spec.name}**: {d.spec.videos} videos of {d.spec.frames} frames ({d.spec.frames / FPS:g} s), "
        f"{d.whole / KIB:,.1f} KiB each on average, {d.spec.rows_per_file} rows per Lance data file"
        for d in sets
    )
    lines = [
        "# Video clips: bytes per clip, clips/s, resident memory",
        "",
        f"{kind}, {common.stamp()}, {elapsed:.0f} s. Machine: {common.machine()}, PyAV "
        f"{__import__('av').__version__}; a shared 2-core VM (load average {load_start} at the start, "
        f"{common.load_average()} at the end): absolute clips/s move from minute to minute, the ratios of "
        "one run are what to compare.",
        "",
        f"Command: `{common.command_line()}`",
        "",
        f"Code: {code_state()}. The loader opens each video blob with a `lance.BlobFile` read-ahead of "
        f"{loader_read_ahead() // KIB} KiB.",
        "",
        f"Data: synthetic `moving_shapes` videos, H.264 in MP4 (`encode_video`: yuv420p, {SIDE}x{SIDE}, {FPS} fps, "
        f"a keyframe every {sets[0].spec.gop} frames, `moov` at the end), the same bytes as MP4 files on disk and "
        f"as a Lance blob column (`lance-encoding:blob`): {sets_line}.",
        "",
        f"Clip: {ARGS.frames} frames every {FRAME_STEP}nd frame (a span of {(ARGS.frames - 1) * FRAME_STEP + 1} "
        f"frames), resized to {OUT_SIZE[0]}x{OUT_SIZE[1]}, {CLIPS_PER_ITEM} clips per video per epoch at random "
        f"starts, batches of {ARGS.batch_size}, videos in shuffled order (`RowShuffle(seed=0)`; the baselines "
        "`shuffle=True`). This loader: `VideoClips(frames=..., frame_step=2, clips_per_item=2, size=[112, 112], "
        f"starts='random', open_files={ARGS.open_files})`, the remote cache off. The baselines decode with the "
        "package's `open_video` + `decode_video_clip` (the same PyAV code), open the video for every clip and keep "
        "nothing open; DataLoader workers start with `forkserver`, persistent.",
        "",
        "## 1. Bytes per clip",
        "",
        "× whole video = bytes per clip / the mean video's bytes; × clip's share = bytes per clip / (the video's "
        f"bytes × {ARGS.frames} / its frames). Local bytes and requests: Lance's I/O statistics (the loader's "
        "`io_bytes`/`io_requests` metrics; `io_stats_incremental` of the baseline's handle, at 0 workers only). "
        f"S3: moto on loopback behind a proxy adding {ARGS.latency_ms:g} ms to every request, which counts the "
        "requests (every method) and GET body bytes of every process (data-module setup excluded); S3 at 2 workers "
        "for the long videos only (starting workers costs more than the short set's epochs). Later epochs: the "
        "section 3 epochs "
        "(the first round's).",
        "",
        *bytes_table(sets, speed, s3),
        "",
        "## 2. Where a clip's bytes and time go (the loader's read path, outside the loader)",
        "",
        f"For {ARGS.cost_clips} videos of each set: `take_blobs(..., buffer_size=B)` + `open_video` (open), one "
        "clip decoded from the first half (cold clip = open + that clip), then a second clip from the second "
        "half with the container still open (warm clip: what a video kept open by the loader's pool costs). "
        "Bytes and requests: Lance's I/O statistics locally, the proxy's count on S3. I/O ms: time inside the "
        "file object's `read`/`seek` (the rest of a clip's time is PyAV's demuxing, decoding and resizing). "
        "PyAV asked: the bytes PyAV's 16 KiB AVIO buffer read from the file object (`CountingFile`), the least "
        "this read path can fetch.",
        "",
        *costs_table(sets, local, s3),
        "",
        f"Decoding alone (one local MP4 file, container open, {ARGS.cost_clips} clips at random starts, 7 rounds, "
        "the variants in turn clip by clip; median ms per clip): the package's clip against decoding the same frames without converting them, and "
        "against converting the clip's frames with `frame.reformat(..., threads=1)` or with one "
        "`av.video.reformatter.VideoReformatter` reused for every frame (same pixels). `decode_video_clip` calls "
        "`frame.reformat(width=..., height=..., format='rgb24')`: PyAV gives every new frame a new "
        "`VideoReformatter`, so each converted frame builds a new swscale context, with `threads=0` (PyAV's "
        "default: one thread per core), i.e. a thread pool started and joined per frame.",
        "",
        *split_table(splits),
        "",
        "## 3. Clips/s, local",
        "",
        f"Each reader is built, reads one epoch (first epoch: worker start and opening included), then whole "
        f"epochs for at least {ARGS.min_seconds:g} s (timed); {ARGS.rounds} round(s), the readers' order reversed "
        "every other round; clips/s is the median of the rounds and × this loader the median of the per-round "
        "ratios to this loader at the same workers. KiB per clip at 2 workers: the loader's shipped metrics; the "
        "baselines' are counted at 0 workers only. Read / decode ms per clip: the loader's `read_seconds` (storage: "
        "`take_blobs`, the blob files' reads, the other columns) and `decode_seconds` (demuxing, decoding, "
        "converting) per clip delivered, summed over its reader threads (time in a thread, waiting included).",
        "",
        *speed_table(sets, speed, files_kind),
        "",
    ]
    if tc_error is None:
        lines += ["TorchCodec's `VideoDecoder` works here: the files-on-disk baseline decodes with it.", ""]
    else:
        lines += [
            "**TorchCodec could not be measured here.** The issue asks for the files-on-disk baseline with "
            "TorchCodec; its video decoder does not load on this machine, so that baseline decodes the files with "
            f"PyAV instead. `torchcodec_state()`: {torchcodec_state()}. The error of `VideoDecoder(path)` on one "
            f"of the MP4 files: `{tc_error}`. TorchCodec's wheels do not bundle FFmpeg: it loads the system's "
            "`libavutil`/`libavcodec` (FFmpeg 4 to 8), and this machine has none (PyAV's wheels bundle their own).",
            "",
        ]
    lines += [
        "## 4. Resident memory over many epochs",
        "",
        f"This loader for {ARGS.memory_epochs} epochs (one loader, persistent workers), RSS of the process and all "
        f"its descendants (psutil) after each epoch. The bound: at most `open_files` = {ARGS.open_files} containers "
        "(PyAV demuxer + decoder + the `lance.BlobFile` with its read-ahead buffer) open per process, least "
        "recently used closed first; the sets hold more videos than that where marked. Flat: last / epoch 2 near 1.",
        "",
        *memory_table(memory),
        "",
        "## Reading the figures",
        "",
        *summary(sets, speed, s3, local, splits, files_kind),
        "",
        *NOTES,
    ]
    return "\n".join(lines)


def main() -> None:
    logging.getLogger("lance_lightning").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    common.steady_allocator()
    load_start = common.load_average()
    started = time.perf_counter()
    cache = ARGS.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    sets = ARGS.sets = [video_set(cache, spec) for spec in (QUICK_SETS if ARGS.quick else FULL_SETS)]
    tc_error = torchcodec_error(sets[0].files[0])
    files_kind = "files" if tc_error else "torchcodec"
    log(f"[torchcodec] {tc_error or 'works'}")

    local: dict[str, list[tuple[int, ClipCost]]] = {}
    for data in sets:
        dataset = lance.dataset(data.uri)
        dataset.take_blobs("video", indices=[0])
        local[data.spec.name] = costs_section(data, "local", dataset, lance_meter(dataset))
    splits = {data.spec.name: decode_split(data, ARGS.cost_clips) for data in sets}
    for name, split in splits.items():
        log(
            f"[split] {name}: clip {split.clip_ms:.1f} ms, frames only {split.frames_ms:.1f} ms, converted with "
            f"threads=1 {split.one_thread_ms:.1f} ms, by one reused reformatter {split.shared_ms:.1f} ms, "
            f"{split.decoded:.0f} frames decoded"
        )
    s3 = s3_section(sets)
    speed = speed_section(sets, files_kind)
    memory = memory_section(sets)
    text = write(
        sets, speed, s3, local, splits, memory, files_kind, tc_error, time.perf_counter() - started, load_start
    )
    common.write_result(ARGS.out, text)
    print(text)
    log(f"wrote {ARGS.out}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny data, every section (< 1 minute)")
    parser.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE / "video")
    parser.add_argument("--out", type=Path, help="the result file (default results/video.md; --quick: under the cache)")
    parser.add_argument("--frames", type=int, default=16, help="frames per clip")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--open-files", type=int, help="VideoClips.open_files (default 16; --quick 4)")
    parser.add_argument("--workers", type=int, nargs="+", help="DataLoader workers (default 0 2; --quick 0)")
    parser.add_argument("--rounds", type=int, help="rounds of section 3 (default 3; --quick 1)")
    parser.add_argument("--min-seconds", type=float, help="timed epochs last at least this (default 1.5; --quick 0.1)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every S3 request")
    parser.add_argument("--cost-clips", type=int, help="videos per row of section 2 (default 12; --quick 2)")
    parser.add_argument("--memory-epochs", type=int, help="epochs of section 4 (default 20; --quick 3)")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "open_files": 4 if quick else 16,
        "workers": [0] if quick else [0, 2],
        "rounds": 1 if quick else 3,
        "min_seconds": 0.1 if quick else 1.5,
        "cost_clips": 2 if quick else 12,
        "memory_epochs": 3 if quick else 20,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:
        args.out = args.cache_dir / "video_quick.md" if quick else HERE / "results" / "video.md"
    return args


#: The parsed command line (set in the main process; worker processes use only what their datasets carry).
ARGS = argparse.Namespace()

if __name__ == "__main__":
    ARGS = parse()
    main()
