"""Worker start: time from ``iter(loader)`` to the first batch, 2 worker processes against 0.

Each repeat is a fresh Python process that does what a training script does: imports Lightning
at the top of the script (every worker started the stock way imports the script again), builds a `LanceDataModule` with the default policies (pickled to every worker) and asks its train
loader for the first batch, first with ``num_workers=0``, then with ``num_workers=2`` (this one
starts the fork server and the workers: the cost a fit pays once), then again with 2 workers (the
fork server is already running). Each repeat runs three times: as the package starts workers by
default (the loader reads the first batches in process while its workers start,
`lance_lightning.load.handoff`, and workers skip the script's import,
`lance_lightning.load.lean_start`), waiting for the workers (``LANCE_LIGHTNING_WORKER_HANDOFF=off``:
the first batch is a worker's), and waiting for workers started the stock way (also
``LANCE_LIGHTNING_LEAN_WORKERS=off``). Target: 2 workers cost at most 2 s more than 0 workers.

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

import lightning.pytorch  # noqa: F401  (a training script imports it at its top)

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
    modes = {  # mode: (lean start, hand-over)
        "default": ("on", "on"),
        "lean, waited": ("on", "off"),
        "stock, waited": ("off", "off"),
    }
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    loads = [common.load_average(" ")]
    for _ in range(args.repeats):
        for mode, (lean, handoff) in modes.items():
            child_env = {**env, "LANCE_LIGHTNING_LEAN_WORKERS": lean, "LANCE_LIGHTNING_WORKER_HANDOFF": handoff}
            runs[mode].append(run_child([__file__, "--one", uri], env=child_env, cwd=REPO_ROOT))
        loads.append(common.load_average(" "))
    keys = ("workers0_s", "workers2_first_s", "workers2_again_s")
    med = {start: {key: statistics.median(r[key] for r in runs[start]) for key in keys} for start in runs}
    extra = med["default"]["workers2_first_s"] - med["default"]["workers0_s"]
    waited = med["lean, waited"]["workers2_first_s"] - med["lean, waited"]["workers0_s"]
    rows = [
        f"| {i} | {start} | {r['workers0_s']:.3f} | {r['workers2_first_s']:.3f} | {r['workers2_again_s']:.3f} |"
        for start in runs
        for i, r in enumerate(runs[start], 1)
    ]
    rows += [
        f"| median | {start} | {m['workers0_s']:.3f} | {m['workers2_first_s']:.3f} | {m['workers2_again_s']:.3f} |"
        for start, m in med.items()
    ]
    lines = [
        "# Worker start: `iter(loader)` to the first batch, 2 workers against 0",
        "",
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S')}",
        f"- command: `{common.command_line()}`",
        f"- machine: {common.machine(lightning=True)}",
        f"- load average (1, 5, 15 min) before and after each repeat: {' | '.join(loads)}",
        f"- data: {ROWS:,} rows (id, x, vec float32[8]), batch_size 256, default policies, forkserver",
        "- each repeat is a fresh process whose script imports Lightning at its top (as a training script",
        "  does); the first 2-worker loader starts the fork server and its workers, the second reuses the",
        "  fork server; `default`: the package's start (the first batches read in process while the",
        "  workers start; workers skip the script's import); `lean, waited`:",
        "  `LANCE_LIGHTNING_WORKER_HANDOFF=off` (the first batch is a worker's); `stock, waited`: also",
        "  `LANCE_LIGHTNING_LEAN_WORKERS=off` (every worker imports the script, and with it Lightning)",
        "",
        "| repeat | mode | 0 workers (s) | 2 workers, first (s) | 2 workers, again (s) |",
        "|---:|---|---:|---:|---:|",
        *rows,
        "",
        f"2 workers (first loader, default) cost {extra:.2f} s more than 0 workers: target <= {TARGET_S:.0f} s: "
        f"**{'pass' if extra <= TARGET_S else 'FAIL'}**. Waiting for the workers, the first loader's first batch "
        f"comes {waited:.2f} s later than without workers (the fork server's imports and the workers' start); "
        f"the stock start's second loader took "
        f"{med['stock, waited']['workers2_again_s'] / max(med['lean, waited']['workers2_again_s'], 1e-9):.1f}x "
        "the lean start's.",
        "",
    ]
    common.write_result(RESULT, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
