"""Tuning benchmark: the figures behind the recommendations in docs/performance.md and
docs/choosing-a-plan.md that no other benchmark measures.

Every rate is a ratio of two measurements taken back to back in this run (`common.paired`:
interleaved, alternating order, median of the per-repetition ratios); a ratio above 1 means the
scenario is faster than its baseline. Shuffle quality and wait fractions are not rates: they are
reported as measured (the medians of the repetitions for the wait fractions).

Items (numbered as in the result table):
 1. shuffle quality of ``ShardShuffle(shard_rows=1024)`` (the metric of tests/unit/plan/test_shuffle_quality.py);
 2. ``RowShuffle(clump_rows=8)`` against ``clump_rows=1`` and ``NoShuffle``;
 3. ShardShuffle / RowShuffle(64) / BufferShuffle with a 1% and a 50% filter, against no filter;
 4. counting and listing the rows of a filter with and without the BITMAP scalar index;
 5. ``ShardShuffle`` on a pre-shuffled materialized view against ``RowShuffle`` on the source;
 6. a GIL-holding Python transform and ``DecodeImage``: 2 reader threads against 2 worker processes;
 7. the step's wait fraction for ``prefetch_batches`` 2, 4 and 8 (20 ms sleeping step, DecodeImage);
 8. ``RowShuffle`` at batch size 256 against 1024;
 9. ``FilterRead(method='scan')`` against ``'take'`` from 0.5% to 20% of the rows;
10. ``Trainer.fit`` with `DataLoadingMonitor` (metrics on) against no monitor (metrics off).

Usage (from the repository root; under the shared lock)::

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_tuning.py           # ~3-5 minutes on 2 cores
    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_tuning.py --quick   # smoke run

Writes ``benchmarks/results/tuning.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `common`, the other benchmarks, `tests` and `lance_lightning`
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import common  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_metrics import FIT_STEPS, fit_rates, fit_runs  # noqa: E402
from bench_read import iterate, raw_scan  # noqa: E402
from bench_transforms import decode  # noqa: E402

from lance_lightning import (  # noqa: E402
    BufferShuffle,
    FilterRead,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
)
from lance_lightning.materialize.view import materialize  # noqa: E402
from lance_lightning.metrics.figures import figures  # noqa: E402
from tests.helpers import write_dataset  # noqa: E402
from tests.unit.plan.test_shuffle_quality import (  # noqa: E402
    BATCH_SIZE as QUALITY_BATCH,
)
from tests.unit.plan.test_shuffle_quality import (
    CLASSES,
    EPOCHS,
    perfect_shuffle_entropy,
    read_label_batches,
    shuffle_score,
)
from tests.unit.plan.test_shuffle_quality import (
    ROWS as QUALITY_ROWS,
)

COLUMNS = ["id", "label", "vec"]
IMAGE_COLUMNS = ["image", "label"]
BATCH = 256
#: Batches timed for single-row takes (about 50k rows/s): a whole epoch would dominate the run.
TAKE_BATCHES = 60
FILTERS = {"1%": "label = 7", "50%": "label < 50"}
#: Selectivity -> filter on the vector table (label: 100 values, uniform; BITMAP index).
SELECTIVITIES = {
    "0.5%": "label = 0 AND id % 2 = 0",
    "1%": "label = 0",
    "2%": "label < 2",
    "5%": "label < 5",
    "10%": "label < 10",
    "20%": "label < 20",
}


@dataclass
class Figure:
    """One line of the result table (values already formatted)."""

    item: int
    scenario: str
    value: str
    baseline: str
    base_value: str
    ratio: str


class PythonLoop:
    """A GIL-holding transform: a pure-Python loop of ``iterations`` additions per row."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations

    def __call__(self, batch: dict) -> dict:
        total = 0
        for _ in range(len(batch["label"])):
            for i in range(self.iterations):
                total += i
        batch["loop_total"] = torch.tensor(total)
        return batch


def loader(uri: str, batch_size: int = BATCH, shuffle=None, filter: str | None = None, columns=COLUMNS, **settings):
    """The plugin's train loader (set up outside the timings) with data-module ``settings``."""
    dm = LanceDataModule(
        train=LanceSource(uri, columns=list(columns), filter=filter),
        batch_size=batch_size,
        shuffle=shuffle or NoShuffle(),
        **{"num_workers": 0, **settings},
    )
    dm.setup("fit")
    return dm.train_dataloader()


def count(ds: lance.LanceDataset, filter: str, use_index: bool) -> int:
    """Rows matching ``filter``, with or without the scalar index."""
    return ds.scanner(columns=[], with_row_id=True, filter=filter, use_scalar_index=use_index).count_rows()


def calls(fn: Callable[[], object]) -> Callable[[], int]:
    """``fn`` counted as one unit per call (so `common.paired` yields calls/s)."""

    def run() -> int:
        fn()
        return 1

    return run


