"""Read-planning benchmark: the plugin's train loader against raw Lance reads of the same rows.

Every figure is a ratio of two measurements taken back to back in this run (see
`common.paired`): the plugin (``LanceDataModule(...).train_dataloader()``, ``num_workers=0``,
full conversion to tensors) against the plain Lance call a user would write by hand for the
same rows, with the same zero-copy conversion (`lance_lightning.to_torch_batch`).

Usage (from the repository root)::

    uv run python benchmarks/bench_read.py            # 1M rows, ~3-5 minutes on 2 cores
    uv run python benchmarks/bench_read.py --quick    # 200k rows, smoke run, < 2 minutes
    uv run python benchmarks/bench_read.py --peer-filters  # only filtered reads vs lance.torch (read_filters.py)

Writes ``benchmarks/results/read.md`` (table + raw rows/s) and ``benchmarks/results/read.png``;
with ``--peer-filters``, only the section of ``benchmarks/results/filter_scan.md`` between its markers.
Exit status is 0 even when a target fails (the table says FAIL); ``--strict`` exits 1 then.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `common` and `lance_lightning` from a plain checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import common  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from common import Paired, Row, iterate, paired  # noqa: E402 (tuning_items imports iterate from here)

from lance_lightning import (  # noqa: E402
    BufferShuffle,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    to_torch_batch,
)
from lance_lightning.read.reader import PlanReader  # noqa: E402

COLUMNS = ["id", "label", "vec"]
IMAGE_COLUMNS = ["image", "label"]
BATCH = 256


# -- the two sides of each comparison ---------------------------------------------------------
def train_loader(uri: str, batch_size: int, shuffle=None, filter: str | None = None, columns=COLUMNS):
    """The plugin's train loader (set up once, outside the timings) and its data module."""
    dm = LanceDataModule(
        train=LanceSource(uri, columns=list(columns), filter=filter),
        batch_size=batch_size,
        shuffle=shuffle or NoShuffle(),
        num_workers=0,
    )
    dm.setup("fit")
    return dm, dm.train_dataloader()


def raw_scan(
    ds: lance.LanceDataset, columns, batch_size: int, convert: bool = True, filter: str | None = None
) -> Callable[[], int]:
    """``ds.scanner(columns, batch_size, filter).to_batches()`` (+ `to_torch_batch` per batch)."""

    def run() -> int:
        rows = 0
        for batch in ds.scanner(columns=list(columns), batch_size=batch_size, filter=filter).to_batches():
            if convert:
                to_torch_batch(batch)
            rows += batch.num_rows
        return rows

    return run


def raw_take(ds: lance.LanceDataset, columns, batches: list[np.ndarray]) -> Callable[[], int]:
    """One ``ds.take(sorted(positions), columns)`` + `to_torch_batch` per batch."""

    def run() -> int:
        rows = 0
        for positions in batches:
            to_torch_batch(ds.take(positions, columns=list(columns)))
            rows += len(positions)
        return rows

    return run


def raw_window_shuffle(ds: lance.LanceDataset, columns, windows: list[list[np.ndarray]]) -> Callable[[], int]:
    """A shuffle buffer by hand: per window, its shards read with offset/limit scans, the rows put
    in the window's shuffled order with one ``take``, then cut into batches + `to_torch_batch`."""

    def run() -> int:
        rows = 0
        for batches in windows:
            positions = np.concatenate(batches)
            wanted = np.sort(positions)
            shards = np.split(wanted, np.flatnonzero(np.diff(wanted) != 1) + 1)
            table = pa.concat_tables(
                [
                    ds.scanner(columns=list(columns), offset=int(shard[0]), limit=len(shard)).to_table()
                    for shard in shards
                ]
            )
            table = table.take(np.searchsorted(wanted, positions))
            for first, end in itertools.pairwise(np.cumsum([0, *map(len, batches)]).tolist()):
                to_torch_batch(table.slice(first, end - first))
            rows += len(positions)
        return rows

    return run


