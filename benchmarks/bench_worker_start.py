"""Worker start: time from ``iter(loader)`` to the first batch, 2 worker processes against 0.

Each repeat is a fresh Python process that does what a training script does: imports Lightning,
builds a `LanceDataModule` with the default policies (pickled to every worker) and asks its train
loader for the first batch, first with ``num_workers=0``, then with ``num_workers=2`` (this one
starts the fork server and the workers: the cost a fit pays once), then again with 2 workers (the
fork server is already running). Target: 2 workers cost at most 2 s more than 0 workers.

Usage::

    python benchmarks/bench_worker_start.py [--repeats 3] [--quick]   # writes results/worker_start.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULT = BENCH_DIR / "results" / "worker_start.md"  # common.RESULTS_DIR; `common` is imported in main only
TARGET_S = 2.0
ROWS = 20_000


def _first_batch_s(uri: str, num_workers: int) -> float:
    from lance_lightning import LanceDataModule, LanceSource

    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x", "vec"]), batch_size=256, num_workers=num_workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    started = time.perf_counter()
    batches = iter(loader)
    next(batches)
    seconds = time.perf_counter() - started
    del batches
    return seconds


def _one(uri: str) -> None:
    """One fresh process: print the three times as JSON."""
    import lightning.pytorch  # noqa: F401  (a training script has imported it)

    zero = _first_batch_s(uri, 0)
    first = _first_batch_s(uri, 2)
    again = _first_batch_s(uri, 2)
    print(
        json.dumps(
            {
                "workers0_s": zero,
                "workers2_first_s": first,
                "workers2_again_s": again,
                "lightning_in_main": "lightning" in sys.modules,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    if args.one:
        _one(args.one)
        return
    for path in (BENCH_DIR, REPO_ROOT):  # the shared harness `common`, the repository root
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import common
    from common import run_child

    from tests.helpers import write_dataset

    uri = write_dataset(Path(tempfile.mkdtemp(prefix="bench_worker_start_")) / "ds.lance", ROWS, fragment_rows=5000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    runs, loads = [], [common.load_average(" ")]
    for _ in range(args.repeats):
        runs.append(run_child([__file__, "--one", uri], env=env, cwd=REPO_ROOT))
        loads.append(common.load_average(" "))
    keys = ("workers0_s", "workers2_first_s", "workers2_again_s")
    med = {key: statistics.median(r[key] for r in runs) for key in keys}
    extra = med["workers2_first_s"] - med["workers0_s"]
    lines = [
        "# Worker start: `iter(loader)` to the first batch, 2 workers against 0",
        "",
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S')}",
        f"- command: `{common.command_line()}`",
        f"- machine: {common.machine(lightning=True)}",
        f"- load average (1, 5, 15 min) before and after each repeat: {' | '.join(loads)}",
        f"- data: {ROWS:,} rows (id, x, vec float32[8]), batch_size 256, default policies, forkserver",
        "- each repeat is a fresh process that has imported Lightning (as a training script has); the first",
        "  2-worker loader starts the fork server and its workers, the second reuses the fork server",
        "",
        "| repeat | 0 workers (s) | 2 workers, first (s) | 2 workers, again (s) |",
        "|---:|---:|---:|---:|",
        *(
            f"| {i} | {r['workers0_s']:.3f} | {r['workers2_first_s']:.3f} | {r['workers2_again_s']:.3f} |"
            for i, r in enumerate(runs, 1)
        ),
        f"| median | {med['workers0_s']:.3f} | {med['workers2_first_s']:.3f} | {med['workers2_again_s']:.3f} |",
        "",
        f"2 workers (first loader) cost {extra:.2f} s more than 0 workers: target <= {TARGET_S:.0f} s: "
        f"**{'pass' if extra <= TARGET_S else 'FAIL'}**.",
        "",
    ]
    common.write_result(RESULT, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
