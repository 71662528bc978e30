"""How long the fork server takes to be ready, alone and while the training process reads (#51).

A fresh process per run, as a training script: it imports Lightning, builds the `LanceDataModule`
of one of `probe_worker_race`'s GIL-holding workloads (``gil``: 10^5 rows of 128 float32 and a
pure-Python loop of 60 steps per row; ``gil-heavy``: 600), calls ``setup`` (which starts the fork
server where the transform may hold the GIL) and then either

- ``alone``: waits until the server forks an empty process (`WorkerStart`), reading nothing, or
- ``reading``: reads epochs of its train loader as shipped (the race) and notes, after each epoch,
  the seconds since ``setup`` and whether the server is ready or the workers read.

It prints one JSON line per run. Runs alternate between the two modes, so both meet the same
machine state.

What it answered (2026-11-29 21:10 UTC, ``--workload gil --epochs 8 --runs 2``, 2 cores, load
average about 4 from other jobs): alone, the server was ready 5.39 and 3.61 s after ``setup``;
while the race read ``gil`` in process (the transform held the GIL for 81-98% of the loop's time)
it was not ready after 7 epochs (9.24 and 8.25 s) and the workers took over in the 8th (10.65 and
9.54 s). The read in process takes the cores the server's imports need, so on 2 cores the
workers' gain comes about twice as late as their import time alone says. With cores to spare
the two need not compete (not measured here: this VM has 2).

After the server's imports moved to a thread at nice 19 where the race starts it (2026-11-30 00:31
UTC, the same command, load average about 2): alone, ready 3.65 and 4.64 s after ``setup``; while
the race read ``gil`` in process the workers took over in the 5th epoch (4.8 and 5.31 s), as in a
run before the change that day (5th epoch, 5.86 s): the imports still take the idle core.

Usage::

    uv run python benchmarks/probes/probe_server_start.py --workload gil --epochs 8 --runs 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROBE_DIR.parent.parent
for _path in (str(PROBE_DIR), str(PROBE_DIR.parent), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def run(workload: str, mode: str, epochs: int, data: dict[str, str]) -> dict[str, Any]:
    """One run in this process (see the module docstring)."""
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)
    import probe_worker_race

    from lance_lightning.load.handoff import WorkerStart

    dm = probe_worker_race._module(workload, data, 2)
    started = time.perf_counter()
    dm.setup("fit")
    loader = dm.train_dataloader()
    if mode == "alone":
        WorkerStart(loader.multiprocessing_context).start().wait()
        return {"mode": mode, "ready_s": round(time.perf_counter() - started, 2)}
    epochs_seen = []
    for _ in range(epochs):
        for _ in loader:
            pass
        waiting = loader.worker_start
        epochs_seen.append(
            {
                "since_setup_s": round(time.perf_counter() - started, 2),
                "choice": loader.race.choice,
                "server_ready": None if waiting is None else waiting.ready(),
                "workers_running": loader.workers_running,
                "gil_share": round(loader.race.rates.gil_share() or 0.0, 2),
            }
        )
    return {"mode": mode, "epochs": epochs_seen}


def main() -> None:
    from benchmarks import common

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gil", choices=("gil", "gil-heavy"))
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2, help="runs of each mode, alternating")
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE)
    args = ap.parse_args()
    data = {"vec": common.vec_dataset(args.cache_dir, 100_000)}
    for _ in range(args.runs):
        for mode in ("alone", "reading"):
            code = (
                "import json, probe_server_start as p\n"
                f"print(json.dumps(p.run({args.workload!r}, {mode!r}, {args.epochs}, {data!r})))"
            )
            done = subprocess.run(
                [sys.executable, "-c", f"import sys; sys.path[:0] = {[str(PROBE_DIR), str(REPO_ROOT)]!r}\n{code}"],
                capture_output=True,
                text=True,
                cwd=REPO_ROOT,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
            print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
