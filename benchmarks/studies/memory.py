"""Memory benchmark: peak RSS per epoch over a 20-epoch run stays flat.

A real ``Trainer`` trains a tiny model for ``epochs`` epochs on JPEG images stored in Lance
(`common.image_dataset`: 64x64 RGB), read with ``RowShuffle`` and decoded by
``DecodeImage`` in the loader. A sampler thread reads the resident set size every
``interval`` seconds (`benchmarks.harness.memory.RssSampler`: psutil), for the training
process and, with ``num_workers > 0``, its DataLoader worker processes; each epoch's peak is the
largest sample taken from its start to its end. One run per ``workers`` value (default 0
and 2), one after the other. The process-lifetime peak (``VmHWM``) is reported too.

The figure of merit is the ratio of the last epoch's peak to epoch 2's peak (epoch 1 includes
one-time allocations: imports, thread pools, first batches): flat means ``<= 1.05``.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.fit import ImageModel, trainer
from benchmarks.harness.memory import RssSampler
from benchmarks.harness.study import Params
from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from lance_lightning.transforms import DecodeImage

TARGET = 1.05
MB = 1024 * 1024


class EpochPeaks(Callback):
    """Per epoch: peak RSS, RSS at its end and its wall time."""

    def __init__(self, sampler: RssSampler) -> None:
        self.sampler = sampler
        self.rows: list[tuple[int, int, int, float]] = []  # (epoch, peak, end rss, seconds)
        self._started = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.sampler.reset()
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        seconds = time.perf_counter() - self._started
        peak = self.sampler.reset()
        self.rows.append((trainer.current_epoch + 1, peak, self.sampler.rss(), seconds))
        print(f"epoch {trainer.current_epoch + 1:>2}: peak RSS {peak / MB:7.1f} MiB, {seconds:5.1f} s", flush=True)


def run(uri: str, p: Params, num_workers: int) -> tuple[EpochPeaks, str]:
    """One ``Trainer.fit`` of ``p.epochs`` epochs, sampled; returns the per-epoch peaks and the RSS source."""
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"]),
        batch_size=p.batch_size,
        shuffle=RowShuffle(seed=0),
        transform=DecodeImage(column="image"),
        num_workers=num_workers,
    )
    sampler = RssSampler(p.interval, children=num_workers > 0)
    peaks = EpochPeaks(sampler)
    fit = trainer(p.cache, [peaks], max_epochs=p.epochs)
    print(f"-- num_workers {num_workers}", flush=True)
    sampler.start()
    try:
        fit.fit(ImageModel(), datamodule=dm)
    finally:
        sampler.stop()
        dm.teardown("fit")
    return peaks, sampler.source


def ratio(peaks: EpochPeaks) -> float:
    """Peak RSS of the last epoch / peak RSS of epoch 2."""
    by_epoch = {epoch: peak for epoch, peak, _, _ in peaks.rows}
    return by_epoch[max(by_epoch)] / by_epoch[2]


def report(runs: dict[int, EpochPeaks], p: Params, uri: str, source: str, hwm_mib: float) -> str:
    last = p.epochs
    lines = [
        f"Data: `{uri}`, {p.rows:,} rows (id, 64x64 RGB JPEG, label). Real `Trainer`, "
        f"{last} epochs, a tiny model (8x8 average pool + linear), batch_size {p.batch_size}, "
        "`RowShuffle(seed=0)`, `DecodeImage(column='image')` in the loader. One run per `num_workers`, one "
        "after the other in this process: with 0 the reader threads run in the training process; with more, "
        "RSS is summed over the training process and its (forkserver, persistent) workers. RSS sampled every "
        f"{p.interval:g} s with {source}; an epoch's peak is the largest sample from its start to its end "
        f"(both included). Process VmHWM (lifetime peak of the training process, all runs): {hwm_mib:.1f} MiB.",
        "",
    ]
    heads = f"num_workers | peak RSS epoch {last} / epoch 2 | target | result | epoch 2 peak (MiB) "
    heads += f"| epoch {last} peak (MiB) | growth (MiB) | max over epochs 2..{last} (MiB)"
    rows = []
    for workers, peaks in runs.items():
        by_epoch = {epoch: peak / MB for epoch, peak, _, _ in peaks.rows}
        r = ratio(peaks)
        verdict = "PASS" if r <= TARGET else "FAIL"
        top = max(v for e, v in by_epoch.items() if e >= 2)
        rows.append(
            (workers, r, f"≤ {TARGET}", verdict, by_epoch[2], by_epoch[last], by_epoch[last] - by_epoch[2], top)
        )
    lines += tables.table(heads, "> >.3f > ^ >.1f >.1f >+.1f >.1f", rows)
    per_epoch = "epoch | peak RSS (MiB) | RSS at epoch end (MiB) | seconds"
    for workers, peaks in runs.items():
        lines += ["", f"## Per epoch, num_workers {workers}", ""]
        lines += tables.table(
            per_epoch, "> >.1f >.1f >.1f", [(e, top / MB, end / MB, s) for e, top, end, s in peaks.rows]
        )
    return "\n".join(lines)


def measure(p: Params) -> str:
    if p.epochs < 2:
        raise ValueError("epochs must be at least 2 (epoch 2 is the reference)")
    uri = common.image_dataset(p.cache, p.rows)
    runs: dict[int, EpochPeaks] = {}
    for workers in p.workers:
        runs[workers], source = run(uri, p, workers)
    return report(runs, p, uri, source, common.peak_rss_mb())  # VmHWM: getrusage's ru_maxrss
