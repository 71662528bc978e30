"""Tuning benchmark, the items: the ten measurements of the ``tuning`` study, numbered as in its result
table; each adds its `Figure` rows, raw figures and notes to the `Tuning` it is given and measures
nothing else.

Item 1 scores shuffle quality with the functions of tests/unit/plan/test_shuffle_quality.py; items
2-9 time the plugin's loaders on the vector or image table; item 10 times `Trainer.fit` through
`benchmarks.studies.metrics`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import lance
import numpy as np

from benchmarks.harness.timing import iterate
from benchmarks.studies.metrics import FIT_STEPS, fit_rates, fit_runs
from benchmarks.studies.transforms_workloads import decode
from benchmarks.studies.tuning_harness import (
    BATCH,
    COLUMNS,
    FILTERS,
    IMAGE_COLUMNS,
    SELECTIVITIES,
    TAKE_BATCHES,
    Figure,
    PythonLoop,
    Tuning,
    count,
    loader,
)
from lance_lightning import BufferShuffle, FilterRead, LanceSource, RowShuffle, ShardShuffle
from lance_lightning.materialize.view import materialize
from lance_lightning.metrics.figures import figures
from tests.helpers import write_dataset
from tests.unit.plan.test_shuffle_quality import BATCH_SIZE as QUALITY_BATCH
from tests.unit.plan.test_shuffle_quality import (
    CLASSES,
    EPOCHS,
    perfect_shuffle_entropy,
    read_label_batches,
    shuffle_score,
)
from tests.unit.plan.test_shuffle_quality import ROWS as QUALITY_ROWS


def shuffle_quality(t: Tuning, work: Path) -> None:
    uri = write_dataset(
        work / "sorted.lance", QUALITY_ROWS, fragment_rows=4096, sorted_labels=True, label_classes=CLASSES
    )
    labels = np.repeat(np.arange(CLASSES), QUALITY_ROWS // CLASSES)
    reference = perfect_shuffle_entropy(labels, QUALITY_BATCH)
    for shard_rows in (1024, 256):
        score = np.mean(
            [
                shuffle_score(read_label_batches(uri, ShardShuffle(shard_rows, seed=0), epoch), reference)
                for epoch in EPOCHS
            ]
        )
        t.add(
            Figure(
                1,
                f"ShardShuffle(shard_rows={shard_rows}) mixing on sorted data",
                f"{score:.3f}",
                "perfect shuffle",
                "1.000",
                f"{score:.3f}",
            )
        )
    t.notes.append(
        f"[1] score of tests/unit/plan/test_shuffle_quality.py (functions imported from it): {QUALITY_ROWS:,} rows "
        f"sorted by label, {CLASSES} classes, batch {QUALITY_BATCH}, mean per-batch label entropy / a "
        f"perfect shuffle's ({reference:.3f} bits), mean over epochs {list(EPOCHS)}; the 256-row row "
        "re-measures the published shuffle_quality.md figure as a check"
    )


def clumps(t: Tuning, uri: str) -> None:
    clump8 = iterate(loader(uri, shuffle=RowShuffle(clump_rows=8)))
    t.rate(
        2,
        "RowShuffle(clump_rows=8), full epoch",
        clump8,
        f"RowShuffle(clump_rows=1), {TAKE_BATCHES} batches",
        iterate(loader(uri, shuffle=RowShuffle(clump_rows=1)), batches=TAKE_BATCHES),
    )
    t.rate(2, "RowShuffle(clump_rows=8), full epoch", clump8, "NoShuffle, full epoch", iterate(loader(uri)))


def filtered_strategies(t: Tuning, uri: str) -> None:
    strategies = {
        "ShardShuffle()": ShardShuffle,
        "RowShuffle(clump_rows=64)": lambda: RowShuffle(clump_rows=64),
        "BufferShuffle()": BufferShuffle,
    }
    for name, make in strategies.items():
        unfiltered = iterate(loader(uri, shuffle=make()))
        for share, filter in FILTERS.items():
            filtered = loader(uri, shuffle=make(), filter=filter)
            plan = filtered.dataset.plan
            t.rate(
                3,
                f"{name}, filter `{filter}` ({share}, read by {plan.method})",
                iterate(filtered),
                f"{name}, no filter",
                unfiltered,
            )


def scalar_index(t: Tuning, uri: str) -> None:
    ds = lance.dataset(uri)
    for share, filter in FILTERS.items():
        t.duration(
            4,
            f"count rows of `{filter}` ({share}), BITMAP index",
            lambda f=filter: count(ds, f, True),
            "without the index (use_scalar_index=False)",
            lambda f=filter: count(ds, f, False),
        )
        t.duration(
            4,
            f"list matching positions of `{filter}` ({share}), BITMAP index",
            lambda f=filter: ds.to_table(columns=["_rowoffset"], filter=f),
            "without the index (use_scalar_index=False)",
            lambda f=filter: ds.to_table(columns=["_rowoffset"], filter=f, use_scalar_index=False),
        )
    t.notes.append(
        "[4] counting = `ds.scanner(columns=[], with_row_id=True, filter=..., use_scalar_index=...)"
        ".count_rows()` (what `ds.count_rows(filter)` runs with the index; with a string filter pylance "
        "14.0.2's `count_rows` drops its keyword arguments, so the index cannot be switched off there); "
        "listing = `ds.to_table(columns=['_rowoffset'], filter=...)`, the call the plugin's setup makes; "
        "both sides on the same dataset, the index switched off per call"
    )


def materialized_view(t: Tuning, uri: str, work: Path) -> None:
    started = time.perf_counter()
    view = materialize(LanceSource(uri, columns=COLUMNS), work / "views", shuffle_seed=0)
    copy_s = time.perf_counter() - started
    rows = lance.dataset(view).count_rows()
    result = t.rate(
        5,
        "ShardShuffle() on a view pre-shuffled with shuffle_seed=0",
        iterate(loader(view, shuffle=ShardShuffle())),
        f"RowShuffle() on the source, {TAKE_BATCHES} batches",
        iterate(loader(uri, shuffle=RowShuffle()), batches=TAKE_BATCHES),
    )
    epoch_s = rows / result.base_rows_per_s
    t.add(
        Figure(
            5,
            f"one-off copy of {rows:,} rows to the view",
            f"{copy_s:.2f} s",
            "one RowShuffle() epoch on the source",
            f"{epoch_s:.2f} s",
            "—",
        )
    )
    t.notes.append(f"[5] the copy took {copy_s / epoch_s:.2f} source RowShuffle() epochs (local disk, warm cache)")


def transforms_on_threads_or_workers(t: Tuning, image_uri: str) -> None:
    for name, transform in (("GIL-holding Python loop", PythonLoop(2000)), ("DecodeImage", decode())):
        threads = iterate(loader(image_uri, columns=IMAGE_COLUMNS, transform=transform, reader_threads=2))
        workers_loader = loader(
            image_uri, columns=IMAGE_COLUMNS, transform=transform, num_workers=2, multiprocessing_context="forkserver"
        )
        workers = iterate(workers_loader)
        workers()  # start the persistent worker processes outside the timings
        t.rate(
            6, f"{name}: num_workers=0, reader_threads=2", threads, "num_workers=2 (forkserver, persistent)", workers
        )
    t.notes.append(
        "[6] image table, batch 256; the Python loop adds 2,000 integers per row; the worker processes "
        "keep the default reader_threads (2 each)"
    )


def prefetch_depth(t: Tuning, image_uri: str, epochs: int) -> None:
    depths = (2, 4, 8)
    loaders = {
        d: loader(image_uri, batch_size=128, columns=IMAGE_COLUMNS, transform=decode(), prefetch_batches=d)
        for d in depths
    }
    fractions: dict[int, list[float]] = {d: [] for d in depths}
    for rep in range(t.reps):
        for depth in depths[rep % 3 :] + depths[: rep % 3]:  # rotate which depth goes first
            before = loaders[depth].metrics_snapshot()
            for _ in range(epochs):
                for _batch in loaders[depth]:
                    time.sleep(0.020)
            fractions[depth].append(figures(loaders[depth].metrics_snapshot().minus(before))["wait_fraction"])
    t.raw.append(
        "- [7] wait fraction per repetition: "
        + "; ".join(f"depth {d}: " + ", ".join(f"{f:.1%}" for f in fractions[d]) for d in depths)
    )
    default = statistics.median(fractions[4])
    for depth in depths:
        value = statistics.median(fractions[depth])
        t.add(
            Figure(
                7,
                f"prefetch_batches={depth}: wait fraction of a 20 ms step",
                f"{value:.1%}",
                "prefetch_batches=4 (default)",
                f"{default:.1%}",
                "—",
            )
        )
    t.notes.append(
        f"[7] image table, batch 128, DecodeImage on 2 reader threads, NoShuffle, {epochs} epochs per "
        "measurement, a `time.sleep(0.020)` step; wait fraction = `metrics.figures(...)['wait_fraction']` "
        "(wait / (wait + step), the first batch excluded)"
    )


def take_batch_size(t: Tuning, uri: str) -> None:
    rows = TAKE_BATCHES * BATCH
    t.rate(
        8,
        f"RowShuffle() B=1024, first {rows:,} rows",
        iterate(loader(uri, batch_size=1024, shuffle=RowShuffle()), batches=rows // 1024),
        f"RowShuffle() B=256, first {rows:,} rows",
        iterate(loader(uri, shuffle=RowShuffle()), batches=rows // BATCH),
    )


def scan_or_take(t: Tuning, uri: str) -> None:
    for share, filter in SELECTIVITIES.items():
        take = loader(uri, filter=filter, filter_read=FilterRead(method="take"))
        scan = loader(uri, filter=filter, filter_read=FilterRead(method="scan"))
        t.rate(
            9,
            f"`{filter}` ({share}, {take.dataset.plan.selectivity:.2%}): take, epoch",
            iterate(take),
            "scan with the filter, epoch",
            iterate(scan),
        )
    t.notes.append(
        "[9] NoShuffle, batch 256; the plan's default is `FilterRead(take_below=0.05)`: take below 5% "
        "of the rows; the 0.5% filter's `id % 2` part is not indexed"
    )


def monitor(t: Tuning, uri: str, work: Path) -> None:
    runs = fit_runs(uri, COLUMNS, work / "logs")
    fits, _ = fit_rates({kind: runs[kind] for kind in ("trivial/monitor", "trivial/none")}, 3 * t.reps)  # short, noisy
    result = fits["trivial/monitor"]
    t.raw.append("- [10] fit rows/s (monitor / none): " + ", ".join(f"{c:,.0f} / {b:,.0f}" for c, b in result.raw))
    t.add(
        Figure(
            10,
            "Trainer.fit with DataLoadingMonitor, metrics on: step time",
            f"{1e3 * BATCH / result.rows_per_s:.3f} ms",
            "no monitor, metrics off",
            f"{1e3 * BATCH / result.base_rows_per_s:.3f} ms",
            f"{result.ratio:.2f}",
        )
    )
    t.notes.append(
        f"[10] `bench_metrics.fit_runs`: fits of {FIT_STEPS:,} steps of {BATCH} rows of a 1-weight "
        "model, the monitor logging to a CSVLogger every 50 steps, timed from the first to the last "
        f"batch, {3 * t.reps} pairs; the ratio is rows/s, i.e. step time without / with the monitor"
    )
