"""Filtered reads against pylance's own ``lance.torch.data.LanceDataset(filter=...)`` (issue #39).

The harness's ``filter-scan`` study (``python -m benchmarks run filter-scan``): it writes its
section of ``results/filter_scan.md``, between the ``peer-filters`` markers. The workload is the
issue's: ``rows`` rows (400,000) of ``id`` int64,
``label`` int32 uniform in 0..99 and ``vec`` fixed-size list of 128 float32, written by a plain
``lance.write_dataset`` (one fragment), without an index and in copies with a BITMAP and a BTREE
index on ``label``; filters ``label < 1`` (1%), ``label < 10`` (10%) and ``label < 50`` (50%);
``NoShuffle``, batch size 256, ``num_workers=0`` on both sides.

For each cell, measured in this one process, back to back:

- **epoch rows/s**: the package's train loader (its data module set up once, outside the timing,
  as in every row of the read benchmark) against ``DataLoader(LanceDataset(uri, batch_size=256,
  columns=[...], filter=...), batch_size=None)`` (built once), each repeating whole epochs for at
  least ``min_seconds``; ``reps`` paired repetitions, alternating which goes first; the ratio is
  the median of the per-repetition ratios. Target: at least 1.3. Beside it, the same ratio of rows
  per CPU second of this process (all threads): information, less disturbed by other processes on
  a shared machine than wall time. And the read requests and MB of one epoch on each side's handle.
- **setup + epoch rows/s**: the same with a new data module (pin, evaluate the filter, plan) and a
  new ``LanceDataset`` for every epoch (information).
- **first batch**: seconds from nothing to the first batch in hand: ``LanceDataModule(...)``,
  ``setup("fit")``, ``train_dataloader()``, ``next(iter(...))`` against ``LanceDataset(...)``,
  ``DataLoader(...)``, ``next(iter(...))``; ``first_reps`` alternating pairs, medians, and the
  median of the per-pair ratios ours/peer. Target: at most 2.

The package's loader yields ``drop_last`` batches (the data module's default for training: every
rank the same number of full batches), the peer every matching row; rows/s count the rows each
delivered.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lance
from torch.utils.data import DataLoader

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.data import plain_vec_table
from benchmarks.harness.fit import train_loader
from benchmarks.harness.loaders import lance_torch
from benchmarks.harness.study import Params
from benchmarks.harness.timing import iterate, paired
from lance_lightning import LanceDataModule

COLUMNS = ["id", "label", "vec"]
BATCH = 256
FILTERS = (("label < 1", "1%"), ("label < 10", "10%"), ("label < 50", "50%"))
INDEXES = (None, "BITMAP", "BTREE")
EPOCH_TARGET = 1.3
FIRST_TARGET = 2.0


def peer_dataset(cache: Path, rows: int, index: str | None) -> str:
    """The issue's table (plain ``lance.write_dataset``), with ``index`` on ``label`` if given; written once."""
    path = cache / f"filter_peer_{rows}_{(index or 'plain').lower()}.lance"
    return plain_vec_table(path, rows, seed=39, index=index)


def ours_fresh(uri: str, filter: str) -> tuple[LanceDataModule, object]:
    return train_loader(uri, BATCH, filter=filter)


def peer_fresh(uri: str, filter: str) -> DataLoader:
    return lance_torch(uri, COLUMNS, BATCH, filter)


def first_batch(make: Callable[[], object]) -> float:
    """Seconds from nothing to the first batch of the loader ``make`` builds."""
    started = time.perf_counter()
    it = iter(make())
    next(it)
    seconds = time.perf_counter() - started
    if hasattr(it, "close"):
        it.close()
    del it
    return seconds


def io_of(dataset: lance.LanceDataset, run: Callable[[], int]) -> tuple[int, float]:
    """Lance's read requests and MB on ``dataset``'s handle during ``run`` (from its cumulative
    statistics: the package's reader takes the incremental ones for its own metrics)."""
    before = dataset.io_stats_snapshot()
    run()
    after = dataset.io_stats_snapshot()
    return after.read_iops - before.read_iops, (after.read_bytes - before.read_bytes) / 1e6


