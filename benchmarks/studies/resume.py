"""Resume benchmark: time from ``Trainer.fit(ckpt_path=...)`` to the first training batch.

The cursor is O(1): resuming at 90% of an epoch must cost the same as resuming at 10% (nothing
is replayed or skipped row by row). For each shuffle strategy this script

1. trains one real epoch (big batches, a trivial model, no validation) that writes real
   checkpoints (``trainer.save_checkpoint`` in ``on_train_batch_end``, where ModelCheckpoint saves)
   after ``steps_per_position`` consecutive steps s at 10%, 50% and 90% of the epoch: one batch
   may span more ranges than its neighbours, which is that batch's cost, not the resume's;
2. resumes from each checkpoint ``reps`` times (positions interleaved) with a fresh Trainer,
   data module and model, timing ``trainer.fit(model, datamodule=dm, ckpt_path=...)`` from the
   call to the model's ``on_train_batch_start`` for the first batch (``max_steps=s+1``: one step);
3. checks the first resumed batch is the batch the uninterrupted epoch had at step s.

A fresh fit without a checkpoint (time to its first batch) is measured alongside as a reference.
Every fit runs in this process: the dataset stays open (as in one training job), so the numbers
compare resume positions, not process start-up.
"""

from __future__ import annotations

import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.fit import VecModel, trainer
from benchmarks.harness.study import Params
from lance_lightning import (
    BufferShuffle,
    DataCursorCheckpoint,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    ShuffleStrategy,
)

DM_KEY = "LanceDataModule"
TARGET_RATIO = 1.2


def strategies(batch_size: int) -> dict[str, ShuffleStrategy]:
    return {
        "none": NoShuffle(),
        "shard": ShardShuffle(shard_rows=batch_size, seed=1),
        "row": RowShuffle(seed=2, clump_rows=64),
        "buffer": BufferShuffle(buffer_rows=8 * batch_size, shard_rows=batch_size, seed=3),
    }


def data_module(p: Params, uri: str, shuffle: ShuffleStrategy) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "label", "vec"], filter=p.filter or None),
        batch_size=p.batch_size,
        shuffle=shuffle,
        num_workers=p.workers,
    )


def time_to_first_batch(
    p: Params, root: Path, uri: str, shuffle: ShuffleStrategy, ckpt: Path | None, step: int
) -> VecModel:
    """One fit of one step; the model holds ``fit_called_at`` and ``first_batch_at``."""
    model = VecModel()
    tr = trainer(root, [DataCursorCheckpoint()], max_steps=step + 1)
    dm = data_module(p, uri, shuffle)
    model.fit_called_at = time.perf_counter()
    tr.fit(model, datamodule=dm, ckpt_path=str(ckpt) if ckpt else None)
    assert model.first_batch_at is not None, "no training batch ran"
    return model


class SaveAtSteps(Callback):
    """Saves a real checkpoint (``trainer.save_checkpoint``, as ModelCheckpoint does) after each listed step."""

    def __init__(self, paths: dict[int, Path]) -> None:
        self.paths = paths

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        path = self.paths.get(trainer.global_step)
        if path is not None:
            trainer.save_checkpoint(path)


def bench_strategy(p: Params, uri: str, name: str, shuffle: ShuffleStrategy, root: Path, log) -> dict[str, Any]:
    matched = lance.dataset(uri).count_rows(p.filter) if p.filter else lance.dataset(uri).count_rows()
    steps_per_epoch = matched // p.batch_size
    # Each position is measured at several consecutive steps: one batch may span more ranges than
    # its neighbours (e.g. the epoch's short shard), which is the batch's cost, not the resume's.
    targets = {
        f: [min(steps_per_epoch - 1, max(1, round(f * steps_per_epoch)) + j) for j in range(p.steps_per_position)]
        for f in p.positions
    }
    ckpt_root = root / name
    paths = {s: ckpt_root / f"step={s}.ckpt" for steps in targets.values() for s in steps}
    model = VecModel(record_steps=set(paths))
    started = time.perf_counter()
    trainer(ckpt_root, [DataCursorCheckpoint(), SaveAtSteps(paths)], max_steps=-1).fit(
        model, datamodule=data_module(p, uri, shuffle)
    )
    epoch_s = time.perf_counter() - started
    log(f"[{name}] one epoch of {steps_per_epoch} steps ({matched:,} rows) with checkpoints: {epoch_s:.1f} s")
    for path in paths.values():
        assert path.exists(), f"missing checkpoint {path}"

    state = torch.load(paths[targets[p.positions[-1]][0]], weights_only=True)[DM_KEY]["train_cursor"]
    # One untimed resume first, so the timed fits all find the same warm caches and imports.
    first_step = targets[p.positions[0]][0]
    time_to_first_batch(p, root / "resume", uri, shuffle, paths[first_step], first_step)
    timings: dict[Any, list[float]] = {f: [] for f in targets}
    timings["fresh"] = []
    for rep in range(p.reps):
        order = list(targets) if rep % 2 == 0 else list(reversed(targets))
        fresh = time_to_first_batch(p, root / "fresh", uri, shuffle, None, 0)
        timings["fresh"].append(fresh.first_batch_at - fresh.fit_called_at)
        for f in order:
            times = []
            for s in targets[f]:
                m = time_to_first_batch(p, root / "resume", uri, shuffle, paths[s], s)
                assert m.first_batch_idx == s, f"resumed at batch {m.first_batch_idx}, expected {s}"
                assert m.first_ids == model.recorded[s], f"resumed batch at step {s} is not the epoch's batch {s}"
                times.append(m.first_batch_at - m.fit_called_at)
            timings[f].append(statistics.median(times))
        log(
            f"[{name}] repeat {rep + 1}: "
            + ", ".join(
                f"{k if k == 'fresh' else f'{int(k * 100)}%'}={v[-1] * 1000:.0f} ms" for k, v in timings.items()
            )
        )
    return {
        "name": name,
        "shuffle": shuffle,
        "targets": targets,
        "timings": timings,
        "epoch_s": epoch_s,
        "steps": steps_per_epoch,
        "matched": matched,
        "state": state,
        "state_bytes": len(pickle.dumps(state)),
    }