class Tuning:
    def __init__(self, reps: int, min_seconds: float) -> None:
        self.reps, self.min_seconds = reps, min_seconds
        self.figures: list[Figure] = []
        self.raw: list[str] = []
        self.notes: list[str] = []

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        print(
            f"  [{figure.item}] {figure.scenario}: {figure.value} | {figure.baseline}: {figure.base_value} | "
            f"ratio {figure.ratio}",
            flush=True,
        )

    def rate(self, item: int, scenario: str, candidate, baseline_name: str, baseline) -> common.Paired:
        """Rows/s of two loaders or reads, paired; ratio = candidate / baseline."""
        result = common.paired(candidate, baseline, self.reps, self.min_seconds)
        self.raw.append(
            f"- [{item}] {scenario} vs {baseline_name}: " + ", ".join(f"{c:,.0f} / {b:,.0f}" for c, b in result.raw)
        )
        self.add(
            Figure(
                item,
                scenario,
                f"{result.rows_per_s:,.0f} rows/s",
                baseline_name,
                f"{result.base_rows_per_s:,.0f} rows/s",
                f"{result.ratio:.2f}",
            )
        )
        return result

    def duration(self, item: int, scenario: str, candidate, baseline_name: str, baseline) -> common.Paired:
        """Time per call of two functions, paired; ratio = baseline time / candidate time."""
        result = common.paired(calls(candidate), calls(baseline), self.reps, self.min_seconds)
        self.raw.append(
            f"- [{item}] {scenario} vs {baseline_name} (ms per call): "
            + ", ".join(f"{1e3 / c:.2f} / {1e3 / b:.2f}" for c, b in result.raw)
        )
        self.add(
            Figure(
                item,
                scenario,
                f"{1e3 / result.rows_per_s:.2f} ms",
                baseline_name,
                f"{1e3 / result.base_rows_per_s:.2f} ms",
                f"{result.ratio:.2f}",
            )
        )
        return result


# -- the items -----------------------------------------------------------------------------------
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


# -- the run ----------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> Tuning:
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    uri = common.vec_dataset(cache, args.rows)
    image_uri = common.image_dataset(cache, args.image_rows)
    t = Tuning(args.reps, args.min_seconds if args.min_seconds is not None else (0.2 if args.quick else 0.5))
    t.notes.append(
        f"vector table {uri}: {args.rows:,} rows, columns {COLUMNS}, BITMAP index on label (100 values); "
        f"image table {image_uri}: {args.image_rows:,} JPEGs of {common.IMAGE_SIDE}x{common.IMAGE_SIDE}; "
        f"loaders: num_workers=0, reader_threads=2 unless stated, batch {BATCH}"
    )
    raw_scan(lance.dataset(uri), COLUMNS, 8192, convert=False)()  # warm the page cache
    raw_scan(lance.dataset(image_uri), IMAGE_COLUMNS, 8192, convert=False)()
    steps = [
        ("shuffle quality", lambda w: shuffle_quality(t, w)),
        ("clumps", lambda w: clumps(t, uri)),
        ("filters per strategy", lambda w: filtered_strategies(t, uri)),
        ("scalar index", lambda w: scalar_index(t, uri)),
        ("materialized view", lambda w: materialized_view(t, uri, w)),
        ("threads or workers", lambda w: transforms_on_threads_or_workers(t, image_uri)),
        ("prefetch depth", lambda w: prefetch_depth(t, image_uri, 1 if args.quick else 2)),
        ("take batch size", lambda w: take_batch_size(t, uri)),
        ("scan or take", lambda w: scan_or_take(t, uri)),
        ("monitor", lambda w: monitor(t, uri, w)),
    ]
    with tempfile.TemporaryDirectory(dir=cache) as work:
        for number, (name, step) in enumerate(steps, 1):
            print(f"\n[{number}/{len(steps)}] {name}", flush=True)
            started = time.perf_counter()
            step(Path(work))
            t.notes.append(f"[{number}] took {time.perf_counter() - started:.0f} s")
    return t


def markdown(t: Tuning) -> str:
    lines = ["| # | scenario | measured | baseline | baseline measured | ratio |", "|---:|---|---:|---|---:|---:|"]
    lines += [f"| {f.item} | {f.scenario} | {f.value} | {f.baseline} | {f.base_value} | {f.ratio} |" for f in t.figures]
    return "\n".join(lines)


def write_results(path: Path, t: Tuning, args: argparse.Namespace, elapsed: float) -> None:
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    kind = "QUICK smoke run (not the reference figures)" if args.quick else "full run"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n".join(
            [
                "# Tuning benchmark",
                "",
                f"{stamp}, {kind}, {elapsed:.0f} s. Command: `{common.command_line()}` (run under "
                "`flock /tmp/bench.lock`)",
                "",
                f"Machine: {common.machine()}; shared with other jobs, so only ratios are meaningful. Rates: both sides "
                f"measured back to back {args.reps} times (alternating order), each measurement repeated until it ran "
                f"{t.min_seconds:g} s; medians of each side, ratio = median of the per-repetition ratios, above 1 = the "
                "scenario is faster than its baseline (for times: baseline time / scenario time).",
                "",
                markdown(t),
                "",
                "## Notes",
                "",
                *[f"- {note}" for note in t.notes],
                "",
                "## Raw figures per repetition (scenario / baseline)",
                "",
                *t.raw,
                "",
            ]
        )
    )
    print(f"\nwrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, short measurements: a smoke run")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the vector table")
    parser.add_argument("--image-rows", type=int, default=5_000, help="rows of the image table")
    parser.add_argument("--reps", type=int, default=None, help="paired repetitions (default 3, 1 with --quick)")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="each measurement repeats until it ran this long (default 0.5 s, 0.2 s with --quick)",
    )
    parser.add_argument("--cache-dir", default=str(common.DEFAULT_CACHE), help="where the datasets are kept")
    parser.add_argument("--out", default=str(common.RESULTS_DIR / "tuning.md"), help="the result file")
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"command: {common.command_line()}")
    print(f"machine: {common.machine()}", flush=True)
    started = time.perf_counter()
    t = run(args)
    elapsed = time.perf_counter() - started
    print()
    print(markdown(t))
    write_results(Path(args.out), t, args, elapsed)
    print(f"command: {common.command_line()}  ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
