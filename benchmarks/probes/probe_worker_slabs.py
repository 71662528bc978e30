"""Probe: decoded-image batches through 2 worker processes, and the workers' CPU split between
user and kernel time.

Backs docs/performance.md ("Larger batches"): a batch over 1 MiB leaves a worker through a reused
shared-memory slab (`lance_lightning.produce.slabs`) instead of a fresh shared-memory segment per
tensor. The table is ``--images`` 64x64 RGB JPEGs (quality 90, about 2.5 KB each) with ``id`` and
``label``, written once; the loader reads ``RowShuffle`` batches of 256 through ``DecodeImage``
(3 MiB decoded) with ``--workers`` workers for ``--epochs`` epochs. Per epoch: rows/s; over the
epochs after the first: the workers' user and system CPU seconds (``/proc/<pid>/stat``). The
before figure is this script run on the package before the slabs (commit 900018c's parent)::

    uv run python benchmarks/probes/probe_worker_slabs.py
    git archive 900018c~1 | tar -x -C /tmp/before && cp benchmarks/probes/probe_worker_slabs.py /tmp/before/
    cd /tmp/before && /path/to/.venv/bin/python probe_worker_slabs.py --label before
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa


def write_images(path: Path, count: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for i in range(count):
        pixels = (rng.integers(0, 64, (64, 64, 3)) + (i % 8) * 24).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        blobs.append(out.getvalue())
    table = pa.table({"id": np.arange(count), "label": np.arange(count) % 10, "image": pa.array(blobs, pa.binary())})
    lance.write_dataset(table, str(path))
    return str(path)


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds of ``pids`` together."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]) / tick, system + int(fields[12]) / tick
    return user, system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())
    from lance_lightning import LanceDataModule, LanceSource, RowShuffle
    from lance_lightning.transforms import DecodeImage

    uri = write_images(Path(tempfile.mkdtemp(prefix="probe_slabs_")) / "images.lance", args.images)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "image", "label"]),
        batch_size=256,
        shuffle=RowShuffle(seed=0),
        num_workers=args.workers,
        transform=DecodeImage(column="image"),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    rates, before = [], None
    for epoch in range(args.epochs):
        started, rows = time.perf_counter(), 0
        for batch in loader:
            rows += len(batch["id"])
        rates.append(rows / (time.perf_counter() - started))
        if epoch == 0:
            pids = [worker.pid for worker in loader._iterator._workers]  # persistent workers
            before = cpu_seconds(pids)
    user, system = (a - b for a, b in zip(cpu_seconds(pids), before))
    print(f"{args.label}: rows/s per epoch {', '.join(f'{r:,.0f}' for r in rates)}")
    print(
        f"{args.label}: workers' CPU over epochs 2-{args.epochs}: user {user:.2f} s, system {system:.2f} s "
        f"({100 * system / max(user + system, 1e-9):.0f}% in the kernel)"
    )


if __name__ == "__main__":
    main()