def planned_windows(dm: LanceDataModule) -> list[list[np.ndarray]]:
    """The batch positions of epoch 0 in planned order, grouped by shuffle-buffer window."""
    plan = dm.plans["train"]
    reader = PlanReader(plan, 0, 1, 0, 0)
    window = plan.strategy.window_rows
    windows: dict[int, list[np.ndarray]] = {}
    for step in range(reader.layout.steps):
        windows.setdefault(step * plan.batch_size // window, []).append(reader.spec(step).positions)
    return list(windows.values())


def planned_batches(dm: LanceDataModule, batches: int | None = None) -> list[np.ndarray]:
    """The sorted dataset positions of each batch of epoch 0, as the plugin plans them."""
    plan = dm.plans["train"]
    reader = PlanReader(plan, 0, 1, 0, 0)
    steps = range(reader.layout.steps if batches is None else min(batches, reader.layout.steps))
    return [np.sort(reader.spec(step).positions) for step in steps]


def pylance_dataset(uri: str, columns, batch_size: int) -> tuple[Callable[[], int] | None, str]:
    """pylance's own ``lance.torch.data.LanceDataset`` in a DataLoader (the peer)."""
    loader = common.peer_loader(uri, columns, batch_size)

    def run() -> int:
        rows = 0
        for batch in loader:
            rows += len(batch[columns[0]])
        return rows

    try:  # a short probe, so a failure is reported rather than crashing the run
        first = next(iter(loader))
        shapes = {k: tuple(v.shape) for k, v in first.items()}
    except Exception as error:  # noqa: BLE001
        return None, f"LanceDataset failed: {type(error).__name__}: {error}"
    return run, f"LanceDataset(uri, batch_size={batch_size}, columns={list(columns)}) yields {shapes}"


# -- the benchmark -----------------------------------------------------------------------------
class Bench:
    def __init__(self, reps: int, min_seconds: float) -> None:
        self.reps = reps
        self.min_seconds = min_seconds
        self.rows: list[Row] = []
        self.raw: list[str] = []
        self.notes: list[str] = []

    def compare(
        self,
        scenario: str,
        candidate: Callable[[], int],
        baseline_name: str,
        baseline: Callable[[], int],
        target: float | None,
        note: str = "",
    ) -> Paired:
        result = paired(candidate, baseline, self.reps, self.min_seconds)
        self.add(scenario, result, baseline_name, target, note)
        return result

    def add(self, scenario: str, result: Paired, baseline_name: str, target: float | None, note: str = "") -> Row:
        row = Row(scenario, result.rows_per_s, baseline_name, result.base_rows_per_s, result.ratio, target, note)
        self.rows.append(row)
        raw = ", ".join(f"{c:,.0f} / {b:,.0f}" for c, b in result.raw)
        self.raw.append(f"- {scenario} vs {baseline_name}: {raw}")
        print(
            f"  {scenario:<48} {row.rows_per_s:>12,.0f} rows/s  vs {baseline_name:<40} "
            f"{row.base_rows_per_s:>12,.0f} rows/s  ratio {row.ratio:6.2f}  "
            f"target {'-' if target is None else f'>= {target:g}':<7} {row.status}   raw (ours / base): {raw}",
            flush=True,
        )
        return row


def combine(a: Paired, b: Paired) -> Paired:
    """``a`` against ``b`` where both were measured in the same repetitions (per-rep ratios)."""
    import statistics

    raw = [(ca, cb) for (ca, _), (cb, _) in zip(a.raw, b.raw)]
    return Paired(a.rows_per_s, b.rows_per_s, statistics.median(x / y for x, y in raw), raw)


def run(args: argparse.Namespace) -> list[Row]:
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    rows = 200_000 if args.quick else args.rows
    image_rows = 5_000 if args.quick else args.image_rows
    clump1_batches = 50 if args.quick else args.clump1_batches
    uri = common.vec_dataset(cache, rows)
    image_uri = common.image_dataset(cache, image_rows)
    ds = lance.dataset(uri)
    image_ds = lance.dataset(image_uri)
    min_seconds = args.min_seconds if args.min_seconds is not None else (0.3 if args.quick else 1.0)
    bench = Bench(args.reps, min_seconds)
    bench.notes.append(
        common.steady_allocator() + " (see `common.steady_allocator`: without it, the side measured "
        "second inherits the heap state the first left behind)"
    )
    bench.notes.append(
        f"vector table: {uri} ({rows:,} rows, {len(ds.get_fragments())} fragments, columns "
        f"{COLUMNS}, BITMAP index on label); image table: {image_uri} ({image_rows:,} JPEGs "
        f"of {common.IMAGE_SIDE}x{common.IMAGE_SIDE})"
    )

    # Warm the page cache (and Lance's metadata caches) so that no side pays for the first read.
    raw_scan(ds, COLUMNS, 8192, convert=False)()
    raw_scan(image_ds, IMAGE_COLUMNS, 8192, convert=False)()

    print(f"\n[1/6] storage order (NoShuffle), {rows:,} rows, {args.reps} paired repetitions", flush=True)
    for batch_size in (BATCH, 1024):
        _, loader = train_loader(uri, batch_size)
        ours = iterate(loader)
        bench.compare(
            f"NoShuffle B={batch_size}",
            ours,
            f"raw scan + to_torch_batch B={batch_size}",
            raw_scan(ds, COLUMNS, batch_size),
            0.9,
        )
        bench.compare(
            f"NoShuffle B={batch_size}",
            ours,
            f"raw scan, no conversion B={batch_size}",
            raw_scan(ds, COLUMNS, batch_size, convert=False),
            None,
        )

    print("\n[2/6] shard and buffer shuffles (range scans)", flush=True)
    scan256 = raw_scan(ds, COLUMNS, BATCH)
    _, loader = train_loader(uri, BATCH, ShardShuffle())
    bench.compare(
        f"ShardShuffle() (8192-row shards) B={BATCH}",
        iterate(loader),
        f"raw scan + to_torch_batch B={BATCH}",
        scan256,
        0.85,
    )
    _, loader = train_loader(uri, BATCH, ShardShuffle(shard_rows=1024))
    bench.compare(
        f"ShardShuffle(shard_rows=1024) B={BATCH}",
        iterate(loader),
        f"raw scan + to_torch_batch B={BATCH}",
        scan256,
        None,
        "small shards reorder the epoch at a finer grain but read slower: a read group "
        "of 16 ranges of 1024 rows costs Lance more than one 16k-row range (`python "
        "benchmarks/probes/probe_ranges.py`), and this row moves between 0.6 and 1.2 from run to run",
    )
    dm, loader = train_loader(uri, BATCH, BufferShuffle())
    bench.compare(
        f"BufferShuffle() B={BATCH}",
        iterate(loader),
        f"raw scan + to_torch_batch B={BATCH}",
        scan256,
        None,
        "the price of shuffling: a sequential scan reads no shards and permutes nothing",
    )
    bench.compare(
        f"BufferShuffle() B={BATCH}",
        iterate(loader),
        "raw shard scans + window shuffle + convert",
        raw_window_shuffle(ds, COLUMNS, planned_windows(dm)),
        0.85,
        "the same work by hand (target is ours; the issue gives none): each 16k-row window's shards read "
        "with offset/limit scans, put in the planned order with one take, cut into batches, converted",
    )

    print("\n[3/6] row shuffles (takes)", flush=True)
    dm1, loader1 = train_loader(uri, BATCH, RowShuffle(clump_rows=1))
    dm64, loader64 = train_loader(uri, BATCH, RowShuffle(clump_rows=64))
    take1 = raw_take(ds, COLUMNS, planned_batches(dm1, clump1_batches))
    take64 = raw_take(ds, COLUMNS, planned_batches(dm64))
    ours1 = iterate(loader1, batches=clump1_batches)
    ours64 = iterate(loader64)
    c1 = bench.compare(
        f"RowShuffle(clump_rows=1) B={BATCH}, {clump1_batches} batches",
        ours1,
        "raw take(sorted batch positions) + convert",
        take1,
        0.9,
    )
    c64 = bench.compare(
        f"RowShuffle(clump_rows=64) B={BATCH}, full epoch",
        ours64,
        "raw take(sorted batch positions) + convert",
        take64,
        0.9,
    )
    bench.add(
        "RowShuffle(clump_rows=64)",
        combine(c64, c1),
        "RowShuffle(clump_rows=1)",
        5.0,
        "per-repetition ratio of the two rows above",
    )

    print("\n[4/6] filters on the BITMAP-indexed label column", flush=True)
    started = time.perf_counter()
    dm, loader = train_loader(uri, BATCH, filter="label = 7")
    setup_s = time.perf_counter() - started
    plan = dm.plans["train"]
    positions = plan.matches.select(np.arange(plan.matched_rows))
    chunks = [positions[i : i + BATCH] for i in range(0, len(positions), BATCH)]
    bench.notes.append(
        f"`label = 7`: {plan.matched_rows:,} rows ({plan.selectivity:.2%}), plan: {plan.method} "
        f"({plan.reason}); setup (pin, count, list positions) took {setup_s * 1000:.0f} ms"
    )
    bench.compare(
        f"filter label = 7 ({plan.selectivity:.1%}), epoch",
        iterate(loader),
        f"raw take(matching positions) in {BATCH}-row chunks + convert",
        raw_take(ds, COLUMNS, chunks),
        0.5,
        "epoch time <= 2x the raw take time",
    )

    def setup_and_epoch() -> int:
        _, fresh = train_loader(uri, BATCH, filter="label = 7")
        return iterate(fresh)()

    def list_and_take() -> int:
        table = ds.to_table(columns=["_rowoffset"], filter="label = 7")
        found = table.column(0).to_numpy()
        return raw_take(ds, COLUMNS, [found[i : i + BATCH] for i in range(0, len(found), BATCH)])()

    bench.compare(
        "filter label = 7: setup + epoch", setup_and_epoch, "raw: list matching positions + take", list_and_take, None
    )
    dm, loader = train_loader(uri, BATCH, filter="label < 50")
    plan = dm.plans["train"]
    bench.notes.append(
        f"`label < 50`: {plan.matched_rows:,} rows ({plan.selectivity:.2%}), plan: {plan.method} ({plan.reason})"
    )
    bench.compare(
        f"filter label < 50 ({plan.selectivity:.0%}), epoch",
        iterate(loader),
        f"raw filtered scan + to_torch_batch B={BATCH}",
        raw_scan(ds, COLUMNS, BATCH, filter="label < 50"),
        round(1 / 1.2, 3),
        "epoch time <= 1.2x the filtered scan time",
    )

    print("\n[5/6] pylance's lance.torch.data.LanceDataset (the peer)", flush=True)
    peer, description = pylance_dataset(uri, COLUMNS, BATCH)
    bench.notes.append(description)
    if peer is None:
        print(f"  {description}", flush=True)
    else:
        _, loader = train_loader(uri, BATCH)
        ours = iterate(loader)
        bench.compare(f"pylance LanceDataset B={BATCH}", peer, f"raw scan + to_torch_batch B={BATCH}", scan256, None)
        bench.compare(f"NoShuffle B={BATCH}", ours, f"pylance LanceDataset B={BATCH}", peer, 1.0, "the peer to beat")

    print(f"\n[6/6] image table, {image_rows:,} JPEG rows, columns {IMAGE_COLUMNS}", flush=True)
    _, loader = train_loader(image_uri, BATCH, columns=IMAGE_COLUMNS)
    bench.compare(
        f"images NoShuffle B={BATCH} (JPEG bytes)",
        iterate(loader),
        f"raw scan + to_torch_batch B={BATCH}",
        raw_scan(image_ds, IMAGE_COLUMNS, BATCH),
        0.9,
        f"an epoch of {image_rows:,} rows is a few read groups of ~8 MiB; each epoch's first batch waits "
        "for a whole group to be read and converted, and the raw streaming scan already keeps both cores "
        "busy (Lance's decode threads while Python converts), so reader threads add no throughput here",
    )
    return bench.rows, bench.raw, bench.notes


def write_results(out_dir: Path, rows: list[Row], raw: list[str], notes: list[str], args, elapsed: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    table = common.markdown_table(rows)
    failed = [r.scenario + " vs " + r.baseline for r in rows if r.status == "FAIL"]
    kind = "QUICK smoke run (small data; not the reference figures)" if args.quick else "full run"
    text = "\n".join(
        [
            "# Read benchmark",
            "",
            f"{stamp}, {kind}, {elapsed:.0f} s. Command: `{common.command_line()}`",
            "",
            f"Machine: {common.machine()}. Only ratios are meaningful: both sides of each row were measured "
            f"back to back, {args.reps} times (alternating order), each measurement repeating its read until it "
            "ran at least 1 s (0.3 s quick); rows/s are medians, the ratio is the median of the per-repetition "
            "ratios. All loaders: `num_workers=0` (default `reader_threads=2`), columns converted to tensors.",
            "",
            table,
            "",
            f"Targets failed: {len(failed)} of {sum(r.target is not None for r in rows)}"
            + ("" if not failed else ": " + "; ".join(failed)),
            "",
            "## Setup",
            "",
            *[f"- {n}" for n in notes],
            *[f"- {r.scenario}: {r.note}" for r in rows if r.note],
            "",
            "## Raw rows/s per repetition (ours / baseline)",
            "",
            *raw,
            "",
        ]
    )
    common.write_result(out_dir / "read.md", text)
    common.bar_plot(rows, out_dir / "read.png", f"lance-lightning read benchmark ({kind}, {stamp})")
    print(f"\nwrote {out_dir / 'read.md'} and {out_dir / 'read.png'}")


def peer_filters(args: argparse.Namespace, started: float) -> int:
    """``--peer-filters``: `read_filters` on the issue's table; its section of results/filter_scan.md."""
    import read_filters

    common.steady_allocator()
    args.load_start = os.getloadavg()[0]
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    min_seconds = args.min_seconds if args.min_seconds is not None else 1.0
    args.min_seconds = min_seconds
    cells = read_filters.run(cache, args.peer_rows, args.reps, min_seconds, args.first_reps)
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    text = read_filters.report(
        cells, common.command_line(), common.machine(), stamp, time.perf_counter() - started, args
    )
    print()
    print(read_filters.table(cells))
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    read_filters.write_section(Path(args.out_dir) / "filter_scan.md", text)
    print(f"\nwrote {Path(args.out_dir) / 'filter_scan.md'}; command: {common.command_line()}")
    missed = [c for c in cells if c.epoch[2] < read_filters.EPOCH_TARGET or c.first[2] > read_filters.FIRST_TARGET]
    return 1 if missed and args.strict else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200k rows, 5k images: a smoke run (< 2 minutes)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the vector table (full run)")
    parser.add_argument("--image-rows", type=int, default=20_000, help="rows of the image table (full run)")
    parser.add_argument("--clump1-batches", type=int, default=200, help="batches timed for RowShuffle clump 1")
    parser.add_argument("--reps", type=int, default=3, help="paired repetitions per comparison")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="each measurement repeats until it ran this long (default 1 s, 0.3 s with --quick)",
    )
    parser.add_argument("--cache-dir", default=str(common.DEFAULT_CACHE), help="where the datasets are kept")
    parser.add_argument("--out-dir", default=str(common.RESULTS_DIR), help="where read.md and read.png go")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    parser.add_argument(
        "--peer-filters",
        action="store_true",
        help="only the filtered reads against lance.torch's LanceDataset (read_filters.py): writes "
        "results/filter_scan.md's section",
    )
    parser.add_argument("--peer-rows", type=int, default=400_000, help="rows of the --peer-filters table")
    parser.add_argument("--first-reps", type=int, default=15, help="first-batch pairs per --peer-filters cell")
    args = parser.parse_args(argv)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no plan explanations per setup
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # pylance's _to_tensor
    print(f"command: {common.command_line()}")
    print(f"machine: {common.machine()}", flush=True)
    started = time.perf_counter()
    if args.peer_filters:
        return peer_filters(args, started)
    rows, raw, notes = run(args)
    elapsed = time.perf_counter() - started
    print()
    print(common.markdown_table(rows))
    write_results(Path(args.out_dir), rows, raw, notes, args, elapsed)
    print(f"command: {common.command_line()}  ({elapsed:.0f} s)")
    failed = [r for r in rows if r.status == "FAIL"]
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
