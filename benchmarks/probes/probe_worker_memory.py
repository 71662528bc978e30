"""Probe: what a filter's row set costs each DataLoader worker process, shared or copied.

Backs `lance_lightning.load.shared`. For the scale benchmark's int64 dataset of ``--rows`` rows
(``common.scale_dataset`` writes it, as the harness's scale suite does), RowShuffle, batch 256 and ``--workers`` worker
processes, a fresh process reads 400 batches, then measures (psutil, Linux) the unique memory
(USS: pages no other process maps) and the proportional memory (PSS: shared pages split between
the processes mapping them) of the training process and of each worker. Cases: no filter; the
10% filter ``x % 10 = 0`` with the row set shared (the package's behaviour); the same filter
with the row set copied into each worker (the sharing reductions unregistered in that process,
as before they existed). The sum of PSS is what the machine holds for the run (the forkserver
and resource tracker included). Not part of ``python -m benchmarks all``.

    uv run python benchmarks/probes/probe_worker_memory.py --rows 1e9 --workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common
from benchmarks.common import RESULTS_DIR, command_line, machine, run_child

FILTER = "x % 10 = 0"
BATCHES = 400
CASES = {"no filter": (None, True), "10% filter, shared": (FILTER, True), "10% filter, copied": (FILTER, False)}


def one(uri: str, case: str, workers: int) -> dict:
    """One measurement, in this (fresh) process."""
    import psutil

    from lance_lightning import LanceDataModule, LanceSource, RowShuffle

    flt, shared = CASES[case]
    if not shared:
        from multiprocessing.reduction import ForkingPickler

        from lance_lightning.load import shared as sharing

        for kind in (sharing.RangeRuns, sharing.MatchBitmap, sharing.EliasFano):
            ForkingPickler._extra_reducers.pop(kind, None)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["x"], filter=flt),
        shuffle=RowShuffle(seed=0),
        batch_size=256,
        num_workers=workers,
    )
    dm.setup("fit")
    epoch = iter(dm.train_dataloader())
    for _ in range(BATCHES):
        next(epoch)
    me = psutil.Process()
    loaders = [p for p in me.children(recursive=True) if "forkserver" in " ".join(p.cmdline())]
    main = me.memory_full_info()
    infos = [p.memory_full_info() for p in me.children(recursive=True)]
    worker_infos = [p.memory_full_info() for p in loaders if p.ppid() != me.pid]  # workers fork from the server
    return {
        "main_uss": main.uss / 2**20,
        "main_pss": main.pss / 2**20,
        "worker_uss": [info.uss / 2**20 for info in worker_infos],
        "worker_pss": [info.pss / 2**20 for info in worker_infos],
        "total_pss": (main.pss + sum(info.pss for info in infos)) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda text: int(float(text)), default=10**9)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", default=str(common.SCALE_CACHE))
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]))))
        return
    uri = common.scale_dataset(Path(args.cache), args.rows)  # the scale suite's table, written here when missing
    lines = [
        "# Worker memory: what a filter's row set costs each DataLoader worker, shared or copied",
        "",
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
        f"Machine: {machine()}. {args.rows:,} int64 rows, RowShuffle, batch 256, {args.workers} worker "
        f"processes, memory read after {BATCHES} batches; one fresh process per case. USS: memory no other "
        "process maps; PSS: shared pages split between the processes mapping them; total: the PSS of the "
        "training process and all its children (workers, forkserver, resource tracker). MiB.",
        "",
        "| case | training process USS | worker USS (each) | training process PSS | worker PSS (each) | total PSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        r = run_child([__file__, "--one", uri, case, str(args.workers)])
        lines.append(
            f"| {case} | {r['main_uss']:,.0f} | {', '.join(f'{v:,.0f}' for v in r['worker_uss'])} | "
            f"{r['main_pss']:,.0f} | {', '.join(f'{v:,.0f}' for v in r['worker_pss'])} | {r['total_pss']:,.0f} |"
        )
        print(lines[-1], flush=True)
    out = RESULTS_DIR / "worker_memory.md"
    common.write_result(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
