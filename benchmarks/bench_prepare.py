"""`prepare` against LitData's `optimize` and Mosaic's `MDSWriter` on the same image folder (issue #40).

One folder of ``--classes`` x ``--per-class`` 64x64 RGB JPEGs (PIL, about 2 KB each) is converted by

- **lance-lightning** ``prepare(Prepare("imagefolder", DIR), OUT)`` (the Python form of
  ``lance-lightning prepare --format imagefolder --input DIR --output OUT``): 2 threads, the default;
- **LitData** ``optimize(fn=read the file's bytes, inputs=[(path, label)], num_workers=2)``;
- **Mosaic** ``MDSWriter`` in one process, and its parallel form (one writer per process, then
  ``merge_index``), 2 processes;

and each is timed for conversion rows/s, bytes on disk (the output's file sizes), and the time from
the conversion's end to the first training batch in hand through its own loader, batch ``--batch-size``,
no workers, images left as bytes: our ``LanceDataModule(...).train_dataloader()`` (the default
shuffle), LitData's ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``, Mosaic's
``StreamingDataset(shuffle=True)`` + a PyTorch ``DataLoader``.

Every conversion runs in a fresh process: ours in the project's environment (this script's
``--child``), the peers' in their own environment (``prepare_peers.py`` under ``--peer-python``; made
with ``uv venv`` + ``uv pip install litdata mosaicml-streaming pillow`` when missing). Imports are
done before the clocks start. The four sides run in a rotated order, ``--reps`` times; the table shows
medians and the median of the per-repetition ratios to ours.

    uv run --no-sync python benchmarks/bench_prepare.py [--per-class 1000] [--reps 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

import common

SIDES = ["lance-lightning", "litdata", "mds", "mds-parallel"]
LABELS = {
    "lance-lightning": "lance-lightning `prepare` (2 threads)",
    "litdata": "LitData `optimize` (2 processes)",
    "mds": "Mosaic `MDSWriter` (1 process)",
    "mds-parallel": "Mosaic `MDSWriter` x2 + `merge_index` (2 processes)",
}
PEERS_VENV = Path("/tmp/lance_lightning_peers/venv")


def image_folder(root: Path, classes: int, per_class: int, side: int = 64) -> Path:
    """``root/c<k>/<i>.jpg``: smooth random colour fields plus noise, JPEG quality 85 (written once)."""
    import numpy as np
    from PIL import Image

    folder = root / f"imagefolder_{classes}x{per_class}"
    done = folder / ".complete"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(40)
    yy, xx = np.mgrid[0:side, 0:side] / side
    for c in range(classes):
        (folder / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            a = rng.random((3, 3))
            field = a[:, 0, None, None] + a[:, 1, None, None] * xx + a[:, 2, None, None] * yy
            image = (field / field.max() * 0.85 + rng.random((3, side, side)) * 0.15) * 255
            Image.fromarray(image.transpose(1, 2, 0).astype(np.uint8)).save(folder / f"c{c}" / f"{i:05d}.jpg", quality=85)
    done.touch()
    return folder


def folder_bytes(path: Path) -> int:
    """The sizes of every file under ``path`` (apparent sizes, not blocks)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def child(input_dir: Path, output: Path, batch_size: int) -> None:
    """Our side, in a fresh process: prepare, then the first batch of the train loader."""
    import lance_lightning.load  # noqa: F401  (imports before the clocks)
    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.source import Prepare
    from lance_lightning.write.prepare import prepare

    started = time.perf_counter()
    report = prepare(Prepare(format="imagefolder", input=str(input_dir)), str(output), progress=False)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    dm = LanceDataModule(train=LanceSource(str(output), columns=["image", "label"]), batch_size=batch_size)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    first = time.perf_counter() - started
    rows = getattr(report, "rows", None)
    print(json.dumps({"seconds": seconds, "rows": rows, "first_batch_s": first, "batch_rows": len(batch["label"])}))


def ensure_peers(python: Path) -> None:
    if python.exists():
        return
    venv = python.parent.parent
    print(f"making the peers' environment {venv} (uv venv + uv pip install litdata mosaicml-streaming pillow)")
    subprocess.run(["uv", "venv", "-q", "--python", "3.11", str(venv)], check=True)
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(python), "litdata", "mosaicml-streaming", "pillow"], check=True
    )


