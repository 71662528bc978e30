"""Metrics overhead benchmark: the same loader with its measurements on and off.

The loader measures every batch (waits, stage times, Lance I/O statistics, a latency histogram)
and `DataLoadingMonitor` logs the figures. The target: throughput with metrics on is at least
0.97 x throughput with metrics off. Each loader row compares one loader with its metrics on
(the default) and off (what ``LanceDataLoader(..., metrics=False)`` sets), measured back to back
and interleaved as in `benchmarks.harness.timing.paired`; one loader, not two, because two loaders built one after
the other differ by several percent even with identical settings (see `loader_pair`).

Scenarios:
- loader alone, whole epochs: a fast scan (the worst case: the most batches per second, so the
  per-batch cost weighs most), row-shuffle takes, and JPEG decoding (the two-stage transform
  pipeline);
- ``Trainer.fit`` of 1,000 steps: `DataLoadingMonitor` logging to a CSVLogger every 50 steps and
  metrics on, against metrics off and no monitor; timed from the first to the last training
  batch. The target row trains a small MLP on the 128-float vectors (about 1.4 ms a step here);
  the info rows train a model that does nothing (0.6 ms a step, all of it Lightning's loop), where
  Lightning's dispatch to any callback already costs 1-3%: a no-op callback against no callback
  shows it.

Repetitions during which other processes used >= 5% of the CPUs are measured again (up to 2x);
the share of each repetition kept and the load average are written with the results.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import common
from benchmarks.common import Row
from benchmarks.harness.fit import trainer
from benchmarks.harness.study import Params
from benchmarks.harness.timing import QUIET, Paired, iterate, paired, quiet_reps, summary
from lance_lightning import LanceDataModule, LanceSource, NoShuffle, RowShuffle
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.load.loader import LanceDataLoader
from lance_lightning.transforms import DecodeImage

TARGET = 0.97
BATCH = 256


def warm_loader(uri: str, columns: list[str], shuffle=None, transform=None) -> LanceDataLoader:
    """A `LanceDataLoader` with metrics on and the data module's default threads, B=`BATCH`, after
    one epoch (threads started, caches warm)."""
    dm = LanceDataModule(train=LanceSource(uri, columns=columns), batch_size=BATCH, shuffle=shuffle or NoShuffle())
    dm.setup("fit")
    dataset = LanceIterableDataset(
        dm.plans["train"], transform=transform, reader_threads=dm.reader_threads, prefetch_groups=dm.prefetch_groups
    )
    loader = LanceDataLoader(dataset, metrics=True)
    iterate(loader)()
    return loader


def loader_pair(
    uri: str, columns: list[str], shuffle=None, transform=None
) -> tuple[Callable[[], int], Callable[[], int], int]:
    """Epochs of one loader with its metrics on, and of the same loader with them off; batches per epoch.

    The two sides share one loader, and so its reader threads: two loaders built one after the
    other were not equal even with identical settings (with metrics on in both, the first built
    read 9% slower over 8 quiet repetitions; the cause is not pinned down). Switching off does what
    ``LanceDataLoader(..., metrics=False)`` does: no meter, clock off. Each side reads epochs
    0, 1, 2, ... of its own, so both read the same sequence of epochs.
    """
    loader = warm_loader(uri, columns, shuffle, transform)
    dataset, meter = loader.dataset, loader.meter

    def side(metrics: bool) -> Callable[[], int]:
        epochs = iter(range(1 << 30))

        def run() -> int:
            loader.meter, dataset.clock.enabled = (meter if metrics else None), metrics
            loader.set_epoch(next(epochs))
            return iterate(loader)()

        return run

    return side(True), side(False), len(loader)


#: Rows of the table the takes read (takes are slow: a smaller table allows more repetitions).
TAKE_ROWS = 200_000
#: Training steps per fit (``limit_train_batches``): short fits, so that more repetitions fit the time.
FIT_STEPS = 1000
#: The fit configurations, ``model/callbacks``: the candidates, their baselines (``none``), and a
#: no-op callback on the do-nothing model (what any callback costs).
FIT_KINDS = ("mlp/monitor", "mlp/none", "trivial/monitor", "trivial/none", "trivial/noop")


def fit_runs(uri: str, columns: list[str], log_dir: Path) -> dict[str, Callable[[], float]]:
    """Fits of `FIT_STEPS` steps, one callable per kind of `FIT_KINDS`.

    Models: ``mlp``, 128 -> 256 -> 10 on the vectors (cross-entropy on ``label % 10``);
    ``trivial``, one 1x1 linear layer on one label. Callbacks: ``monitor``, metrics on and
    `DataLoadingMonitor` logging every 50 steps; ``none``, metrics off (what
    ``LanceDataLoader(..., metrics=False)`` sets) and no monitor; ``noop``, metrics off and a
    callback that does nothing. Each callable runs one fit and returns the rows/s between the
    first and the last training batch.
    """
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from lance_lightning import DataLoadingMonitor

    class Trivial(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch["label"][:1].float().reshape(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class MLP(Trivial):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.layer(batch["vec"]), batch["label"].long() % 10)

    class EpochClock(pl.Callback):
        def __init__(self) -> None:
            self.first = self.last = 0.0
            self.rows = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                self.first = time.perf_counter()
                self.rows = 0
            else:
                self.rows += len(batch["label"])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.last = time.perf_counter()

    def make(kind: str) -> Callable[[], float]:
        model, callbacks = kind.split("/")

        def run() -> float:
            dm = LanceDataModule(train=LanceSource(uri, columns=columns), batch_size=BATCH)
            dm.setup("fit")
            loader = dm.train_dataloader()
            if callbacks != "monitor":
                loader.meter = None
                loader.dataset.clock.enabled = False
            clock = EpochClock()
            extra = {
                "monitor": [DataLoadingMonitor(log_every_n_steps=50, report=False)],
                "noop": [pl.Callback()],
                "none": [],
            }[callbacks]
            logger = CSVLogger(str(log_dir))
            fit = trainer(log_dir, [clock, *extra], limit_train_batches=FIT_STEPS, logger=logger, log_every_n_steps=50)
            fit.fit({"mlp": MLP, "trivial": Trivial}[model](), datamodule=dm)
            return clock.rows / (clock.last - clock.first)

        return run

    return {kind: make(kind) for kind in FIT_KINDS}


def fit_rates(runs: dict[str, Callable[[], float]], reps: int) -> tuple[dict[str, Paired], list[float]]:
    """Each kind of ``runs`` against its model's ``none``: fits in ``runs`` order, then reversed,
    alternately."""
    kinds = list(runs)

    def measure(rep: int) -> dict[str, float]:
        order = kinds if rep % 2 == 0 else kinds[::-1]
        return {kind: runs[kind]() for kind in order}

    results, loads, _ = quiet_reps(measure, reps)
    baseline = {kind: kind.split("/")[0] + "/none" for kind in kinds}
    return {
        kind: summary([(r[kind], r[baseline[kind]]) for r in results], blocks=True)
        for kind in kinds
        if kind != baseline[kind]
    }, loads


def measure(p: Params) -> str:
    cache, rows, image_rows, min_seconds, reps = p.cache, p.rows, p.image_rows, p.min_seconds, p.reps
    vec_uri = common.vec_dataset(cache, rows)
    take_uri = common.vec_dataset(cache, TAKE_ROWS)
    image_uri = common.image_dataset(cache, image_rows)
    results: list[Row] = []
    raw_lines: list[str] = []
    notes = [
        f"vector table: {vec_uri} ({rows:,} rows, columns id, label, vec[128] float32); image table: "
        f"{image_uri} ({image_rows:,} JPEGs of 64x64)",
        f"{3 * reps} paired repetitions per loader row and {2 * reps} per fit row (alternating order); loader "
        f"rows measured for at least {min_seconds:g} s each (whole epochs); the takes read the "
        f"{TAKE_ROWS:,}-row vector table; fit rows are one fit of {FIT_STEPS:,} steps each, timed from the "
        "first to the last batch",
        "loaders: num_workers=0, reader_threads=2, prefetch_groups=2 (the defaults), B=256",
        common.steady_allocator() + " (see `common.steady_allocator`: both sides are measured under the "
        "same allocator state)",
    ]

    def add(
        scenario: str,
        result: Paired,
        loads: list[float],
        note: str = "",
        target: float | None = TARGET,
        baseline: str = "metrics off",
    ) -> None:
        others = f"others used {100 * max(loads):.1f}% of the CPUs at most"
        row = Row(
            scenario,
            result.rows_per_s,
            baseline,
            result.base_rows_per_s,
            result.ratio,
            target,
            f"{note}; {others}" if note else others,
        )
        results.append(row)
        raw = result.raw_text()
        raw_lines.append(
            f"- {scenario}: {raw} (others' CPU share per repetition: "
            f"{', '.join(f'{100 * share:.1f}%' for share in loads)})"
        )
        print(
            f"  {scenario:<52} on {row.rows_per_s:>12,.0f} rows/s  off {row.base_rows_per_s:>12,.0f} rows/s  "
            f"ratio {row.ratio:5.3f}  {row.status}   raw (on / off): {raw}",
            flush=True,
        )

    vec_columns = ["id", "label", "vec"]

    def loader_rows(scenario: str, on: Callable[[], int], off: Callable[[], int], note: str = "") -> None:
        wall = paired(on, off, 3 * reps, min_seconds, quiet=2, blocks=True)
        add(scenario, wall, wall.loads, note)
        add(
            f"{scenario}, rows per CPU-second",
            wall.cpu,
            wall.loads,
            target=None,
            baseline="metrics off, rows per CPU-second",
        )

    print(f"\n[1/4] scan, NoShuffle, {rows:,} rows", flush=True)
    on, off, batches = loader_pair(vec_uri, vec_columns)
    loader_rows(f"loader NoShuffle scan B={BATCH}", on, off, f"{batches} batches per epoch")

    print(f"\n[2/4] takes, RowShuffle(clump_rows=64), {TAKE_ROWS:,} rows", flush=True)
    on, off, _ = loader_pair(take_uri, vec_columns, shuffle=RowShuffle(seed=1, clump_rows=64))
    loader_rows(f"loader RowShuffle(clump_rows=64) B={BATCH}", on, off)

    print(f"\n[3/4] JPEG decode, {image_rows:,} rows", flush=True)
    on, off, _ = loader_pair(image_uri, ["image", "label"], transform=DecodeImage(column="image", mode="rgb"))
    loader_rows(
        f"loader DecodeImage B={BATCH}", on, off, "two-stage pipeline: read groups, then convert + decode per batch"
    )

    print(f"\n[4/4] Trainer.fit, {FIT_STEPS:,} steps, an MLP and a do-nothing model", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_metrics_") as log_dir:
        fits, loads = fit_rates(fit_runs(vec_uri, vec_columns, Path(log_dir)), 2 * reps)
        monitor = "metrics on, DataLoadingMonitor(log_every_n_steps=50), CSVLogger vs metrics off, no monitor"
        add(
            f"fit MLP + DataLoadingMonitor B={BATCH}",
            fits["mlp/monitor"],
            loads,
            f"{FIT_STEPS} steps of a 128-256-10 MLP on the vectors; {monitor}",
            baseline="metrics off, no callback",
        )
        add(
            f"fit do-nothing model + DataLoadingMonitor B={BATCH}",
            fits["trivial/monitor"],
            loads,
            f"{FIT_STEPS} steps of a model that does nothing (every step is Lightning's loop); {monitor}",
            target=None,
            baseline="metrics off, no callback",
        )
        add(
            f"fit do-nothing model + a no-op callback B={BATCH}",
            fits["trivial/noop"],
            loads,
            "what Lightning's dispatch to any callback costs: metrics off, `Callback()` vs no callback",
            target=None,
            baseline="metrics off, no callback",
        )
    intro = (
        "Each loader row compares one loader with metrics on (the default: "
        "per-batch waits, stage times, Lance I/O statistics, latency histogram) and off (what "
        "`LanceDataLoader(metrics=False)` sets), measured back to back, the order alternating; rows/s are "
        "medians, the ratio is the median over blocks of two repetitions (one in each order) of the geometric "
        f"mean of their ratios. Target: ratio ≥ {TARGET} (wall-clock rows/s). The rows per "
        "CPU-second of this process (all threads) are reported alongside: on a shared machine they are less "
        "disturbed by other processes than wall time. A repetition during which other processes used "
        f"≥ {100 * QUIET:.0f}% of the CPUs is measured again (up to 2x the repetitions). Raw figures: on / off."
    )
    plot = p.out.with_suffix(".png")
    return common.rows_report(results, intro, notes, raw_lines, plot, f"lance-lightning metrics overhead ({p.kind})")
