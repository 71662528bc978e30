"""Real 2-process CPU DDP (gloo) through ``Trainer.fit``, one fit per configuration.

Run by ``tests/scenarios/test_ddp.py`` as ``python tests/ddp_worker.py OUT_DIR URI [NAME ...]``. Lightning's
``ddp`` strategy re-runs this same command for rank 1, so both ranks loop over the same
configurations in the same order (later Trainers reuse the process group). Each rank writes
``OUT_DIR/<name>.rank<r>.json`` with the ids it trained on, per step, the epoch of each step, and
how many filter-scan child processes it started (`FILTER_IN_CHILD` configurations scan there; with
the survey cache one rank of the node scans).
"""

from __future__ import annotations

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
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
)

WORLD_SIZE = 2
MAX_EPOCHS = 2
BATCH_SIZE = 16

#: name -> (LanceDataModule arguments other than `train`, the train filter)
CONFIGS: dict[str, dict[str, Any]] = {
    "noshuffle": dict(shuffle=NoShuffle(), drop_last=True, filter=None),
    "shard": dict(shuffle=ShardShuffle(40, seed=1), drop_last=True, filter=None),
    "row": dict(shuffle=RowShuffle(seed=2), drop_last=False, filter=None),
    "buffer-workers": dict(shuffle=BufferShuffle(64, seed=3, shard_rows=8), drop_last=True, filter=None, num_workers=2),
    "shard-filtered-pad": dict(
        shuffle=ShardShuffle(16, seed=4, shuffle_within_shard=True), drop_last=False, filter="label != 3"
    ),
    "row-clump-selective": dict(shuffle=RowShuffle(seed=5, clump_rows=4), drop_last=True, filter="id % 3 = 2"),
}
#: Configurations whose filter each rank evaluates in a child process, as it does from
#: `filter_scan.CHILD_SCAN_ROWS` rows up (test datasets are far smaller).
FILTER_IN_CHILD = {"row-clump-selective"}


def make_datamodule(uri: str, name: str) -> LanceDataModule:
    config = dict(CONFIGS[name])
    source = LanceSource(uri, columns=["id", "x"], filter=config.pop("filter"))
    return LanceDataModule(train=source, batch_size=BATCH_SIZE, **config)


def main(out_dir: str, uri: str, names: list[str]) -> None:
    import lightning.pytorch as pl

    from lance_lightning.plan import filter_scan
    from tests.helpers import RecordingModel

    child_scans = 0
    child_env = filter_scan._child_env

    def counted_child_env() -> dict[str, str]:  # called once per child it starts
        nonlocal child_scans
        child_scans += 1
        return child_env()

    filter_scan._child_env = counted_child_env
    default_child_rows = filter_scan.CHILD_SCAN_ROWS
    out = Path(out_dir)
    for name in names:
        started = time.perf_counter()
        child_scans = 0
        filter_scan.CHILD_SCAN_ROWS = 0 if name in FILTER_IN_CHILD else default_child_rows
        datamodule = make_datamodule(uri, name)
        explained: list[str] = []  # splits whose plan text this rank built
        explain = datamodule.explain
        datamodule.explain = lambda split="train": explained.append(split) or explain(split)
        model = RecordingModel()
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy="ddp",
            max_epochs=MAX_EPOCHS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=str(out / name),
        )
        trainer.fit(model, datamodule)
        record = {
            "name": name,
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "seen": model.seen,
            "seen_epochs": model.seen_epochs,
            "num_training_batches": trainer.num_training_batches,
            "global_step": trainer.global_step,
            "explained": explained,
            "child_scans": child_scans,
            "seconds": time.perf_counter() - started,
        }
        path = out / f"{name}.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(record))
        print(f"[rank {trainer.global_rank}] {name}: {len(model.seen)} steps in {record['seconds']:.1f}s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(f"usage: {sys.argv[0]} OUT_DIR URI [NAME ...]")
    os.environ.setdefault("PYTHONPATH", str(REPO_ROOT))
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or list(CONFIGS))
