"""Mixture benchmark: the position -> (source, row) map is O(1), and reading a mixture costs what
a row shuffle's takes cost.

1. The map alone (no I/O): `MixturePlan.units` on batches of ``--batch`` positions at 10% and 90%
   of an epoch, for mixtures of three sources of 10^6 and 10^9 rows each (RowShuffle). O(1) per
   position means the same positions/s whatever the source size and the position.
2. Reading: the first ``--batches`` batches of a two-source mixture (two datasets of ``--rows``
   rows x 128 floats, weights 0.7/0.3) through `LanceDataModule`'s train loader, against the same
   number of batches of a plain `RowShuffle` source (one take per read group too).

Usage (from the repository root)::

    uv run python benchmarks/bench_mixture.py            # writes benchmarks/results/mixture.md
    uv run python benchmarks/bench_mixture.py --quick    # smoke run (same file, smaller data)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent  # benchmarks/: the shared harness `common`
for path in (BENCH, BENCH.parent):  # ... and the repository root (lance_lightning, tests)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from common import DEFAULT_CACHE, RESULTS_DIR, command_line, machine, vec_dataset, write_result  # noqa: E402

from lance_lightning import LanceDataModule, LanceMixture, LanceSource, RowShuffle  # noqa: E402
from lance_lightning.plan.blocks import block_counts, epoch_positions  # noqa: E402
from lance_lightning.plan.mixture_plan import MixturePlan  # noqa: E402
from lance_lightning.plan.planner import ReadPlan  # noqa: E402
from lance_lightning.source import PinnedSource  # noqa: E402


def _pure_plan(rows: int) -> MixturePlan:
    names, weights, block = ("a", "b", "c"), (0.5, 0.3, 0.2), 10_000
    counts = block_counts(list(weights), block, list(names))
    strategy = RowShuffle(seed=0)
    plans = tuple(
        ReadPlan("train", PinnedSource(f"/x/{n}.lance", 1, ("id",), None, rows), strategy, "take", rows, 256, True, "")
        for n in names
    )
    positions = epoch_positions("first_exhausted", None, [rows] * 3, counts, block)
    return MixturePlan(
        "train", plans, names, weights, tuple(counts), block, "first_exhausted", None, strategy, 256, True, positions
    )


def bench_map(batch: int, repeats: int) -> list[str]:
    lines = [f"| rows per source | epoch position | positions/s (median of {repeats}) |", "|---:|---:|---:|"]
    for rows in (10**6, 10**9):
        plan = _pure_plan(rows)
        for fraction in (0.1, 0.9):
            first = int(plan.matched_rows * fraction)
            positions = np.arange(first, first + batch, dtype=np.int64)
            plan.units(0, positions)  # warm
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                plan.units(0, positions)
                times.append(time.perf_counter() - started)
            lines.append(f"| {rows:,} | {fraction:.0%} | {batch / statistics.median(times):,.0f} |")
    return lines


def _rows_per_s(dm: LanceDataModule, batches: int) -> float:
    loader = dm.train_dataloader()
    started, rows = time.perf_counter(), 0
    for _, batch in zip(range(batches), loader):
        rows += len(batch["id"])
    return rows / (time.perf_counter() - started)


def bench_read(cache: Path, rows: int, batches: int, batch_size: int, repeats: int) -> list[str]:
    a = vec_dataset(cache / "mix_a", rows)
    b = vec_dataset(cache / "mix_b", rows)
    columns = ["id", "vec"]
    results: dict[str, list[float]] = {"mixture": [], "row shuffle": []}
    for _ in range(repeats):  # interleaved
        mixture = LanceMixture([LanceSource(a, columns), LanceSource(b, columns)], [0.7, 0.3], block=1000)
        dm = LanceDataModule(train=mixture, batch_size=batch_size, shuffle=RowShuffle(seed=0))
        results["mixture"].append(_rows_per_s(dm, batches))
        dm = LanceDataModule(train=LanceSource(a, columns), batch_size=batch_size, shuffle=RowShuffle(seed=0))
        results["row shuffle"].append(_rows_per_s(dm, batches))
    mix, plain = (statistics.median(results[k]) for k in ("mixture", "row shuffle"))
    return [
        f"| reader | rows/s (median of {repeats}) |",
        "|---|---:|",
        f"| mixture of 2 sources (0.7/0.3), RowShuffle | {mix:,.0f} |",
        f"| one source, RowShuffle | {plain:,.0f} |",
        "",
        f"Ratio mixture / one source: {mix / plain:.2f}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4096, help="positions per map call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--quick", action="store_true", help="smoke run: 50k rows, 20 batches, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.batches, args.repeats = 50_000, 20, 3
    started = time.perf_counter()
    text = [
        "# Mixtures: the position map and reading",
        "",
        f"Generated by `{command_line()}` ({machine()}); {{elapsed}}. The machine was shared with other jobs.",
        "",
        "## The map alone (no I/O)",
        "",
        f"`MixturePlan.units` on {args.batch:,} consecutive positions (3 sources, block 10,000, RowShuffle):",
        "",
        *bench_map(args.batch, args.repeats),
        "",
        "## Reading",
        "",
        f"The first {args.batches} batches of {args.batch_size} rows (id + 128 floats) through the train loader;"
        f" datasets of {args.rows:,} rows each:",
        "",
        *bench_read(args.cache, args.rows, args.batches, args.batch_size, args.repeats),
        "",
    ]
    out = "\n".join(text).replace("{elapsed}", f"{time.perf_counter() - started:.0f} s")
    print(out)
    write_result(RESULTS_DIR / "mixture.md", out)


if __name__ == "__main__":
    main()
