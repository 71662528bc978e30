"""Video clips benchmark: bytes and requests per clip, clips/s against two plain-DataLoader
baselines, and resident memory over many epochs, for `LanceDataModule(clips=VideoClips(...))`.

Guarantees:
- Every figure of one result file comes from one run of the ``video`` study, on data it writes once under
  the cache folder (``video/``) (the same MP4 bytes as files on disk and as a Lance blob column); comparisons
  are ratios within that run (the machines are shared and noisy).
- Every reader decodes the same clip: ``frames`` (16) frames every 2nd frame, resized to
  112x112, a random start in the ``k``-th of 2 equal parts of the video for clip ``k`` of 2 per
  video, videos in a shuffled order; the baselines decode with the package's own PyAV functions
  (`open_video`, `decode_video_clip`), so they differ from the loader only in how the bytes reach
  the decoder and in what is kept open.
- Bytes and requests are counted where they happen: Lance's I/O statistics
  (``io_stats_incremental``, the loader's ``io_bytes``/``io_requests`` metrics), the S3 proxy's
  own count of requests and GET body bytes (every process at once), and `CountingFile` for files on disk
  and for what PyAV itself asks for.
- ``--quick`` runs every section on tiny data (0 workers) in under a minute (and, as every run
  without ``--record``, writes under the cache folder, not ``results/video.md``).

Sections of the result file:

1. **Bytes per clip**, short (2 s) and long (60 s) videos, local and from an S3 server on loopback
   (moto) behind `tests.fault_proxy.FaultProxy` adding ``latency_ms`` (20) to every request:
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
4. **Resident memory** of this loader over ``memory_epochs`` (20) epochs over more videos than
   ``open_files``: RSS of the process and its workers after each epoch.

``uv run python -m benchmarks run video --record`` (~8 minutes on 2 loaded cores) writes
``benchmarks/results/video.md``; ``--quick``: < 1 minute.
"""

from __future__ import annotations

import time

import lance

from benchmarks import common
from benchmarks.harness.study import Params
from benchmarks.studies.video_bytes import ClipCost, DecodeSplit, S3Rows, costs_section, decode_split, s3_section
from benchmarks.studies.video_data import (
    ARGS,
    CLIPS_PER_ITEM,
    FPS,
    FRAME_STEP,
    FULL_SETS,
    KIB,
    OUT_SIZE,
    QUICK_SETS,
    SIDE,
    Data,
    loader_read_ahead,
    log,
    video_set,
)
from benchmarks.studies.video_readers import lance_meter, torchcodec_error
from benchmarks.studies.video_speed import MemoryRun, Speed, memory_section, speed_section
from benchmarks.studies.video_tables import (
    NOTES,
    bytes_table,
    code_state,
    costs_table,
    memory_table,
    speed_table,
    split_table,
    summary,
)
from lance_lightning.media.decoders import torchcodec_state


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
    sets_line = "; ".join(
        f"**{d.spec.name}**: {d.spec.videos} videos of {d.spec.frames} frames ({d.spec.frames / FPS:g} s), "
        f"{d.whole / KIB:,.1f} KiB each on average, {d.spec.rows_per_file} rows per Lance data file"
        for d in sets
    )
    lines = [
        f"PyAV {__import__('av').__version__}; a shared VM (load average {load_start} at the start): absolute "
        "clips/s move from minute to minute, the ratios of one run are what to compare.",
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


def measure(p: Params) -> str:
    vars(ARGS).update(p.values, quick=p.quick)  # in place: every module of the study reads this one `ARGS`
    common.steady_allocator()
    load_start = common.load_average()
    started = time.perf_counter()
    cache = p.cache / "video"
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
    return write(
        sets, speed, s3, local, splits, memory, files_kind, tc_error, time.perf_counter() - started, load_start
    )
