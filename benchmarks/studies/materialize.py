"""Materialized-view benchmark: a multi-epoch run from an S3 source against the same run from a local view.

For each read pattern this script trains the same tiny model for ``epochs`` epochs with a real
``Trainer`` twice, back to back (``reps`` pairs, alternating which goes first):

- **s3**: ``LanceDataModule(train=LanceSource("s3://...", storage_options=...),
  remote_cache=RemoteCache(enabled=False))`` reads every epoch from a real S3-compatible server (moto's server mode on 127.0.0.1, started by the study);
- **view**: the same data module with ``materialize=MaterializedView(cache_dir=<fresh dir>)``: its
  ``setup`` copies the source to a local Lance view (timed: the copy is part of the run), then
  every epoch reads the view.

Each run's total is ``setup`` (pin + plan, and the copy for the view) plus the measured epochs.
The report gives the ratio of the two totals and the break-even epoch count: the fewest epochs
for which the view's total (copy included) is not larger than reading S3 every epoch.
moto on loopback has almost no network latency and no bandwidth limit, so the gain measured
here is the per-request cost of an object store client; over a real network it is larger.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
from lightning.pytorch.callbacks import Callback

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.fit import VecModel, trainer
from benchmarks.harness.study import Params
from lance_lightning import LanceDataModule, LanceSource, MaterializedView, NoShuffle, RemoteCache, RowShuffle
from tests.s3_server import S3Server

BATCH = 1024
PATTERNS = {
    "NoShuffle (scan)": dict(shuffle=NoShuffle, filter=None),
    "RowShuffle(clump_rows=64) (take)": dict(shuffle=lambda: RowShuffle(seed=1, clump_rows=64), filter=None),
    "RowShuffle(clump_rows=64), filter label < 20 (20%)": dict(
        shuffle=lambda: RowShuffle(seed=1, clump_rows=64), filter="label < 20"
    ),
}


class EpochClock(Callback):
    """Wall time of each training epoch: from its start to the next epoch's start (or the end of training)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.seconds: list[float] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        ends = [*self.starts[1:], time.perf_counter()]
        self.seconds = [end - start for start, end in zip(self.starts, ends)]


@dataclass
class Run:
    setup_s: float  # dm.setup: pin + plan (+ the copy for a view)
    other_s: float  # the rest of the wall time outside epochs (Trainer start-up and teardown)
    epochs_s: list[float]

    def total(self, epochs: int) -> float:
        """Wall time of a run of ``epochs`` epochs (past those measured: the median measured epoch)."""
        measured = self.epochs_s[:epochs]
        extra = (epochs - len(measured)) * statistics.median(self.epochs_s)
        return self.setup_s + self.other_s + sum(measured) + extra

    def figures(self, epochs: int) -> tuple[float, float, float]:
        """The table's figures: setup, the median epoch, the total of ``epochs`` epochs (seconds)."""
        return self.setup_s, statistics.median(self.epochs_s), self.total(epochs)


@dataclass
class Pattern:
    name: str
    s3: list[Run] = field(default_factory=list)
    view: list[Run] = field(default_factory=list)


def write_source(server: S3Server, rows: int, log: Any) -> tuple[str, dict[str, str]]:
    """The (id, label, vec[128]) table of `common.vec_dataset`, written to the S3 server."""
    uri, options = "s3://bench/vectors.lance", server.storage_options()
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "label": pa.array(rng.integers(0, common.LABELS, rows, dtype=np.int32)),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(rows * common.VEC_DIM, dtype=np.float32)), common.VEC_DIM
            ),
        }
    )
    started = time.perf_counter()
    lance.write_dataset(table, uri, storage_options=options, max_rows_per_file=max(rows // 4, 1))
    log(f"[data] wrote {rows:,} rows ({table.nbytes / 1e6:.0f} MB) to {uri} in {time.perf_counter() - started:.1f} s")
    return uri, options


def run_once(uri: str, options: dict[str, str], pattern: dict[str, Any], epochs: int, cache: Path | None) -> Run:
    """One fit of ``epochs`` epochs; ``cache`` set: through a fresh materialized view there."""
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "label", "vec"], filter=pattern["filter"], storage_options=options),
        batch_size=BATCH,
        shuffle=pattern["shuffle"](),
        materialize=MaterializedView(cache_dir=str(cache)) if cache is not None else None,
        remote_cache=RemoteCache(enabled=False),  # the S3 side reads the store every epoch, as without a view
    )
    started = time.perf_counter()
    dm.setup("fit")  # pin + plan (+ the copy); Trainer.fit's own setup then finds the plan made
    setup_s = time.perf_counter() - started
    assert (cache is None) == dm.plans["train"].source.uri.startswith("s3://")
    clock = EpochClock()
    fit = trainer(Path(cache or tempfile.gettempdir()), [clock], max_epochs=epochs)
    fit.fit(VecModel(width=common.VEC_DIM), datamodule=dm)
    wall = time.perf_counter() - started
    return Run(setup_s, wall - setup_s - sum(clock.seconds), clock.seconds)


