"""Scale benchmark: what each shuffle strategy costs at 10^6..10^9 rows, with and without a filter.

For each size (one ``int64`` column ``x = row``, batch 256) and each case (NoShuffle, ShardShuffle,
RowShuffle, RowShuffle(clump_rows=64), BufferShuffle; each without a filter and with the 10% filter
``x % 10 = 0``), a fresh subprocess measures:

- setup: ``LanceDataModule.setup("fit")`` (pin, filter scan, plan, the rank-0 ``explain``);
- first batch: ``train_dataloader()`` and its first batch;
- without the filter: rows/s over the next ``--batches`` batches of that epoch (all of it at
  10^6), read groups at their full size;
- resume at 10% and 90%: the first batch of an iterator restored from a cursor at that share of
  the epoch (the process already read, so both are warm alike; median of 21, alternated);
- memory: the process's RSS after all of that, minus that of the unfiltered NoShuffle case of
  the same size (same imports, same dataset; a fresh process each, so nothing is shared);
- for RowShuffle, last: the rows/s of hand-written ``dataset.take`` calls of as many random rows
  in sorted groups of the reader's full group size: Lance's random access slows as rows grow
  sparser in the file.

Datasets are written once to ``--cache`` and reused. Results accumulate in ``scale.json`` beside
the datasets (so sizes can be run in sections: ``--rows 1e6,1e7`` then ``--rows 1e8``) and the
table of every size measured so far is written to ``benchmarks/results/scale.md``.

    uv run python benchmarks/bench_scale.py --rows 1e6,1e7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent  # benchmarks/: the shared harness `common`
for path in (BENCH, BENCH.parent):  # ... and the repository root (lance_lightning, tests)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import common  # noqa: E402
from common import RESULTS_DIR, command_line, machine, peak_rss_mb, rss_mb, run_child  # noqa: E402

BATCH = 256
FILTER = "x % 10 = 0"
RESUME_REPS = 21  # a resume takes a few ms: the median of 5 moved by a quarter between runs
CASES = {  # name: (strategy class, arguments)
    "NoShuffle": ("NoShuffle", {}),
    "ShardShuffle": ("ShardShuffle", {"seed": 0}),
    "RowShuffle": ("RowShuffle", {"seed": 0}),
    "RowShuffle(64)": ("RowShuffle", {"seed": 0, "clump_rows": 64}),
    "BufferShuffle": ("BufferShuffle", {"seed": 0}),
}
TARGETS = (
    "setup + first batch <= 1 s (no filter); RowShuffle memory <= 64 MB; resume90/resume10 <= 1.2; "
    "memory with the filter <= 256 MB"
)


def measure_case(uri: str, case: str, filtered: bool, batches: int) -> dict:
    """One case, in this (fresh) process."""
    import lance_lightning as ll
    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.read.reader import group_rows

    name, kwargs = CASES[case]
    strategy = getattr(ll, name)(**kwargs)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["x"], filter=FILTER if filtered else None), shuffle=strategy, batch_size=BATCH
    )
    t0 = time.perf_counter()
    dm.setup("fit")
    t1 = time.perf_counter()
    loader = dm.train_dataloader()
    epoch = iter(loader)
    next(epoch)
    t2 = time.perf_counter()
    out = {"setup_s": t1 - t0, "first_s": t2 - t1}
    state = dict(loader.state_dict())
    if batches:  # the same epoch on from its first batch: read groups at their full size
        batches = min(batches, len(loader) - 1)
        started = time.perf_counter()
        for _ in range(batches):
            next(epoch)
        out["timed_batches"] = batches
        out["rows_per_s"] = batches * BATCH / (time.perf_counter() - started)
    del epoch
    rows = dm.plans["train"].matched_rows
    times: dict[float, list[float]] = {0.1: [], 0.9: []}
    for _ in range(RESUME_REPS):  # alternated, median of each: a few ms each, on a loaded machine
        for share in times:
            steps = int(rows * share) // BATCH
            loader.load_state_dict({**state, "rows_consumed": steps * BATCH, "steps": steps, "finished": False})
            started = time.perf_counter()
            next(iter(loader))
            times[share].append(time.perf_counter() - started)
    for share, spent in times.items():
        out[f"resume{int(share * 100)}_s"] = statistics.median(spent)
    out["rss_mb"] = rss_mb()
    out["peak_mb"] = peak_rss_mb()
    if batches and case == "RowShuffle":  # after the memory readings: its own handle and arrays
        plan = dm.plans["train"]
        out["raw_take_rows_per_s"] = raw_take_rate(uri, plan.source.total_rows, batches * BATCH, group_rows(plan))
    return out


def raw_take_rate(uri: str, rows: int, taken: int, group: int) -> float:
    """Rows/s of hand-written Lance takes of about ``taken`` random rows out of ``rows``, in sorted
    groups of ``group`` rows (the reader's full read group): the reference for the loader's
    RowShuffle rows/s."""
    import lance
    import numpy as np

    dataset = lance.dataset(uri)
    rng = np.random.default_rng(0)
    calls = max(1, round(taken / group))
    started = time.perf_counter()
    for _ in range(calls):
        dataset.take(np.sort(rng.choice(rows, group, replace=False)), columns=["x"])
    return calls * group / (time.perf_counter() - started)


def run_case(uri: str, case: str, filtered: bool, batches: int) -> dict:
    return run_child([__file__, "--one", uri, case, str(int(filtered)), str(batches)])


def render(results: dict) -> str:
    commands: dict[str, str] = {}  # each command once, with when it started
    for size in sorted(results, key=int):
        run = results[size].get("_run")
        if run:
            commands.setdefault(run["command"], run["when"])
    lines = [
        "# Scale: setup, first batch, memory and resume from 10^6 rows up",
        "",
        "Commands (sizes run in sections; results accumulate): "
        + "; ".join(f"`{command}` ({when})" for command, when in commands.items())
        + ".",
        f"Machine: {machine()}. One int64 column, batch {BATCH}, filter `{FILTER}` (10%), "
        "one process per case, warm page cache. Memory: RSS after the reads (first batch, the timed "
        "batches, resumes) minus the unfiltered NoShuffle case's of the same size.",
        f"Targets at the largest size: {TARGETS}; RowShuffle rows/s at 10^8 within 10% of 10^6.",
        "",
        "| rows | case | filter | setup s | first batch s | setup + first s | memory over NoShuffle MB "
        "| peak RSS MB | resume 10% s | resume 90% s | 90%/10% | rows/s | raw take rows/s | load |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sorted(results, key=int):
        cases = results[size]
        base = cases.get("NoShuffle|0", {}).get("rss_mb")
        for key, r in cases.items():
            if key.startswith("_"):
                continue
            case, filtered = key.split("|")
            over = f"{int(round(r['rss_mb'] - base))}" if base is not None else "?"
            rate = f"{r['rows_per_s']:,.0f}" if "rows_per_s" in r else ""
            raw = f"{r['raw_take_rows_per_s']:,.0f}" if "raw_take_rows_per_s" in r else ""
            lines.append(
                f"| 10^{len(size) - 1} | {case} | {'10%' if filtered == '1' else '—'} | {r['setup_s']:.3f} | "
                f"{r['first_s']:.3f} | {r['setup_s'] + r['first_s']:.3f} | {over} | {r['peak_mb']:.0f} | "
                f"{r['resume10_s']:.4f} | {r['resume90_s']:.4f} | {r['resume90_s'] / r['resume10_s']:.2f} | "
                f"{rate} | {raw} | {r['load']} |"
            )
    return "\n".join(lines + verdicts(results)) + "\n"


def verdicts(results: dict) -> list[str]:
    """Each target against the figures above: the largest size measured, and 10^8 vs 10^6 rows/s."""
    largest = results[max(results, key=int)]
    base = largest["NoShuffle|0"]["rss_mb"]
    cases = {key: r for key, r in largest.items() if not key.startswith("_")}
    checks = [
        (
            "setup + first batch, no filter, slowest strategy (s)",
            max(r["setup_s"] + r["first_s"] for k, r in cases.items() if k.endswith("|0")),
            "<=",
            1.0,
        ),
        ("RowShuffle memory over NoShuffle (MB)", cases["RowShuffle|0"]["rss_mb"] - base, "<=", 64),
        (
            "resume 90% / resume 10%, highest case",
            max(r["resume90_s"] / r["resume10_s"] for r in cases.values()),
            "<=",
            1.2,
        ),
        (
            "memory over NoShuffle with the filter, highest strategy (MB)",
            max(r["rss_mb"] - base for k, r in cases.items() if k.endswith("|1")),
            "<=",
            256,
        ),
    ]
    small, big = (
        results.get("1000000", {}).get("RowShuffle|0", {}),
        results.get("100000000", {}).get("RowShuffle|0", {}),
    )
    if "rows_per_s" in small and "rows_per_s" in big:
        checks.append(("RowShuffle rows/s at 10^8 / at 10^6", big["rows_per_s"] / small["rows_per_s"], ">=", 0.9))
    lines = [
        "",
        f"## Targets at 10^{len(max(results, key=int)) - 1} rows",
        "",
        "| target | measured | bound | verdict |",
        "|---|---:|---:|---|",
    ]
    for name, value, sense, bound in checks:
        ok = value <= bound if sense == "<=" else value >= bound
        lines.append(f"| {name} | {value:.2f} | {sense} {bound} | {'PASS' if ok else 'FAIL'} |")
    if "rows_per_s" in small and "rows_per_s" in big:
        lines += [
            "",
            "RowShuffle's rows/s follow Lance's own take at the share of the rows a read group takes "
            "(`raw take` above, and `benchmarks/probes/probe_take_density.py` -> `take_density.md`): a group of "
            "bounded memory takes a smaller share of a larger table.",
        ]
    lines += ["", *rates_by_size(results)]
    return lines


def rates_by_size(results: dict) -> list[str]:
    """Each strategy's rows/s without the filter at every size, and as a share of its rows/s at the
    smallest size (not a target: how each strategy's reads scale)."""
    sizes = sorted(results, key=int)
    header = " | ".join(f"10^{len(size) - 1}" for size in sizes)
    lines = [
        "## Rows/s without a filter, by size (share of the smallest size)",
        "",
        f"| case | {header} |",
        f"|---|{'---:|' * len(sizes)}",
    ]
    for case in CASES:
        rates = [results[size].get(f"{case}|0", {}).get("rows_per_s") for size in sizes]
        if rates[0] is None:
            continue
        cells = [f"{rate:,.0f} ({rate / rates[0]:.2f})" if rate else "" for rate in rates]
        lines.append(f"| {case} | {' | '.join(cells)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1e6,1e7", help="comma-separated sizes, e.g. 1e6,1e7,1e8")
    parser.add_argument("--cache", default=str(common.SCALE_CACHE), help="where datasets are written once")
    parser.add_argument("--batches", type=int, default=12000, help="batches timed for rows/s in each unfiltered case")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="smoke run: 10^6 rows, printed, scale.md untouched")
    parser.add_argument("--results", help="results file (default: scale.json in --cache)")
    parser.add_argument("--render-only", action="store_true", help="only write scale.md from the results file")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        uri, case, filtered, batches = args.one
        print(json.dumps(measure_case(uri, case, filtered == "1", int(batches))))
        return
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.rows, args.results = "1e6", str(cache / "scale_quick.json")
    store = Path(args.results) if args.results else cache / "scale.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    for size in () if args.render_only else (int(float(s)) for s in args.rows.split(",")):
        uri = common.scale_dataset(cache, size)
        cases = results.setdefault(str(size), {})
        cases["_run"] = {"command": command_line(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        for case in ["NoShuffle", *(c for c in args.cases.split(",") if c != "NoShuffle")]:
            for filtered in (False, True):
                load = common.load_average(" ")
                r = run_case(uri, case, filtered, 0 if filtered else args.batches)
                r["load"] = load
                cases[f"{case}|{int(filtered)}"] = r
                print(
                    size,
                    case,
                    filtered,
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()},
                    file=sys.stderr,
                )
                store.write_text(json.dumps(results, indent=1))
    if args.quick:
        print(render(results))
    else:
        common.write_result(RESULTS_DIR / "scale.md", render(results))


if __name__ == "__main__":
    main()
