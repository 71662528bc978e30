"""The tables and computed sentences of the video benchmark's result file.

Guarantees:
- Every table row and sentence comes from this run's figures (the `Speed`, `S3Rows`, `ClipCost`,
  `DecodeSplit` and `MemoryRun` it is given); a figure that was not measured reads "—".
- `code_state` names the commit measured and any uncommitted change to the package's media and
  read code.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.harness import tables
from benchmarks.studies.video_bytes import ClipCost, DecodeSplit, S3Rows, s3_workers
from benchmarks.studies.video_data import ARGS, KIB, LANCE_READ_AHEAD, Data, loader_read_ahead
from benchmarks.studies.video_readers import Phase
from benchmarks.studies.video_speed import MemoryRun, Speed

HERE = Path(__file__).resolve().parent


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
    return tables.cell(value / KIB, ",.1f")


def bytes_table(sets: list[Data], speed: Speed, s3: S3Rows) -> list[str]:
    rows = []
    for data in sets:
        name = data.spec.name
        whole, share = data.whole, data.share(ARGS.frames)

        def row(where: str, reader: str, workers: int, phase: Phase, per: float, requests: float) -> None:
            rows.append((name, where, reader, workers, phase.rate, per / KIB, requests, per / whole, per / share))

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
    return tables.table(
        "videos | where | reader | workers | clips/s | KiB per clip | requests per clip | × whole video | × clip's share",
        "< < < > >,.1f >,.1f >,.1f >,.2f >,.1f",
        rows,
    )


def costs_table(sets: list[Data], local: dict[str, list[tuple[int, ClipCost]]], s3: S3Rows) -> list[str]:
    rows = []
    for data in sets:
        for where, costs in (("local", local[data.spec.name]), ("S3 +20 ms", s3.costs[data.spec.name])):
            for size, c in costs:
                label = f"{size // KIB} KiB" + (" (the loader's)" if size == loader_read_ahead() else "")
                label += " (Lance's default)" if size == LANCE_READ_AHEAD else ""
                take = f"{c.take_requests:.1f} / {c.take_ms:.1f}"
                opened = f"{kib(c.open_bytes)} / {c.open_requests:.1f}"
                cold = f"{kib(c.cold_bytes)} / {c.cold_requests:.1f} / {c.cold_ms:.1f} ({c.cold_io_ms:.1f})"
                warm = f"{kib(c.warm_bytes)} / {c.warm_requests:.1f} / {c.warm_ms:.1f} ({c.warm_io_ms:.1f})"
                asked = f"{kib(c.asked_cold)} + {kib(c.asked_warm)}"
                rows.append((data.spec.name, where, label, take, opened, cold, warm, asked))
    return tables.table(
        "videos | where | BlobFile read-ahead | `take_blobs`: requests / ms | `open_video`: KiB / requests "
        "| cold clip: KiB / requests / ms (I/O ms) | warm clip: KiB / requests / ms (I/O ms) "
        "| PyAV asked, cold + warm (KiB)",
        "< < > > > > > >",
        rows,
    )


def split_table(splits: dict[str, DecodeSplit]) -> list[str]:
    rows = [
        (name, x.clip_ms, x.frames_ms, x.clip_ms - x.frames_ms, x.one_thread_ms, x.shared_ms, x.decoded)
        for name, x in splits.items()
    ]
    return tables.table(
        "videos | clip (`decode_video_clip`) ms | decoding its frames only ms | conversion, resize, copy ms "
        "(the difference) | frames + the clip's converted with `threads=1` ms | frames + the clip's converted "
        "by one reused `VideoReformatter` ms | frames decoded per clip",
        "< >.1f >.1f >.1f >.1f >.1f >.0f",
        rows,
    )


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
    rows = []
    for data in sets:
        for workers in ARGS.workers:
            for kind in ["lance", "lance-t0", "lance-fix", "whole", files_kind]:
                key = (data.spec.name, workers, kind)
                if key not in speed.rates:
                    continue
                rate, ratio = statistics.median(speed.rates[key]), statistics.median(speed.ratios[key])
                per_clip, first = speed.per_clip[key][0] / KIB, speed.first[key].rate
                rows.append(
                    (data.spec.name, workers, READERS[kind], rate, ratio, per_clip, first, stage_ms(speed, key))
                )
    return tables.table(
        "videos | workers | reader | clips/s (median) | × this loader (median of rounds) | KiB per clip | "
        "first epoch clips/s | read / decode ms per clip (the loader's metrics)",
        "< > < >,.1f >.2f >,.1f >,.1f >",
        rows,
    )


def stage_ms(speed: Speed, key: tuple[str, int, str]) -> str:
    values = speed.stages.get(key)
    if not values:
        return "—"
    return f"{statistics.median(r for r, _ in values):.1f} / {statistics.median(d for _, d in values):.1f}"


def memory_table(runs: list[MemoryRun]) -> list[str]:
    rows = []
    for run in runs:
        second = run.rss[1] if len(run.rss) > 1 else run.rss[0]
        rss = f"{run.rss[0]:.0f} / {second:.0f} / {run.rss[-1]:.0f}"
        top, growth = max(run.rss[1:] or run.rss), run.rss[-1] / second
        rows.append(
            (f"{run.name} ({run.videos})", run.workers, len(run.rss), rss, top, growth, run.open_after, run.seconds)
        )
    return tables.table(
        "videos | workers | epochs | RSS after epoch 1 / 2 / last (MiB) | max after epoch ≥ 2 (MiB) "
        "| last / epoch 2 | containers open at the end (main process) | seconds",
        "< > > > >.0f >.3f > >.0f",
        rows,
    )


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
