"""Tuning benchmark: the figures behind the recommendations in docs/performance.md and
docs/choosing-a-plan.md that no other benchmark measures.

Every rate is a ratio of two measurements taken back to back in this run (`benchmarks.harness.timing.paired`:
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

The items are in `benchmarks.studies.tuning_items`, the paired measurements and the table rows in
`benchmarks.studies.tuning_harness`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import lance

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.study import Params
from benchmarks.studies.read import raw_scan
from benchmarks.studies.tuning_harness import BATCH, COLUMNS, IMAGE_COLUMNS, Tuning
from benchmarks.studies.tuning_items import (
    clumps,
    filtered_strategies,
    materialized_view,
    monitor,
    prefetch_depth,
    scalar_index,
    scan_or_take,
    shuffle_quality,
    take_batch_size,
    transforms_on_threads_or_workers,
)


def run(args: Params) -> Tuning:
    cache = args.cache
    uri = common.vec_dataset(cache, args.rows)
    image_uri = common.image_dataset(cache, args.image_rows)
    t = Tuning(args.reps, args.min_seconds)
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
    heads = "# | scenario | measured | baseline | baseline measured | ratio"
    rows = [(f.item, f.scenario, f.value, f.baseline, f.base_value, f.ratio) for f in t.figures]
    return "\n".join(tables.table(heads, "> < > < > >", rows))


def measure(p: Params) -> str:
    t = run(p)
    return "\n".join(
        [
            "Only ratios are meaningful (a shared machine). Rates: both sides "
            f"measured back to back {p.reps} times (alternating order), each measurement repeated until it ran "
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
        ]
    )