def our_io(loader) -> tuple[int, float]:
    """The package loader's read requests and MB of one epoch, from its own metrics (its reader
    takes the handle's statistics)."""
    before = loader.metrics_snapshot().totals
    iterate(loader)()
    after = loader.metrics_snapshot().totals
    return int(after["io_requests"] - before["io_requests"]), (after["io_bytes"] - before["io_bytes"]) / 1e6


@dataclass
class Cell:
    index: str
    filter: str
    share: str
    plan: str
    epoch: tuple[float, float, float] = (0.0, 0.0, 0.0)  # ours rows/s, peer rows/s, ratio
    epoch_cpu: float = 0.0  # ratio of rows per CPU second
    setup_epoch: tuple[float, float, float] = (0.0, 0.0, 0.0)
    first: tuple[float, float, float] = (0.0, 0.0, 0.0)  # ours s, peer s, ratio ours/peer
    io: tuple[tuple[int, float], tuple[int, float]] = ((0, 0.0), (0, 0.0))  # (requests, MB) of an epoch: ours, peer
    raw: list[str] = field(default_factory=list)


def measure_cell(uri: str, filter: str, reps: int, min_seconds: float, first_reps: int) -> Cell:
    dm, ours = ours_fresh(uri, filter)
    plan = dm.plans["train"]
    peer = peer_fresh(uri, filter)
    iterate(ours)(), iterate(peer)()  # warm both (page cache, Lance's caches, threads)
    cell = Cell("", filter, "", f"{plan.method}: {plan.reason}")
    cell.io = (our_io(ours), io_of(peer.dataset.dataset, iterate(peer)))
    result = paired(iterate(ours), iterate(peer), reps, min_seconds)
    cell.epoch, cell.epoch_cpu = (result.rows_per_s, result.base_rows_per_s, result.ratio), result.cpu.ratio
    cell.raw.append("epoch: " + result.raw_text())
    result = paired(
        lambda: iterate(ours_fresh(uri, filter)[1])(), lambda: iterate(peer_fresh(uri, filter))(), reps, min_seconds
    )
    cell.setup_epoch = (result.rows_per_s, result.base_rows_per_s, result.ratio)
    cell.raw.append("setup + epoch: " + result.raw_text())
    pairs = []
    for rep in range(first_reps):
        sides = [lambda: ours_fresh(uri, filter)[1], lambda: peer_fresh(uri, filter)]
        if rep % 2:
            peer_s, ours_s = first_batch(sides[1]), first_batch(sides[0])
        else:
            ours_s, peer_s = first_batch(sides[0]), first_batch(sides[1])
        pairs.append((ours_s, peer_s))
    cell.first = (
        statistics.median(o for o, _ in pairs),
        statistics.median(p for _, p in pairs),
        statistics.median(o / p for o, p in pairs),
    )
    cell.raw.append("first batch ms: " + ", ".join(f"{o * 1e3:.1f} / {p * 1e3:.1f}" for o, p in pairs))
    return cell


