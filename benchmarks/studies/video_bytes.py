"""Sections 1 (S3 rows) and 2 of the video benchmark: bytes, requests and time per clip.

Guarantees:
- `clip_costs`/`costs_section`: one clip decoded the loader's way (``take_blobs`` + `open_video` +
  `decode_video_clip`) outside the loader, cold and warm, per ``lance.BlobFile`` read-ahead of
  `BUFFER_SIZES`; bytes and requests from the given `Meter` (Lance's I/O statistics locally, the
  proxy's count on S3).
- `decode_split`: a clip's decode against decoding its frames only and against two ways of
  converting them, alternated clip by clip over the rounds; medians in ms.
- `s3_section`: the sets written to a moto S3 server on loopback behind `FaultProxy` adding
  ``--latency-ms`` per request; epochs of this loader and of the whole-blob baseline counted by
  the proxy (every process at once, setup excluded).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np

from benchmarks.studies.video_data import ARGS, BUFFER_SIZES, FRAME_STEP, KIB, OUT_SIZE, Data, log, write_lance
from benchmarks.studies.video_readers import (
    Lance,
    Meter,
    MeteredFile,
    Phase,
    WholeBlobClips,
    epoch,
    plain_loader,
    proxy_meter,
    shutdown,
)
from lance_lightning.media.containers import decode_from, open_video
from lance_lightning.media.video import decode_video_clip


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
