"""CPU per row of the harness's ``jpeg`` workload, by process and thread: where the worker path's CPU goes (#51).

Builds the harness's loader (``ours`` or a peer, e.g. ``lance.torch``) for the ``jpeg`` workload
(8k 64x64 JPEGs, `RowShuffle`, `DecodeImage`, batch 256) with ``--workers`` workers, reads
``--warm`` batches, then reads for ``--seconds`` and prints rows/s, the process tree's CPU ms per
1,000 rows and cores used in that window, the CPU of each (process, thread name) and of the
busiest threads in it, and each child process's CPU since it started. Run it with
``LANCE_LIGHTNING_WORKER_CHOICE=workers`` (or ``in_process``) to force our loader's path.

What it answered (2026-11-29, 2 cores shared, load 5-9): with ``--warm 2`` the window holds the
fork server's start: 1,082 of 1,250 ms / 1k rows were the server process importing (torch,
Lance, and then torchvision with torch._dynamo and SymPy through the transform's module), so the
worker path looked 2-10x as costly as in process. With ``--warm 60`` (the workers up) the worker
path took 122-180 ms / 1k rows against 172-177 in process (whose window holds the server's
imports too: ``setup`` starts it when the outcome is forced). The server's start cost 4.75 and
5.41 s of CPU before torchvision was imported lazily (`lance_lightning.transforms.vision`), 3.56
and 3.69 s after.

Usage (from the repository root; the data: ``uv run python -m benchmarks run 'jpeg/ours/8k/0' --seconds 1``)::

    LANCE_LIGHTNING_WORKER_CHOICE=workers uv run python benchmarks/probes/probe_worker_cpu.py ours --warm 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import psutil  # noqa: E402

from benchmarks.harness.loaders import build, import_modules  # noqa: E402
from benchmarks.harness.registry import WORKLOADS  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def threads() -> dict[tuple[int, int], tuple[str, str, float]]:
    """(pid, tid) -> (process role, thread name, CPU seconds) for this process and its descendants."""
    me = psutil.Process()
    out = {}
    for proc in (me, *me.children(recursive=True)):
        role = "main" if proc.pid == me.pid else proc.name()
        try:
            tids = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                name = Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip()
                fields = Path(f"/proc/{proc.pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[(proc.pid, int(tid))] = (role, name, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loader", nargs="?", default="ours")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warm", type=int, default=60, help="batches read before the window")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--uri", default="/tmp/lance_lightning_bench/harness/images_8k.lance")
    args = parser.parse_args()
    import_modules(args.loader)
    data = {"uri": args.uri, "table_rows": 8000}
    loader = build(args.loader, WORKLOADS["jpeg"], args.workers, data)
    batches = iter(loader)
    for _ in range(args.warm):
        try:
            next(batches)
        except StopIteration:
            batches = iter(loader)
    before, started, rows = threads(), time.perf_counter(), 0
    while time.perf_counter() - started < args.seconds:
        try:
            rows += len(next(batches)["id"])
        except StopIteration:
            batches = iter(loader)
    wall, after = time.perf_counter() - started, threads()
    spent = {key: cpu - before.get(key, (role, name, 0.0))[2] for key, (role, name, cpu) in after.items()}
    total = sum(spent.values())
    per_1k = 1e6 / max(rows, 1)
    print(
        json.dumps(
            {
                "loader": args.loader,
                "rows_per_s": round(rows / wall),
                "cpu_ms_per_1k": round(total * per_1k, 1),
                "cores": round(total / wall, 2),
            }
        )
    )
    groups: dict[tuple[str, str], list[float]] = {}
    for key, seconds in spent.items():
        role, name, _ = after[key]
        group = groups.setdefault((role, name), [0.0, 0])
        group[0] += seconds
        group[1] += 1
    for (role, name), (seconds, count) in sorted(groups.items(), key=lambda item: -item[1][0]):
        if seconds > 0.02:
            print(f"  {role[:16]:16s} {name[:16]:16s} x{count:<3d} {seconds * per_1k:8.1f} ms / 1k rows")
    for seconds, (pid, tid) in sorted(((s, k) for k, s in spent.items()), reverse=True)[:8]:
        if seconds > 0.01:
            print(f"    thread {pid}/{tid} {after[(pid, tid)][1][:16]:16s} {seconds * per_1k:8.1f} ms / 1k rows")
    for proc in psutil.Process().children(recursive=True):
        try:
            cpu = proc.cpu_times()
            print(f"  process {proc.pid} {proc.name()[:16]:16s} CPU since its start {cpu.user + cpu.system:6.2f} s")
        except psutil.Error:
            pass


if __name__ == "__main__":
    main()