def report(p: Params, uri: str, results: list[dict[str, Any]]) -> str:
    lines = [
        f"- data: `{uri}`, {p.rows:,} rows (id, label, vec float32[{common.VEC_DIM}]), "
        f"filter {p.filter!r}, batch_size {p.batch_size}, num_workers {p.workers}",
        f"- each time: median over {p.reps} repeats (positions interleaved) of the median over "
        f"{p.steps_per_position} consecutive checkpointed steps per position, from the `fit` call to the "
        "model's `on_train_batch_start` of the first batch; checkpoints are real Lightning checkpoint files "
        "written during one uninterrupted epoch",
        "",
    ]
    rows = []
    for r in results:
        positions = [("fresh fit", "0", 0, r["timings"]["fresh"])]
        for f, steps in r["targets"].items():
            positions.append((f"{int(f * 100)}%", f"{steps[0]}–{steps[-1]}", steps[0] * p.batch_size, r["timings"][f]))
        for position, step, consumed, t in positions:
            spread = f"{min(t) * 1000:.0f}–{max(t) * 1000:.0f}"
            rows.append((repr(r["shuffle"]), position, step, consumed, statistics.median(t) * 1000, spread))
    heads = "strategy | position | step | rows consumed | time to first batch (ms, median) | min–max (ms)"
    lines += tables.table(heads, "< > > >, >.0f >", rows)
    hi, lo = int(p.positions[-1] * 100), int(p.positions[0] * 100)
    lines += [
        "",
        f"t{hi}/t{lo} is the ratio of the medians; the paired ratio is the median over repeats of "
        f"t{hi}/t{lo} measured back to back (less sensitive to load drifts).",
        "",
    ]
    heads = f"strategy | t{hi}/t{lo} | paired t{hi}/t{lo} | target | result | cursor state (bytes, pickled) | "
    heads += "epoch with checkpoints (s)"
    verdicts = ["PASS" if r["ratio"] <= TARGET_RATIO else "FAIL" for r in results]
    ratios = [
        (repr(r["shuffle"]), r["ratio"], r["paired"], f"≤ {TARGET_RATIO}", verdict, r["state_bytes"], r["epoch_s"])
        for r, verdict in zip(results, verdicts)
    ]
    lines += tables.table(heads, "< >.3f >.3f > ^ > >.1f", ratios)
    lines += [
        "",
        "Cursor state saved at the last position (`ckpt['LanceDataModule']['train_cursor']`, "
        f"strategy {results[-1]['shuffle']!r}):",
        "",
        "```",
        repr(results[-1]["state"]),
        "```",
        "",
    ]
    return "\n".join(lines)


def measure(p: Params) -> str:
    uri = common.vec_dataset(p.cache, p.rows)
    chosen = strategies(p.batch_size)
    work = Path(tempfile.mkdtemp(prefix="bench_resume_"))
    results = []
    try:
        for name in p.strategies:
            r = bench_strategy(p, uri, name, chosen[name], work / "runs", print)
            t = r["timings"]
            last, first = t[p.positions[-1]], t[p.positions[0]]
            r["ratio"] = statistics.median(last) / statistics.median(first)
            r["paired"] = statistics.median(b / a for a, b in zip(first, last))
            results.append(r)
            shutil.rmtree(work / "runs" / name, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report(p, uri, results)
