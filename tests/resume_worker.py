"""Subprocess script for the resume tests: one (possibly DDP) training run, argv-driven.

Lightning's DDP launcher re-executes this script with the same argv for every other rank, so it
must be deterministic and take everything from the command line. Every rank writes the ids it
trained on to ``<out>/ids_rank<R>.json``; with ``--ids-log`` each step also appends one JSON line
(flushed) so a run killed with SIGKILL leaves the ids of every step it started.

Example::

    python tests/resume_worker.py --uri /tmp/ds.lance --out /tmp/run --devices 2 \
        --shuffle row:2 --max-steps 7 --ckpt-every 7 --ckpt-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from lance_lightning import (  # noqa: E402
    BufferShuffle,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    ShuffleStrategy,
)


def make_shuffle(spec: str) -> ShuffleStrategy:
    """``none`` | ``shard:ROWS:SEED`` | ``row:SEED[:CLUMP]`` | ``buffer:BUFFER:SHARD:SEED``."""
    kind, *args = spec.split(":")
    values = [int(a) for a in args]
    if kind == "none":
        return NoShuffle()
    if kind == "shard":
        return ShardShuffle(shard_rows=values[0], seed=values[1])
    if kind == "row":
        return RowShuffle(seed=values[0], clump_rows=values[1] if len(values) > 1 else 1)
    if kind == "buffer":
        return BufferShuffle(buffer_rows=values[0], shard_rows=values[1], seed=values[2])
    raise ValueError(f"unknown shuffle spec {spec!r}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--out", required=True, help="folder for ids_rank<R>.json")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shuffle", default="none")
    parser.add_argument("--filter", default=None)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint(every_n_train_steps=...)")
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--ckpt-path", default=None, help="resume from this checkpoint")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per training step")
    parser.add_argument("--ids-log", default=None, help="append one JSON line per step (flushed)")
    parser.add_argument("--no-cursor-callback", action="store_true")
    parser.add_argument(
        "--filter-in-child", action="store_true", help="scan the filter in a child process, as large datasets do"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lance_lightning import DataCursorCheckpoint, LanceDataModule, LanceSource
    from lance_lightning.plan import filter_scan
    from tests.helpers import RecordingModel

    if args.filter_in_child:
        filter_scan.CHILD_SCAN_ROWS = 0

    class WorkerModel(RecordingModel):
        def __init__(self, sleep: float, ids_log: str | None) -> None:
            super().__init__()
            self.sleep = sleep
            self.ids_log = ids_log
            self._log: Any = None

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            if self.ids_log is not None:
                if self._log is None:
                    path = f"{self.ids_log}.rank{self.global_rank}"
                    self._log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across steps)
                record = {
                    "batch_idx": batch_idx,
                    "global_step": int(self.trainer.global_step),
                    "epoch": int(self.current_epoch),
                    "ids": self.seen[-1],
                }
                self._log.write(json.dumps(record) + "\n")
                self._log.flush()
            if self.sleep:
                time.sleep(self.sleep)
            return loss

    dm = LanceDataModule(
        train=LanceSource(args.uri, filter=args.filter),
        batch_size=args.batch_size,
        shuffle=make_shuffle(args.shuffle),
        num_workers=args.num_workers,
    )
    callbacks: list[Any] = [] if args.no_cursor_callback else [DataCursorCheckpoint()]
    if args.ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.ckpt_dir, filename="{step}", every_n_train_steps=args.ckpt_every, save_top_k=-1
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.max_steps,
        max_epochs=args.max_epochs,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.ckpt_every),
        default_root_dir=args.out,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    model = WorkerModel(args.sleep, args.ids_log)
    trainer.fit(model, datamodule=dm, ckpt_path=args.ckpt_path)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "seen": model.seen,
        "epochs": model.seen_epochs,
        "global_step": int(trainer.global_step),
    }
    (out / f"ids_rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
