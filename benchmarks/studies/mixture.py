"""Mixture benchmark: the position -> (source, row) map is O(1), and reading a mixture costs what
a row shuffle's takes cost.

1. The map alone (no I/O): `MixturePlan.units` on batches of ``batch`` positions at 10% and 90%
   of an epoch, for mixtures of three sources of 10^6 and 10^9 rows each (RowShuffle). O(1) per
   position means the same positions/s whatever the source size and the position.
2. Reading: the first ``batches`` batches of a two-source mixture (two datasets of ``rows``
   rows x 128 floats, weights 0.7/0.3) through `LanceDataModule`'s train loader, against the same
   number of batches of a plain `RowShuffle` source (one take per read group too).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.common import vec_dataset
from benchmarks.harness import tables
from benchmarks.harness.study import Params
from benchmarks.harness.timing import iterate
from lance_lightning import LanceDataModule, LanceMixture, LanceSource, RowShuffle
from lance_lightning.plan.blocks import block_counts, epoch_positions
from lance_lightning.plan.mixture_plan import MixturePlan
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.source import PinnedSource


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
    body = []
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
            body.append((rows, fraction, batch / statistics.median(times)))
    return tables.table(f"rows per source | epoch position | positions/s (median of {repeats})", ">, >.0% >,.0f", body)


def _rows_per_s(dm: LanceDataModule, batches: int) -> float:
    loader = dm.train_dataloader()
    started = time.perf_counter()
    return iterate(loader, batches)() / (time.perf_counter() - started)


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
        *tables.table(
            f"reader | rows/s (median of {repeats})",
            "< >,.0f",
            [("mixture of 2 sources (0.7/0.3), RowShuffle", mix), ("one source, RowShuffle", plain)],
        ),
        "",
        f"Ratio mixture / one source: {mix / plain:.2f}.",
    ]


def measure(p: Params) -> str:
    lines = [
        "## The map alone (no I/O)",
        "",
        f"`MixturePlan.units` on {p.batch:,} consecutive positions (3 sources, block 10,000, RowShuffle):",
        "",
        *bench_map(p.batch, p.reps),
        "",
        "## Reading",
        "",
        f"The first {p.batches} batches of {p.batch_size} rows (id + 128 floats) through the train loader;"
        f" datasets of {p.rows:,} rows each:",
        "",
        *bench_read(p.cache, p.rows, p.batches, p.batch_size, p.reps),
    ]
    return "\n".join(lines)