def run(cache: Path, rows: int, reps: int, min_seconds: float, first_reps: int) -> list[Cell]:
    cells = []
    for index in INDEXES:
        uri = peer_dataset(cache, rows, index)
        lance.dataset(uri).to_table(columns=COLUMNS)  # warm the page cache
        for filter, share in FILTERS:
            cell = measure_cell(uri, filter, reps, min_seconds, first_reps)
            cell.index, cell.share = index or "none", share
            cells.append(cell)
            print(
                f"  index {cell.index:<6} {share:>3} {filter:<11} epoch {cell.epoch[0]:>11,.0f} / "
                f"{cell.epoch[1]:>11,.0f} = {cell.epoch[2]:5.2f} (CPU {cell.epoch_cpu:5.2f})   "
                f"setup+epoch {cell.setup_epoch[2]:5.2f}   "
                f"first batch {cell.first[0] * 1e3:6.1f} / {cell.first[1] * 1e3:6.1f} ms = {cell.first[2]:5.2f}",
                flush=True,
            )
    return cells


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def table(cells: list[Cell]) -> str:
    rows = []
    for c in cells:
        ok = c.epoch[2] >= EPOCH_TARGET and c.first[2] <= FIRST_TARGET
        setup = f"{c.setup_epoch[0]:,.0f} / {c.setup_epoch[1]:,.0f}"
        first = f"{c.first[0] * 1e3:.1f} / {c.first[1] * 1e3:.1f}"
        io = f"{c.io[0][0]:,} ({c.io[0][1]:.0f}) / {c.io[1][0]:,} ({c.io[1][1]:.0f})"
        epoch = (c.index, f"`{c.filter}` ({c.share})", *c.epoch, c.epoch_cpu)
        rows.append((*epoch, setup, c.setup_epoch[2], first, c.first[2], verdict(ok), io))
    heads = (
        "index | filter | ours epoch rows/s | lance.torch rows/s | ratio (≥ 1.3) | per CPU second | "
        "setup + epoch: ours / lance.torch rows/s | ratio | first batch: ours / lance.torch ms | "
        "ratio (≤ 2) | result | read requests (MB) an epoch: ours / lance.torch"
    )
    return "\n".join(tables.table(heads, "< < >,.0f >,.0f >.2f >.2f > >.2f > >.2f ^ >", rows))


def report(cells: list[Cell], p: Params, load_start: float) -> str:
    failed = [f"{c.index} {c.filter}" for c in cells if not (c.epoch[2] >= EPOCH_TARGET and c.first[2] <= FIRST_TARGET)]
    return "\n".join(
        [
            f"{p.rows:,} rows (`id` int64, `label` int32 uniform in 0..99, `vec` "
            "128 float32; plain `lance.write_dataset`, one fragment; BITMAP and BTREE copies indexed on `label`), "
            f"NoShuffle, batch size {BATCH}, 0 workers, warm page cache. Epoch rows/s: {p.reps} paired "
            f"repetitions (alternating order), each at least {p.min_seconds:g} s of whole epochs, data module set "
            "up outside the timing; the ratio is the median of per-repetition ratios. Setup + epoch: a new data "
            "module / `LanceDataset` every epoch. First batch: from constructing the loader (ours: data module, "
            f"`setup`, `train_dataloader`) to the first batch in hand, {p.first_reps} alternating pairs, "
            "medians, ratio = median of per-pair ours/lance.torch. Per CPU second: the median per-repetition ratio "
            "of epoch rows per CPU second of this process (all threads; information: less disturbed by other "
            "processes than wall time). Read requests (MB): Lance's I/O statistics of one epoch on each side's "
            f"dataset handle. Load average (1 min) at the start {load_start:.2f}, at the end "
            f"{os.getloadavg()[0]:.2f}.",
            "",
            table(cells),
            "",
            f"Targets (epoch ratio ≥ {EPOCH_TARGET:g} and first-batch ratio ≤ {FIRST_TARGET:g}) missed: "
            f"{len(failed)} of {len(cells)}" + (": " + "; ".join(failed) if failed else ""),
            "",
            "Plans chosen:",
            "",
            *[f"- {c.index} `{c.filter}`: {c.plan}" for c in cells],
            "",
            "Raw (ours / lance.torch) per repetition:",
            "",
            *[f"- {c.index} `{c.filter}` {line}" for c in cells for line in c.raw],
            "",
        ]
    )


def measure(p: Params) -> str:
    common.steady_allocator()
    load_start = os.getloadavg()[0]
    cells = run(p.cache, p.rows, p.reps, p.min_seconds, p.first_reps)
    print("\n" + table(cells))
    return report(cells, p, load_start)
