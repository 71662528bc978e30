"""Probe: a vector scan through 2 worker processes, batches well under 1 MiB (rows/s per epoch).

Backs docs/performance.md ("Up to 1 MiB of tensors"): a worker's run of consecutive small batches,
sent as one message, is copied into one shared-memory slab when a tensor of it would arrive as a
view (`lance_lightning.produce.parcel.slab_run`), instead of travelling inside the pickled message
(a copy into it, through the pipe, and out of it). The table is ``--rows`` rows of ``id`` int64,
``label`` int32 and ``vec`` 128 float32 (written once under ``--cache``); the loader reads
``NoShuffle`` batches of 256 (128 KiB of ``vec``) with 2 persistent workers, every batch from
them (``LANCE_LIGHTNING_WORKER_HANDOFF=off``), for ``--epochs`` epochs after a first one. The
before figure is this script run on the commit before the change::

    uv run python benchmarks/probes/probe_worker_runs.py
    git worktree add /tmp/before <commit>~1
    cd /tmp/before && PYTHONPATH=/tmp/before /path/to/.venv/bin/python /path/to/probe_worker_runs.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lance_lightning_bench"))
    args = parser.parse_args()
    os.environ["LANCE_LIGHTNING_WORKER_HANDOFF"] = "off"
    from lance_lightning import LanceDataModule, LanceSource, NoShuffle

    path = args.cache / f"probe_worker_runs_{args.rows}.lance"
    if not path.exists():
        values = np.random.default_rng(0).random(args.rows * 128, dtype=np.float32)
        table = pa.table(
            {
                "id": np.arange(args.rows),
                "label": (np.arange(args.rows) % 100).astype(np.int32),
                "vec": pa.FixedSizeListArray.from_arrays(pa.array(values), 128),
            }
        )
        lance.write_dataset(table, str(path))
    dm = LanceDataModule(train=LanceSource(str(path)), batch_size=256, shuffle=NoShuffle(), num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    for _ in loader:  # the workers' start
        pass
    for epoch in range(1, args.epochs + 1):
        started, rows = time.perf_counter(), 0
        for batch in loader:
            rows += len(batch["id"])
        print(f"epoch {epoch}: {rows / (time.perf_counter() - started):,.0f} rows/s", flush=True)


if __name__ == "__main__":
    main()