def run_side(side: str, folder: Path, out: Path, args: argparse.Namespace) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    if side == "lance-lightning":
        cmd = [sys.executable, __file__, "--child", str(folder), str(out), "--batch-size", str(args.batch_size)]
    else:
        cmd = [str(args.peer_python), str(common.BENCH_DIR / "prepare_peers.py"), side, str(folder), str(out)]
        cmd += ["--batch-size", str(args.batch_size), "--workers", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd="/tmp")
    if done.returncode != 0:
        raise RuntimeError(f"{side} exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["bytes"] = folder_bytes(out)
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE)
    ap.add_argument("--peer-python", type=Path, default=PEERS_VENV / "bin" / "python")
    ap.add_argument("--out", type=Path, default=common.RESULTS_DIR / "prepare.md")
    ap.add_argument("--child", nargs=2, metavar=("INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.batch_size)
        return

    began = time.perf_counter()
    ensure_peers(args.peer_python)
    folder = image_folder(args.cache_dir, args.classes, args.per_class)
    images = args.classes * args.per_class
    input_bytes = folder_bytes(folder)
    print(f"{folder}: {images:,} images, {input_bytes / 1e6:.1f} MB")
    work = args.cache_dir / "prepare_outputs"
    work.mkdir(parents=True, exist_ok=True)
    loads: list[float] = []
    results: dict[str, list[dict]] = {s: [] for s in SIDES}
    for rep in range(args.reps):
        order = SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]
        for side in order:
            r = run_side(side, folder, work / side, args)
            assert r["rows"] == images, (side, r["rows"])
            r["rows_per_s"] = images / r["seconds"]
            results[side].append(r)
            loads.append(os.getloadavg()[0])
            print(
                f"rep {rep + 1} {side:16s} {r['rows_per_s']:9,.0f} rows/s  {r['seconds']:6.2f} s  "
                f"{r['bytes'] / 1e6:6.2f} MB  first batch {r['first_batch_s'] * 1e3:7.1f} ms ({r['batch_rows']} rows)"
            )

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    def ratio(side: str, key: str) -> float:
        return statistics.median(a[key] / b[key] for a, b in zip(results[side], results["lance-lightning"]))

    versions = next(r.get("versions") for r in results["litdata"])
    lines = [
        "| converter | rows/s | vs ours | seconds | bytes on disk | vs input | first batch (ms) | vs ours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for side in SIDES:
        ours = side == "lance-lightning"
        speed = "—" if ours else f"{ratio(side, 'rows_per_s'):.2f}"
        first = "—" if ours else f"{ratio(side, 'first_batch_s'):.2f}"
        lines.append(
            f"| {LABELS[side]} | {med(side, 'rows_per_s'):,.0f} | {speed} | {med(side, 'seconds'):.2f} | "
            f"{med(side, 'bytes'):,.0f} | {med(side, 'bytes') / input_bytes:.3f} | "
            f"{med(side, 'first_batch_s') * 1e3:.0f} | {first} |"
        )
    raw = ["| rep | " + " | ".join(SIDES) + " |", "|---|" + "---:|" * len(SIDES)]
    for rep in range(args.reps):
        cells = [
            f"{results[s][rep]['rows_per_s']:,.0f} rows/s, {results[s][rep]['first_batch_s'] * 1e3:.0f} ms" for s in SIDES
        ]
        raw.append(f"| {rep + 1} | " + " | ".join(cells) + " |")
    summary = {s: {k: med(s, k) for k in ("rows_per_s", "seconds", "bytes", "first_batch_s")} for s in SIDES}
    text = "\n".join(
        [
            "# `prepare` against LitData `optimize` and Mosaic `MDSWriter` (issue #40)",
            "",
            f"Run {common.stamp()}, {time.perf_counter() - began:.0f} s, by `benchmarks/bench_prepare.py`.",
            "",
            f"Command: `{common.command_line()}`",
            "",
            f"Machine: {common.machine(lightning=True)}. Peers (their own environment, "
            f"`{args.peer_python.parent.parent}`): LitData {versions['litdata']}, mosaicml-streaming "
            f"{versions['mosaicml-streaming']}, torch {versions['torch']}, Pillow {versions['pillow']}.",
            "",
            f"Load average at the start of the write-up (1, 5, 15 min): {common.load_average()}; the 1-minute "
            f"load after each conversion ranged {min(loads):.2f}–{max(loads):.2f}.",
            "",
            f"Input: {images:,} JPEGs ({args.classes} class folders x {args.per_class:,}), 64x64 RGB, "
            f"{input_bytes:,} bytes ({input_bytes / images:,.0f} per file). Batch {args.batch_size}, no loader "
            f"workers, images as bytes. {args.reps} repetitions, the four converters in a rotated order, each "
            "conversion in a fresh process (imports outside the clocks); medians, and the median of the "
            "per-repetition ratios to ours (rows/s: above 1 the peer is faster; first batch: above 1 the "
            "peer is slower).",
            "",
            *lines,
            "",
            "Every repetition (conversion rows/s, first batch):",
            "",
            *raw,
            "",
            "<!-- reading -->",
            "",
            "```json",
            json.dumps(summary, indent=1),
            "```",
        ]
    )
    path = common.write_result(args.out, text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
