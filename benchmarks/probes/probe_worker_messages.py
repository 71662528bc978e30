"""Probe: rows/s of a sequential scan through a `LanceDataModule`'s loader at 0 and 2 worker
processes, and how the batches cross from the workers to the training process.

Backs docs/performance.md ("Reader threads first, worker processes for Python-heavy
transforms"): a worker sends runs of consecutive batches as one message (`Bundle`), each small
batch's tensors inside it (`lance_lightning.produce.parcel`), instead of one shared-memory file
descriptor per tensor. The table is 400,000 rows of ``id`` int64, ``label`` int32 and ``vec`` (128
float32), written once with a plain ``lance.write_dataset``; batch 256; each loader reads
``--epochs`` epochs, the first one including the workers' start. The before figure is this script
run on the package before those messages (commit c6e05d1's parent)::

    uv run python benchmarks/probes/probe_worker_messages.py
    git archive c6e05d1~1 | tar -x -C /tmp/before && cp benchmarks/probes/probe_worker_messages.py /tmp/before/
    cd /tmp/before && /path/to/.venv/bin/python probe_worker_messages.py --label before
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa


def write_table(path: Path, rows: int) -> str:
    rng = np.random.default_rng(0)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 128, dtype=np.float32)), 128)
    table = pa.table({"id": np.arange(rows), "label": rng.integers(0, 100, rows).astype(np.int32), "vec": vec})
    lance.write_dataset(table, str(path))
    return str(path)


def epochs_rows_per_s(uri: str, workers: int, epochs: int, batch: int) -> list[float]:
    from lance_lightning import LanceDataModule, LanceSource

    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "label", "vec"]), batch_size=batch, num_workers=workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    rates = []
    for _ in range(epochs):
        started, rows = time.perf_counter(), 0
        for got in loader:
            rows += len(got["id"])
        rates.append(rows / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--label", default="this package", help="names the code measured in the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uri = write_table(Path(tmp) / "scan.lance", args.rows)
        print("| code | workers | " + " | ".join(f"epoch {e} rows/s" for e in range(args.epochs)) + " |")
        print("|---|---:|" + "---:|" * args.epochs)
        for workers in (0, 2):
            rates = epochs_rows_per_s(uri, workers, args.epochs, args.batch)
            print(f"| {args.label} | {workers} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
