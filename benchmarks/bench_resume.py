"""Resume benchmark: time from ``Trainer.fit(ckpt_path=...)`` to the first training batch.

The cursor is O(1): resuming at 90% of an epoch must cost the same as resuming at 10% (nothing
is replayed or skipped row by row). For each shuffle strategy this script

1. trains one real epoch (big batches, a trivial model, no validation) that writes real
   checkpoints (``trainer.save_checkpoint`` in ``on_train_batch_end``, where ModelCheckpoint saves)
   after ``--steps-per-position`` consecutive steps s at 10%, 50% and 90% of the epoch: one batch
   may span more ranges than its neighbours, which is that batch's cost, not the resume's;
2. resumes from each checkpoint ``--repeats`` times (positions interleaved) with a fresh Trainer,
   data module and model, timing ``trainer.fit(model, datamodule=dm, ckpt_path=...)`` from the
   call to the model's ``on_train_batch_start`` for the first batch (``max_steps=s+1``: one step);
3. checks the first resumed batch is the batch the uninterrupted epoch had at step s.

A fresh fit without a checkpoint (time to its first batch) is measured alongside as a reference.
Every fit runs in this process: the dataset stays open (as in one training job), so the numbers
compare resume positions, not process start-up.

Usage (from the repository root)::

    python benchmarks/bench_resume.py                     # 2,097,152 rows x 128 floats, all strategies
    python benchmarks/bench_resume.py --rows 200000 --strategies shard   # quick

Prints a markdown table, t90/t10 per strategy (target <= 1.2) and the cursor state size, and
writes them to ``benchmarks/results/resume.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import common  # noqa: E402
import lance  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from lance_lightning import (  # noqa: E402
    BufferShuffle,
    DataCursorCheckpoint,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    ShuffleStrategy,
)

VEC_DIM = 128
FRAGMENT_ROWS = 262_144
DM_KEY = "LanceDataModule"
RESULTS = common.RESULTS_DIR / "resume.md"
TARGET_RATIO = 1.2


def strategies(batch_size: int) -> dict[str, ShuffleStrategy]:
    return {
        "none": NoShuffle(),
        "shard": ShardShuffle(shard_rows=batch_size, seed=1),
        "row": RowShuffle(seed=2, clump_rows=64),
        "buffer": BufferShuffle(buffer_rows=8 * batch_size, shard_rows=batch_size, seed=3),
    }


# -- data -------------------------------------------------------------------------------------
def write_vectors(path: Path, rows: int) -> str:
    """id int64, label int64, vec fixed_size_list<float32>[128]; written in 64k-row chunks."""
    schema = pa.schema([("id", pa.int64()), ("label", pa.int64()), ("vec", pa.list_(pa.float32(), VEC_DIM))])

    def batches():
        rng = np.random.default_rng(0)
        for first in range(0, rows, 65_536):
            n = min(65_536, rows - first)
            ids = np.arange(first, first + n, dtype=np.int64)
            vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * VEC_DIM, dtype=np.float32)), VEC_DIM)
            yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids % 100), vec], schema=schema)

    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()), str(path), mode="create", max_rows_per_file=FRAGMENT_ROWS
    )
    return str(path)


# -- the model ----------------------------------------------------------------------------------
class TinyModel(pl.LightningModule):
    """One linear layer on the first vector component; remembers when and what the first batch was."""

    def __init__(self, record_steps: set[int] | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.fit_called_at: float | None = None
        self.first_batch_at: float | None = None
        self.first_batch_idx: int | None = None
        self.first_ids: list[int] | None = None
        self.record_steps = record_steps or set()
        self.recorded: dict[int, list[int]] = {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.first_batch_at is None:
            self.first_batch_at = time.perf_counter()
            self.first_batch_idx = batch_idx
            self.first_ids = batch["id"][:8].tolist()
        if self.trainer.global_step in self.record_steps:
            self.recorded[self.trainer.global_step] = batch["id"][:8].tolist()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch["vec"][:, :1].float()
        return (self.layer(x) - x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(root: Path, *, max_steps: int, callbacks: list[Callback]) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        default_root_dir=str(root),
    )


def data_module(args: argparse.Namespace, uri: str, shuffle: ShuffleStrategy) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "label", "vec"], filter=args.filter),
        batch_size=args.batch_size,
        shuffle=shuffle,
        num_workers=args.num_workers,
    )


def time_to_first_batch(
    args: argparse.Namespace, root: Path, uri: str, shuffle: ShuffleStrategy, ckpt: Path | None, step: int
) -> TinyModel:
    """One fit of one step; the model holds ``fit_called_at`` and ``first_batch_at``."""
    model = TinyModel()
    tr = trainer(root, max_steps=step + 1, callbacks=[DataCursorCheckpoint()])
    dm = data_module(args, uri, shuffle)
    model.fit_called_at = time.perf_counter()
    tr.fit(model, datamodule=dm, ckpt_path=str(ckpt) if ckpt else None)
    assert model.first_batch_at is not None, "no training batch ran"
    return model


# -- one strategy -------------------------------------------------------------------------------
class SaveAtSteps(Callback):
    """Saves a real checkpoint (``trainer.save_checkpoint``, as ModelCheckpoint does) after each listed step."""

    def __init__(self, paths: dict[int, Path]) -> None:
        self.paths = paths

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        path = self.paths.get(trainer.global_step)
        if path is not None:
            trainer.save_checkpoint(path)


def bench_strategy(
    args: argparse.Namespace, uri: str, name: str, shuffle: ShuffleStrategy, root: Path, log
) -> dict[str, Any]:
    matched = lance.dataset(uri).count_rows(args.filter) if args.filter else lance.dataset(uri).count_rows()
    steps_per_epoch = matched // args.batch_size
    # Each position is measured at several consecutive steps: one batch may span more ranges than
    # its neighbours (e.g. the epoch's short shard), which is the batch's cost, not the resume's.
    targets = {
        p: [min(steps_per_epoch - 1, max(1, round(p * steps_per_epoch)) + j) for j in range(args.steps_per_position)]
        for p in args.positions
    }
    ckpt_root = root / name
    paths = {s: ckpt_root / f"step={s}.ckpt" for steps in targets.values() for s in steps}
    model = TinyModel(record_steps=set(paths))
    started = time.perf_counter()
    trainer(ckpt_root, max_steps=-1, callbacks=[DataCursorCheckpoint(), SaveAtSteps(paths)]).fit(
        model, datamodule=data_module(args, uri, shuffle)
    )
    epoch_s = time.perf_counter() - started
    log(f"[{name}] one epoch of {steps_per_epoch} steps ({matched:,} rows) with checkpoints: {epoch_s:.1f} s")
    for path in paths.values():
        assert path.exists(), f"missing checkpoint {path}"

    state = torch.load(paths[targets[args.positions[-1]][0]], weights_only=True)[DM_KEY]["train_cursor"]
    # One untimed resume first, so the timed fits all find the same warm caches and imports.
    first_step = targets[args.positions[0]][0]
    time_to_first_batch(args, root / "resume", uri, shuffle, paths[first_step], first_step)
    timings: dict[Any, list[float]] = {p: [] for p in targets}
    timings["fresh"] = []
    for rep in range(args.repeats):
        order = list(targets) if rep % 2 == 0 else list(reversed(targets))
        fresh = time_to_first_batch(args, root / "fresh", uri, shuffle, None, 0)
        timings["fresh"].append(fresh.first_batch_at - fresh.fit_called_at)
        for p in order:
            times = []
            for s in targets[p]:
                m = time_to_first_batch(args, root / "resume", uri, shuffle, paths[s], s)
                assert m.first_batch_idx == s, f"resumed at batch {m.first_batch_idx}, expected {s}"
                assert m.first_ids == model.recorded[s], f"resumed batch at step {s} is not the epoch's batch {s}"
                times.append(m.first_batch_at - m.fit_called_at)
            timings[p].append(statistics.median(times))
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


# -- report -------------------------------------------------------------------------------------
def report(args: argparse.Namespace, uri: str, results: list[dict[str, Any]]) -> str:
    lines = [
        "# Resume benchmark: `Trainer.fit(ckpt_path=...)` to the first training batch",
        "",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `{common.command_line()}`",
        f"- machine: {common.machine(lightning=True)}",
        f"- data: `{uri}`, {args.rows:,} rows (id, label, vec float32[{VEC_DIM}]), "
        f"filter {args.filter!r}, batch_size {args.batch_size}, num_workers {args.num_workers}",
        f"- each time: median over {args.repeats} repeats (positions interleaved) of the median over "
        f"{args.steps_per_position} consecutive checkpointed steps per position, from the `fit` call to the "
        "model's `on_train_batch_start` of the first batch; checkpoints are real Lightning checkpoint files "
        "written during one uninterrupted epoch",
        "",
        "| strategy | position | step | rows consumed | time to first batch (ms, median) | min–max (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        fresh = r["timings"]["fresh"]
        lines.append(
            f"| {r['shuffle']!r} | fresh fit | 0 | 0 | {statistics.median(fresh) * 1000:.0f} | "
            f"{min(fresh) * 1000:.0f}–{max(fresh) * 1000:.0f} |"
        )
        for p, steps in r["targets"].items():
            t = r["timings"][p]
            lines.append(
                f"| {r['shuffle']!r} | {int(p * 100)}% | {steps[0]}–{steps[-1]} | {steps[0] * args.batch_size:,} | "
                f"{statistics.median(t) * 1000:.0f} | {min(t) * 1000:.0f}–{max(t) * 1000:.0f} |"
            )
    hi, lo = int(args.positions[-1] * 100), int(args.positions[0] * 100)
    lines += [
        "",
        f"t{hi}/t{lo} is the ratio of the medians; the paired ratio is the median over repeats of "
        f"t{hi}/t{lo} measured back to back (less sensitive to load drifts).",
        "",
        f"| strategy | t{hi}/t{lo} | paired t{hi}/t{lo} | target | result | cursor state (bytes, pickled) | "
        "epoch with checkpoints (s) |",
        "|---|---:|---:|---:|:---:|---:|---:|",
    ]
    for r in results:
        ratio = r["ratio"]
        lines.append(
            f"| {r['shuffle']!r} | {ratio:.3f} | {r['paired']:.3f} | ≤ {TARGET_RATIO} | "
            f"{'PASS' if ratio <= TARGET_RATIO else 'FAIL'} | {r['state_bytes']} | {r['epoch_s']:.1f} |"
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 2**21 rows: whole shards of 8192. With a short shard, every batch after it in the shuffled
    # order spans two ranges instead of one (in any run, resumed or not), which this benchmark
    # would misread as a resume cost.
    parser.add_argument("--rows", type=int, default=2**21)
    parser.add_argument(
        "--data", type=Path, default=None, help="dataset path (written there if missing; default: a temporary folder)"
    )
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument(
        "--strategies", default="none,shard,row,buffer", help="comma-separated subset of none, shard, row, buffer"
    )
    parser.add_argument("--positions", default="0.1,0.5,0.9", help="epoch fractions to checkpoint at")
    parser.add_argument("--filter", default=None, help="optional train filter, e.g. 'label < 50'")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--steps-per-position", type=int, default=3, help="consecutive steps checkpointed and resumed at each position"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a ratio misses the target")
    args = parser.parse_args(argv)
    args.positions = [float(p) for p in args.positions.split(",")]

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

    def log(msg: str) -> None:
        print(msg, flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench_resume_"))
    try:
        if args.data is not None and args.data.exists():
            uri = str(args.data)
            args.rows = lance.dataset(uri).count_rows()
            log(f"[data] using {uri} ({args.rows:,} rows)")
        else:
            target = args.data or work / "vectors.lance"
            started = time.perf_counter()
            uri = write_vectors(target, args.rows)
            log(f"[data] wrote {args.rows:,} rows to {uri} in {time.perf_counter() - started:.1f} s")
        chosen = strategies(args.batch_size)
        results = []
        for name in args.strategies.split(","):
            r = bench_strategy(args, uri, name, chosen[name], work / "runs", log)
            t = r["timings"]
            last, first = t[args.positions[-1]], t[args.positions[0]]
            r["ratio"] = statistics.median(last) / statistics.median(first)
            r["paired"] = statistics.median(b / a for a, b in zip(first, last))
            results.append(r)
            shutil.rmtree(work / "runs" / name, ignore_errors=True)
        text = report(args, uri, results)
        print("\n" + text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        common.write_result(args.out, text)
        log(f"wrote {args.out}")
        return 1 if args.strict and any(r["ratio"] > TARGET_RATIO for r in results) else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