def break_even(s3: Run, view: Run, horizon: int = 1000) -> str:
    for epochs in range(1, horizon + 1):
        if view.total(epochs) <= s3.total(epochs):
            return str(epochs)
    return f"> {horizon}"


def median_run(runs: list[Run]) -> Run:
    return Run(
        statistics.median(r.setup_s for r in runs),
        statistics.median(r.other_s for r in runs),
        [statistics.median(e) for e in zip(*(r.epochs_s for r in runs))],
    )


def report(patterns: list[Pattern], args: Params, rows: int) -> str:
    e = args.epochs
    lines = [
        "S3: moto server mode on 127.0.0.1 (no network latency or bandwidth "
        "limit: a real object store over a network makes the S3 side slower, so the gain here is a lower "
        f"bound). Data: {rows:,} rows (id int64, label int32 in 0..99, vec float32[128]), 4 fragments, "
        f"batch_size {BATCH}, num_workers 0, real `Trainer` ({e} epochs, a linear model on `vec`). "
        f"Both sides ran back to back, {args.reps} pair(s) alternating order; figures are medians over the "
        "pairs. The view side includes the copy: its `setup` pins the source, copies it into a fresh "
        "`cache_dir` and plans the view.",
        "",
    ]
    heads = f"read pattern | S3: setup (s) | S3: epoch (s) | S3: {e} epochs (s) | view: setup + copy (s) "
    heads += f"| view: epoch (s) | view: {e} epochs (s) | ratio S3/view, {e} epochs | break-even epochs"
    body = []
    for pat in patterns:
        s3, view = median_run(pat.s3), median_run(pat.view)
        ratio = statistics.median(a.total(e) / b.total(e) for a, b in zip(pat.s3, pat.view))
        body.append((pat.name, *s3.figures(e), *view.figures(e), ratio, break_even(s3, view)))
    lines += tables.table(heads, "< >.2f >.2f >.1f >.2f >.2f >.1f >.2f >", body)
    lines += [
        "",
        f"Totals: wall time of the whole run, from `dm.setup` to the end of `Trainer.fit` (setup, {e} epochs "
        "and the Trainer's own start-up). Epoch: the median epoch, from one epoch's start to the next. "
        "Ratio: S3 total / view total (> 1: the view wins, copy included); the median of the per-pair ratios. "
        "Break-even: the fewest epochs for which the view's total, copy included, is not larger than the S3 "
        "total (epochs past those measured count at the median epoch time).",
        "",
        "## Raw seconds per pair (setup; epochs)",
        "",
    ]
    for pat in patterns:
        for i, (a, b) in enumerate(zip(pat.s3, pat.view)):
            lines.append(
                f"- {pat.name}, pair {i + 1}: S3 {a.setup_s:.2f}; {', '.join(f'{s:.2f}' for s in a.epochs_s)} "
                f"(total {a.total(e):.2f}) | view {b.setup_s:.2f}; "
                f"{', '.join(f'{s:.2f}' for s in b.epochs_s)} (total {b.total(e):.2f})"
            )
    return "\n".join(lines)


def measure(p: Params) -> str:
    server = S3Server()
    server.start()
    work = Path(tempfile.mkdtemp(prefix="bench_materialize_"))
    try:
        server.create_bucket("bench")
        uri, options = write_source(server, p.rows, print)
        patterns = []
        for name, pattern in PATTERNS.items():
            result = Pattern(name)
            for rep in range(p.reps):
                for side in ("s3", "view") if rep % 2 == 0 else ("view", "s3"):
                    cache = work / f"views-{len(patterns)}-{rep}" if side == "view" else None
                    run = run_once(uri, options, pattern, p.epochs, cache)
                    getattr(result, side).append(run)
                    epochs = ", ".join(f"{s:.2f}" for s in run.epochs_s)
                    print(f"{name} pair {rep + 1} {side}: setup {run.setup_s:.2f} s, epochs {epochs} s", flush=True)
                    if cache is not None:
                        shutil.rmtree(cache, ignore_errors=True)
            patterns.append(result)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return report(patterns, p, p.rows)
