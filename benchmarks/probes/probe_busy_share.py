"""How much CPU the busy loops and a cell get under ``--busy 2``, and whether the loops share a core (#51).

Runs one harness command with ``--busy`` (``python -m benchmarks run ... --busy 2``) and samples,
every ``--interval`` seconds of a cell's timed reading (its last ``--seconds``), each busy loop's CPU rate and the core it last ran
on (``/proc/<pid>/stat`` field 39), and the CPU rate of the cell's process tree (the cell, its fork
server and workers). Per loader it prints the median of each over those samples, and the share of them in which both
busy loops sat on the same core; then the harness's own rows of the cells.

What it answered (2026-11-30 00:01 UTC, ``'jpeg/ours,lance.torch/8k/2' --reps 3 --seconds 8
--interval 0.5``, 2 cores, an engineer's tests and two stray hashing processes of a diagnostic
(found afterwards) beside it, load about 8): while ours read (in
process) its tree used 0.39 of a core and each busy loop 0.40; while ``lance.torch`` read (2 worker
processes) its tree used 0.61 and each busy loop 0.30. The busy loops sat on one core in 67% and
39% of those samples, so where they were placed does not explain the difference: beside busy loops
the peer's process tree takes a larger share of the CPU than our one process (and from the busy
loops, not only from other jobs). Ours still read 1.30x its rows/s (3,707 against 3,184) at 104
against 188 ms of CPU per 1,000 rows. In a synthetic test not kept (a hashing loop in 2 threads
of one process against 2 processes, same session) both got the same share beside two busy loops,
so processes against threads as such is not the cause either. What is: how often a process tree's
threads wake each other (``probe_wakeup_share.py``: the same hashing job got 0.99x its fair share
with no hand-off and 2.20x handing on through a ``multiprocessing.Queue`` 574 times a second). Run
again on 2026-12-01 (``'jpeg/ours,litdata/8k/2' --reps 2 --seconds 8 --interval 0.5``, nothing else
beside it; ``benchmarks/results/busy_share_s27.md``): LitData's tree 1.56 CPU s/s and each busy loop
0.21, ours 0.73 and 0.63, the busy loops never on one core.

Usage::

    uv run python benchmarks/probes/probe_busy_share.py 'jpeg/ours,lance.torch/8k/2' --reps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SPIN_MARK = "while True"
CELL_MARK = "benchmarks.harness.cell"


def _core(process: psutil.Process) -> int | None:
    """The core ``process`` last ran on (``/proc/<pid>/stat`` field 39)."""
    try:
        with open(f"/proc/{process.pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _loader(cell: psutil.Process) -> str:
    try:
        line = " ".join(cell.cmdline())
    except psutil.Error:
        return "?"
    marker = '"loader": "'
    return line.split(marker, 1)[1].split('"', 1)[0] if marker in line else "?"


def sample(run: subprocess.Popen, interval: float, seconds: float) -> dict[str, list[dict[str, float]]]:
    """Per loader, one record per interval of its cells' last ``seconds`` (their timed reading: a
    cell ends right after it): the busy loops' CPU rates and whether they sat on one core, the
    cell tree's CPU rate."""
    harness = psutil.Process(run.pid)
    found: dict[str, list[dict[str, float]]] = {}
    cell_records: list[tuple[float, dict[str, float]]] = []
    previous, loader = None, "?"

    def close_cell() -> None:
        if cell_records:
            last = cell_records[-1][0]
            found.setdefault(loader, []).extend(r for t, r in cell_records if t >= last - seconds + interval)
        cell_records.clear()

    while run.poll() is None:
        kids = harness.children(recursive=True)
        busy = [p for p in kids if SPIN_MARK in " ".join(_safe_cmdline(p))]
        cells = [p for p in kids if CELL_MARK in " ".join(_safe_cmdline(p)) and "-c" not in _safe_cmdline(p)]
        if len(busy) == 2 and cells:
            cell = cells[0]
            try:
                tree = [cell, *cell.children(recursive=True)]
            except psutil.Error:
                tree = []
            now = (time.perf_counter(), cell.pid, [_cpu([b]) for b in busy], _cpu(tree))
            if previous is not None and previous[1] != cell.pid:
                close_cell()
            if previous is not None and previous[1] == cell.pid:
                elapsed = now[0] - previous[0]
                cores = [_core(b) for b in busy]
                record = {
                    "busy": sum(now[2][i] - previous[2][i] for i in range(2)) / elapsed / 2,
                    "same_core": float(cores[0] is not None and cores[0] == cores[1]),
                    "tree": (now[3] - previous[3]) / elapsed,
                }
                cell_records.append((now[0], record))
            loader, previous = _loader(cell), now
        elif previous is not None:
            close_cell()
            previous = None
        time.sleep(interval)
    close_cell()
    return found


def _safe_cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("selector", help="the harness's cells, e.g. jpeg/ours,lance.torch/8k/2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed reading per cell")
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp()) / "busy_share.md"
    command = [sys.executable, "-m", "benchmarks", "run", args.selector, "--busy", "2", "--reps", str(args.reps)]
    command += ["--seconds", str(args.seconds), "--cell-timeout", "180", "--out", str(out)]
    with open(os.devnull, "w") as quiet:
        run = subprocess.Popen(command, cwd=REPO_ROOT, stdout=quiet, stderr=subprocess.STDOUT)
        found = sample(run, args.interval, args.seconds)
    print(f"`{' '.join(command[1:])}`: per loader, medians over the samples its cells read")
    print("| loader | samples | each busy loop's CPU | both busy loops on one core | the cell tree's CPU |")
    print("|---|---:|---:|---:|---:|")
    for loader, records in found.items():
        print(
            f"| {loader} | {len(records)} | {statistics.median(r['busy'] for r in records):.2f} | "
            f"{statistics.mean(r['same_core'] for r in records):.0%} | {statistics.median(r['tree'] for r in records):.2f} |"
        )
    for line in out.read_text().splitlines():
        if line.startswith("| `"):
            print(line)


if __name__ == "__main__":
    main()
