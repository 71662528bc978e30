"""Run every benchmark of record, one after the other: each script ``benchmarks/bench_*.py``, then
each suite of the harness (``python -m benchmarks run SUITE --record``; ``--quick`` with --quick).

Usage (from the repository root)::

    uv run python benchmarks/run_all.py            # full runs
    uv run python benchmarks/run_all.py --quick    # smoke runs on small data

Each script runs in its own subprocess (a fresh interpreter, so no Lance state or thread pool
leaks from one benchmark into the next) with ``--quick`` passed through when given, and writes
its own ``benchmarks/results/<name>.md`` and ``.png``. Scripts run sequentially: running them at
the same time would make them measure each other. The exit status is 1 if any script failed
(crashed, or exited non-zero).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

#: Scripts that measure a GPU: skipped where there is none (they would exit non-zero).
NEEDS_CUDA = {"bench_gpu.py"}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def discover(only: list[str] | None = None) -> list[str]:
    """The scripts' file names, then the harness's suites (``python -m benchmarks run`` each)."""
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.harness.registry import SUITES

    runs = [s.name for s in sorted(HERE.glob("bench_*.py"))] + list(SUITES)
    return [r for r in runs if not only or any(name in r for name in only)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run every benchmarks/bench_*.py script.")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script (small data)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only scripts whose name contains NAME")
    args = parser.parse_args(argv)

    command = common.command_line()
    scripts = discover(args.only)
    print(f"command: {command}")
    print(f"scripts and suites: {', '.join(scripts) or '(none found)'}", flush=True)
    env = dict(os.environ, LANCE_LIGHTNING_BENCH_COMMAND=command)
    outcomes: list[tuple[str, int, float]] = []
    for script in scripts:
        if script in NEEDS_CUDA and not _cuda():
            print(f"\n=== {script}: skipped (needs a CUDA device)", flush=True)
            continue
        if script.endswith(".py"):
            cmd = [sys.executable, str(HERE / script), *(["--quick"] if args.quick else [])]
        else:
            cmd = [sys.executable, "-m", "benchmarks", "run", script, "--quick" if args.quick else "--record"]
        print(f"\n=== {script}: {' '.join(cmd)}", flush=True)
        started = time.perf_counter()
        code = subprocess.call(cmd, cwd=HERE.parent, env=env)
        outcomes.append((script, code, time.perf_counter() - started))

    print("\n=== summary")
    for name, code, secs in outcomes:
        print(f"  {name:<24} {'ok' if code == 0 else f'FAILED (exit {code})':<18} {secs:6.0f} s")
    print(f"results: {common.RESULTS_DIR}")
    print(f"command: {command}")
    return 0 if scripts and all(code == 0 for _, code, _ in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
