"""The benchmark harness's one command: list cells, suites and studies, run any of them.

    uv run python -m benchmarks list [SELECTOR]        # the registry, or the cells a selector names
    uv run python -m benchmarks run SELECTOR... [...]  # measure them; --record writes a suite's result file
                                                        # --busy N: under N busy loops of other sessions
    uv run python -m benchmarks run STUDY [--quick] [--set KEY=VALUE]... [--record | --out FILE]
    uv run python -m benchmarks all [--quick]          # every suite and study of record, one after the other

A cell is ``workload/loader/size/workers/storage`` (``scan/ours/40k/2/local``); a selector is a cell
with comma lists or ``*`` in its parts (``scan,filter/ours,lance.torch/40k/0,2``; parts left off
take the defaults), or a suite's name (``peers``, ``worker-start``: the benchmarks of record; with
``--quick`` a suite runs its cells at smoke sizes). A study (``resume``, ``read``, ``gpu``, ...) is a
benchmark of record whose measurement is not one loader's rows/s: ``benchmarks/studies/<module>.py``
with its parameters in ``STUDIES`` (`benchmarks.harness.study`). Every figure the docs quote is listed in
``benchmarks/results/INDEX.md`` with the cell or command that made it.

This is the home of every new benchmark, a workers benchmark included: put its workload in
``benchmarks/harness/registry.py`` (``WORKLOADS``) or its loader there (``LOADERS``; a loader
variant is an environment setting of ours, e.g. ``ours-waited``), its construction in
``benchmarks/harness/loaders.py``, a metric the cell process measures in
``benchmarks/harness/cell.py``, and a ``Suite`` (cells, result file, target) when the docs will
quote it; any other measurement is a study (a module of ``benchmarks/studies/`` and its ``Study``);
then add its row to ``benchmarks/results/INDEX.md``. Do not add a new script at the top of
``benchmarks/``; one-off measurements that answer one design question go to ``benchmarks/probes/``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.harness import report, runner, study
from benchmarks.harness.contention import BusyLoops
from benchmarks.harness.registry import (
    DEFAULTS,
    LOADERS,
    STORAGES,
    STUDIES,
    SUITES,
    WORKERS,
    WORKLOADS,
    SelectError,
    select,
)

CACHE = Path(os.environ.get("LANCE_LIGHTNING_BENCH_DIR", "/tmp/lance_lightning_bench")) / "harness"


def _list(selector: str | None) -> None:
    if selector:
        for cell in select(selector):
            print(cell.name)
        return
    print("workloads:")
    for name, w in WORKLOADS.items():
        print(f"  {name:15s} {w.label} (table {w.table}, {w.strategy}{', filter ' + w.filter if w.filter else ''})")
    print("loaders:")
    for name, lo in LOADERS.items():
        print(f"  {name:15s} {lo.label}{' (peers environment)' if lo.peer else ''}")
    print(f"sizes: any row count (40k, 1m, 1e6); workers: any count (registry: {WORKERS}); storages: {STORAGES}")
    print(f"defaults: {DEFAULTS}")
    print("suites (benchmarks of record):")
    for name, s in SUITES.items():
        print(f"  {name:15s} -> results/{s.record}: {s.about}")
        print(f"  {'':15s}    cells: {' '.join(s.selectors)}; --quick: {' '.join(s.quick)}")
    print("studies (benchmarks of record; parameters: --set KEY=VALUE):")
    for name, st in STUDIES.items():
        print(f"  {name:15s} -> results/{st.record}: {st.about}")
        print(f"  {'':15s}    {' '.join(f'{k}={v}' for k, v in st.params.items())}; --quick: {st.quick or 'same'}")


def _command() -> str:
    return " ".join(["uv run python -m benchmarks", *map(shlex.quote, sys.argv[1:])])


def _run(args: argparse.Namespace) -> None:
    if args.selectors[0] in STUDIES:
        if len(args.selectors) > 1 or args.sizes or args.resume is not None:
            raise SelectError(f"a study runs alone, its sizes as --set KEY=VALUE ({args.selectors[0]})")
        if args.record and (args.quick or args.set):
            raise SelectError("--record writes a result of record: not with --quick or --set")
        study.run(args.selectors[0], args, _command())
        return
    if args.set:
        raise SelectError("--set sets a study's parameters (python -m benchmarks list shows the studies)")
    suite = args.selectors[0] if args.selectors[0] in SUITES and len(args.selectors) == 1 else None
    if args.record and suite is None:
        named = " ".join(args.selectors)
        raise SelectError(f"--record writes a suite's result file; {named!r} is not one of {', '.join(SUITES)}")
    if args.record and args.quick:
        raise SelectError("--record with --quick would overwrite a result of record with a smoke run")
    selectors = (SUITES[suite].quick if args.quick else SUITES[suite].selectors) if suite else args.selectors
    if args.sizes:  # a suite's cells at other sizes
        if suite is None:
            raise SelectError("--sizes changes a suite's sizes; give a selector its sizes instead (scan/ours/1m,10m)")
        selectors = tuple("/".join([*s.split("/")[:2], args.sizes, *s.split("/")[3:]]) for s in selectors)
    cells = [c for s in selectors for c in select(s)]
    reps = args.reps or (SUITES[suite].reps if suite else 1)
    seconds = args.seconds if args.seconds is not None else (SUITES[suite].seconds if suite else 4.0)
    if args.quick and args.seconds is None:
        seconds = min(seconds, 1.5)
    began = time.perf_counter()
    options = {"again": args.again or bool(suite and SUITES[suite].again)}
    options["resume"] = args.resume if args.resume is not None else (SUITES[suite].resume if suite else 0)
    if args.busy < 0:
        raise SelectError(f"--busy {args.busy}: give a count of busy-loop processes, 0 or more")
    busy = BusyLoops(args.busy)
    with busy:
        results = runner.run(cells, reps, seconds, args.cache_dir, args.cell_timeout, args.peer_python, options)
    raw = {
        "suite": suite,
        "selector": " ".join(args.selectors),
        "cells": [[c.workload, c.loader, c.size, c.workers, c.storage] for c in cells],
        "results": results,
        "reps": reps,
        "seconds_per_cell": seconds,
        "seconds": time.perf_counter() - began,
        "command": _command(),
        "machine": common.machine(),
        "stamp": common.stamp(),
        "load_average": common.load_average(),
        "contention": busy.describe(),
    }
    name = (suite or "cells") + ("-quick" if args.quick else "")
    out = args.out or (
        common.RESULTS_DIR / SUITES[suite].record if args.record else args.cache_dir / "runs" / f"{name}.md"
    )
    report.write(raw, out)
    print(report.render(raw))
    print(f"wrote {out}")


#: Left out of ``all``: it starts its own S3 server and takes minutes (run it by name).
NOT_IN_ALL = ("object-store",)


def _all(args: argparse.Namespace) -> int:
    """Every suite and study of record, one after the other, each in its own process (run together
    they would measure each other); ``gpu`` only where CUDA is; exit 1 if any failed."""
    runs = [*SUITES, *(s for s in STUDIES if s not in NOT_IN_ALL)]
    runs = [r for r in runs if not args.only or any(name in r for name in args.only)]
    outcomes = []
    for name in runs:
        if name == "gpu" and not __import__("torch").cuda.is_available():
            print(f"\n=== {name}: skipped (needs a CUDA device)", flush=True)
            continue
        cmd = [sys.executable, "-m", "benchmarks", "run", name, "--quick" if args.quick else "--record"]
        print(f"\n=== {name}: {shlex.join(cmd)}", flush=True)
        began = time.perf_counter()
        outcomes.append(
            (name, subprocess.call(cmd, cwd=Path(__file__).resolve().parent.parent), time.perf_counter() - began)
        )
    print("\n=== summary")
    for name, code, seconds in outcomes:
        print(f"  {name:<24} {'ok' if code == 0 else f'FAILED (exit {code})':<18} {seconds:6.0f} s")
    return 0 if outcomes and all(code == 0 for _, code, _ in outcomes) else 1


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the registry, or the cells a selector names")
    ls.add_argument("selector", nargs="?")
    al = sub.add_parser("all", help="every suite and study of record, one after the other (--record, or --quick)")
    al.add_argument("--quick", action="store_true", help="smoke runs: each one's --quick, nothing recorded")
    al.add_argument("--only", nargs="+", metavar="NAME", help="only the runs whose name contains NAME")
    rn = sub.add_parser("run", help="measure the cells the selectors name")
    rn.add_argument("selectors", nargs="+", metavar="SELECTOR")
    rn.add_argument("--quick", action="store_true", help="a suite's smoke sizes, 1.5 s a cell")
    rn.add_argument("--reps", type=int, default=None, help="repetitions (default: the suite's, else 1)")
    rn.add_argument(
        "--seconds", type=float, default=None, help="timed reading per cell (default 4; 0: first batch only)"
    )
    rn.add_argument("--again", action="store_true", help="also time a second loader's first batch in each cell")
    rn.add_argument("--sizes", help="a suite's cells at these sizes instead (comma list: 1m,10m,1e9)")
    rn.add_argument("--resume", type=int, default=None, help="ours: time N resumes at 10%% and 90%% of the epoch")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="a study's parameter (repeatable)")
    rn.add_argument("--record", action="store_true", help="write the suite's result file under benchmarks/results/")
    rn.add_argument("--out", type=Path, default=None, help="result file (default: under the cache folder)")
    rn.add_argument("--cache-dir", type=Path, default=CACHE)
    rn.add_argument("--cell-timeout", type=float, default=120.0)
    rn.add_argument(
        "--busy", type=int, default=0, help="N busy-loop processes, each in its own session, beside every cell"
    )
    rn.add_argument("--peer-python", type=Path, default=runner.PEER_PYTHON)
    args = ap.parse_args()
    # a run stopped by SIGTERM (a timeout) unwinds, so the running cell's process group is killed too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.command == "all":
            raise SystemExit(_all(args))
        _list(args.selector) if args.command == "list" else _run(args)
    except SelectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
