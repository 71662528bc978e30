"""How the way a program hands its work on moves its share of a contended CPU (#51: JPEG beside busy loops).

Runs one CPU-bound job beside ``--busy`` busy loops (`benchmarks.harness.contention.BusyLoops`, each
in a session of its own) and reports the CPU seconds per second the job's process tree got. The
job is always the same work, SHA-256 over a 64 KiB buffer in 2 workers, cut into units of
``--units`` seconds of CPU each; only how a worker hands a finished unit on changes:

- ``none``: 2 processes, no hand-off;
- ``pipe``: 2 processes, each writes 100 bytes a unit straight into a pipe the parent reads;
- ``queue``: 2 processes, each puts 100 bytes a unit on a ``multiprocessing.Queue`` (a feeder thread
  in the worker writes the pipe: how a torch ``DataLoader`` worker, and so LitData's, hands on batches);
- ``threads``: 2 threads of one process, each puts a unit on a ``queue.Queue`` the main thread reads.

Each job runs in a session of its own (its own autogroup, as the harness's cells do). No loader is
imported: the figures are the kernel scheduler's, not any loader's.

What it answered (2026-12-01 08:26 UTC, ``--units 0.04 0.01 0.0025 0.001 --reps 2 --seconds 3``,
2 cores, kernel 6.18, nothing else running; ``benchmarks/results/wakeup_share.md``): beside two busy
loops a third of the machine (0.67 CPU s/s) is each of the three sessions' fair share. With no
hand-off the job got 0.99x that third at every unit. A direct pipe got 0.92x-0.97x up to 252
hand-offs a second (1.31x at 844). A ``multiprocessing.Queue`` got more the more often it handed
on: 0.97x at 16 a second, 1.51x at 100, 2.20x at 574 (on 2 cores with nothing else running that
CPU can only come from the busy loops, which the probe does not time); 2 threads of one
process handing to the main thread 1.21x at 80 and 1.50x at 391. So beside busy loops a loader's
share of the CPU follows how often its threads wake each other, not only its work: torch's
worker queue, which LitData and ``lance.torch`` read through, earns a large one
(``probe_busy_share.py``, ``busy_share_s27.md``: LitData's tree 1.56 CPU s/s, ours 0.73).

Usage::

    uv run python benchmarks/probes/probe_wakeup_share.py --units 0.04 0.01 0.0025 --reps 2 \\
        --out benchmarks/results/wakeup_share.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

KINDS = ("none", "pipe", "queue", "threads")
WORKERS = 2
MESSAGE = b"x" * 100
_BUFFER = os.urandom(64 * 1024)


def _unit(seconds: float) -> None:
    """``seconds`` of this thread's CPU time, spent hashing (the C loop releases the GIL)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        hashlib.sha256(_BUFFER).digest()


def _worker(kind: str, sink: object, units: int, seconds: float) -> None:
    for _ in range(units):
        _unit(seconds)
        if kind == "pipe":
            sink.send_bytes(MESSAGE)  # type: ignore[attr-defined]
        elif kind in ("queue", "threads"):
            sink.put(MESSAGE)  # type: ignore[attr-defined]


def child(kind: str, unit: float, seconds: float) -> dict[str, float]:
    """Run the job once in this process (and its children); its CPU seconds per wall second."""
    units = max(1, int(seconds / unit))
    started, cpu_started = time.perf_counter(), time.process_time()
    context = mp.get_context("fork")
    if kind == "threads":
        handed: queue.Queue[bytes] = queue.Queue(4)
        threads = [threading.Thread(target=_worker, args=(kind, handed, units, unit)) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        for _ in range(WORKERS * units):
            handed.get()
        for thread in threads:
            thread.join()
    else:
        receivers: list = []
        sinks: list = [None] * WORKERS
        if kind == "queue":
            shared = context.Queue(4)
            sinks = [shared] * WORKERS
        elif kind == "pipe":
            pairs = [context.Pipe(duplex=False) for _ in range(WORKERS)]
            receivers, sinks = [p[0] for p in pairs], [p[1] for p in pairs]
        processes = [context.Process(target=_worker, args=(kind, sinks[i], units, unit)) for i in range(WORKERS)]
        for process in processes:
            process.start()
        if kind == "queue":
            for _ in range(WORKERS * units):
                shared.get()
        elif kind == "pipe":
            from multiprocessing.connection import wait

            for _ in range(WORKERS * units):
                ready = wait(receivers)
                ready[0].recv_bytes()  # type: ignore[union-attr]
        for process in processes:
            process.join()
    wall = time.perf_counter() - started
    reaped = os.times()
    cpu = time.process_time() - cpu_started + reaped.children_user + reaped.children_system
    return {"cpu_per_s": cpu / wall, "handoffs_per_s": 0.0 if kind == "none" else WORKERS * units / wall}


def measure(kind: str, unit: float, seconds: float) -> dict[str, float]:
    """`child` in a fresh interpreter in a session of its own."""
    command = [sys.executable, __file__, "--child", kind, "--unit", str(unit), "--seconds", str(seconds)]
    done = subprocess.run(command, capture_output=True, text=True, start_new_session=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=float, nargs="+", default=[0.04, 0.01, 0.0025], help="CPU seconds a unit")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0, help="CPU seconds of work each worker is given")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the jobs, each in its own session")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--unit", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.unit, args.seconds)))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.common import load_average, write_result
    from benchmarks.harness.contention import BusyLoops

    results: dict[tuple[float, str], list[dict[str, float]]] = {}
    with BusyLoops(args.busy) as busy:
        for _ in range(args.reps):  # repetitions outermost: a slow minute spreads over every job
            for unit in args.units:
                for kind in KINDS:
                    results.setdefault((unit, kind), []).append(measure(kind, unit, args.seconds))
        contention = busy.describe() or "Nothing ran beside the jobs."
    fair = os.cpu_count() / (args.busy + 1) if args.busy else float(os.cpu_count() or 1)
    lines = [
        "# The CPU share of one job by how it hands work on (`probe_wakeup_share.py`)",
        "",
        f"Command: `uv run python benchmarks/probes/probe_wakeup_share.py {' '.join(sys.argv[1:])}`",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU(s), kernel "
        f"{os.uname().release}. {contention} Load average at the end (1, 5, 15 min): "
        f"{load_average()}.",
        "",
        f"Each job: {WORKERS} workers hashing, {args.seconds:g} CPU s of work each, in a session of its own; "
        f"medians of {args.reps} repetition(s). Fair share: {fair:.2f} CPU s/s (the cores over the sessions "
        "that want them).",
        "",
        "| unit (CPU ms) | hand-off | hand-offs / s | job's CPU s / s | over the fair share |",
        "|---:|---|---:|---:|---:|",
    ]
    for (unit, kind), runs in results.items():
        cpu = statistics.median(r["cpu_per_s"] for r in runs)
        rate = statistics.median(r["handoffs_per_s"] for r in runs)
        lines.append(f"| {unit * 1000:g} | `{kind}` | {rate:,.0f} | {cpu:.2f} | {cpu / fair:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_result(args.out, text)


if __name__ == "__main__":
    main()
