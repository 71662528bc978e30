"""Where a raced first epoch with a light Python transform spends its time (#51), phase by phase.

The race reads a fresh loader's first epoch of ``gil-light`` (10^5 rows of 128 float32, a 20-step
Python loop a row: `probe_worker_race.PythonRows`) at about 0.8x the rows/s of ``num_workers=0``.
This probe times the phases of that epoch from what a training loop sees, each cell a fresh
process as a training script is (Lightning imported, ``setup`` called, which forks the fork
server from the training process):

- ``num_workers=0``: the epoch, and its first batch.
- ``num_workers=2`` as shipped (the race): its first batch; the batches this process read before
  the workers' launch; the launch itself (the loop's thread waits while the fork server forks each
  worker: `multiprocessing`'s ``Process.start``, timed); the wait, after the launch, for the
  workers' first message (the longest gap between two batches after it); and the rest of the epoch,
  read by the workers.
- ``os.fork`` of the training process as it is after ``setup`` (the fork server is a fork of it,
  so each worker's fork copies the page tables of that much memory), its child leaving at once.

Usage::

    python benchmarks/probes/probe_first_epoch.py [--reps 5] [--out FILE]   # writes results/first_epoch.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
BENCH_DIR = PROBE_DIR.parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(PROBE_DIR), str(BENCH_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

RESULT = BENCH_DIR / "results" / "first_epoch.md"
WORKLOAD = "gil-light"
FORKS = 5
WORKER_BATCHES = "batches from the workers' first message on"


def _launches() -> list[tuple[float, float]]:
    """Wrap ``Process.start`` of this process: the (began, ended) times of every process started."""
    from multiprocessing import process

    spans: list[tuple[float, float]] = []
    start = process.BaseProcess.start

    def timed(self: Any) -> None:
        began = time.perf_counter()
        start(self)
        spans.append((began, time.perf_counter()))

    process.BaseProcess.start = timed  # type: ignore[method-assign]
    return spans


def _fork_ms() -> float:
    """Median milliseconds of ``os.fork`` in this process (the child leaves at once)."""
    import warnings

    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(FORKS):
            began = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            times.append(time.perf_counter() - began)
            os.waitpid(pid, 0)
    return 1000 * statistics.median(times)


def child(workers: int, data: dict[str, str]) -> dict[str, Any]:
    """One cell in this fresh process: the first epoch's batch arrival times and its launches."""
    import common
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)
    import probe_worker_race

    spans = _launches()
    dm = probe_worker_race._module(WORKLOAD, data, workers)
    dm.setup("fit")
    out: dict[str, Any] = {}
    if workers == 0:
        out["rss_mb"], out["fork_ms"] = common.rss_mb(), _fork_ms()
    loader = dm.train_dataloader()
    spans.clear()
    arrivals, rows = [], 0
    began = time.perf_counter()
    for batch in loader:
        arrivals.append(time.perf_counter() - began)
        rows += len(batch["id"])
    out.update(rows=rows, arrivals=arrivals, launches=[(a - began, b - began) for a, b in spans])
    return out


def phases(cell: dict[str, Any]) -> dict[str, float]:
    """A race cell's phases in seconds (see the module docstring)."""
    arrivals, launches = cell["arrivals"], cell["launches"]
    total, first = arrivals[-1], arrivals[0]
    if not launches:
        return {"first": first, "total": total}
    launch_began, launch_ended = launches[0][0], launches[-1][1]
    before = [t for t in arrivals if t <= launch_began]
    after = [t for t in arrivals if t > launch_ended]
    gaps = [(later - earlier, later) for earlier, later in zip([launch_ended, *after], after)]
    wait, first_worker = max(gaps)
    batches_after = len(arrivals) - arrivals.index(first_worker)
    return {
        "first": first,
        "in process before the launch": launch_began,
        "batches before the launch": len(before),
        "launch": launch_ended - launch_began,
        "per fork": statistics.median(b - a for a, b in launches),
        "wait for the workers' first message": wait,
        "from the workers' first message to the end": total - first_worker,
        WORKER_BATCHES: batches_after,
        "total": total,
    }


def main() -> None:
    import common

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per cell, interleaved: the median")
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    from probe_worker_race import IMAGES, ROWS

    data = {"vec": common.vec_dataset(args.cache_dir, ROWS), "images": common.image_dataset(args.cache_dir, IMAGES)}
    load = common.load_average()
    cells: dict[int, list[dict[str, Any]]] = {0: [], 2: []}
    for _ in range(args.reps):
        for workers in cells:
            child_args = [str(PROBE_DIR / "probe_first_epoch.py"), "--child", str(workers), json.dumps(data)]
            cells[workers].append(common.run_child(child_args))
    zero = [phases(c) for c in cells[0]]
    race = [phases(c) for c in cells[2]]
    rows = cells[0][0]["rows"]

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    lines = [
        "# Where a raced first epoch with a light Python transform spends its time (#51)",
        "",
        f"`{common.command_line()}` on {common.stamp()}; {common.machine(lightning=True)}; load average {load} at "
        "the start.",
        "",
        f"`{WORKLOAD}`, {rows:,} rows, batch 256, persistent workers; each cell a fresh process, run {args.reps} "
        "times interleaved: the median of each figure (so the parts need not add up to the total).",
        "",
        "| phase of the first epoch | num_workers=0 | race (num_workers=2) |",
        "|---|---:|---:|",
        f"| first batch (s) | {med(zero, 'first'):.3f} | {med(race, 'first'):.3f} |",
    ]
    for key in (
        "in process before the launch",
        "launch",
        "per fork",
        "wait for the workers' first message",
        "from the workers' first message to the end",
    ):
        lines.append(f"| {key} (s) | - | {med(race, key):.3f} |")
    lines += [
        f"| batches read in process before the launch | - | {med(race, 'batches before the launch'):.0f} |",
        f"| batches from the workers' first message on | - | {med(race, WORKER_BATCHES):.0f} |",
        f"| the epoch (s) | {med(zero, 'total'):.3f} | {med(race, 'total'):.3f} |",
        f"| rows/s | {rows / med(zero, 'total'):,.0f} | {rows / med(race, 'total'):,.0f} |",
        "",
        f"The race's epoch over `num_workers=0`'s: {med(zero, 'total') / med(race, 'total'):.2f}x the rows/s.",
        "",
        f"`os.fork` of the `num_workers=0` process after `setup` ({statistics.median(c['rss_mb'] for c in cells[0]):,.0f} "
        f"MB resident), its child leaving at once: {statistics.median(c['fork_ms'] for c in cells[0]):.1f} ms "
        f"(the median of {FORKS} forks, then of the runs).",
    ]
    common.write_result(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), json.loads(sys.argv[3]))))
    else:
        main()
