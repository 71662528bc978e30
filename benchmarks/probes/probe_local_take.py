"""A row shuffle of a local table of the object-store benchmark's rows, by read-group size.

Not part of ``python -m benchmarks all``: it measures what the remote cache's warm epochs cost at scale, the
local-disk cost of a `RowShuffle`. A local dataset of ``--rows`` rows of about 524 bytes (``id``
int64, ``label`` int32, ``payload`` 512 uint8; files of 10^6 rows, written once under ``--cache``)
is read by `LanceDataModule` with `RowShuffle(seed=1)`, batch 256, no workers, for ``--seconds``
per ``take_group_bytes`` value: rows/s of each.

Usage: ``uv run python benchmarks/probes/probe_local_take.py --rows 10000000 --group-mib 1 8 64``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks import common
from lance_lightning import LanceDataModule, LanceSource, RowShuffle  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.int32()), ("payload", pa.list_(pa.uint8(), 512))])


def table(cache: Path, rows: int) -> str:
    uri = cache / f"local_take_{rows}.lance"
    if not uri.exists():
        gen = np.random.default_rng(0)

        def batches() -> object:
            for start in range(0, rows, 1_000_000):
                ids = np.arange(start, min(rows, start + 1_000_000), dtype=np.int64)
                payload = pa.array(gen.integers(0, 255, 512 * len(ids), dtype=np.uint8))
                columns = [pa.array(ids), pa.array((ids % 100).astype(np.int32))]
                yield pa.record_batch([*columns, pa.FixedSizeListArray.from_arrays(payload, 512)], schema=SCHEMA)

        reader = pa.RecordBatchReader.from_batches(SCHEMA, batches())
        lance.write_dataset(reader, str(uri), max_rows_per_file=1_000_000)
    return str(uri)


def rows_per_second(uri: str, group_bytes: int, seconds: float) -> float:
    dm = LanceDataModule(
        train=LanceSource(uri),
        batch_size=256,
        shuffle=RowShuffle(seed=1),
        drop_last=False,
        take_group_bytes=group_bytes,
    )
    dm.setup("fit")
    rows, started = 0, time.perf_counter()
    for batch in dm.train_dataloader():
        rows += len(batch["id"])
        if time.perf_counter() - started > seconds:
            break
    return rows / (time.perf_counter() - started)


def main(args: argparse.Namespace) -> None:
    uri = table(args.cache, args.rows)
    print(f"Command: `{common.command_line()}`")
    print(f"Machine: {common.machine()}")
    print("| take_group_bytes | rows/s |")
    print("|---:|---:|")
    for mib in args.group_mib:
        print(f"| {mib} MiB | {rows_per_second(uri, mib << 20, args.seconds):,.0f} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--group-mib", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lance-lightning-bench"))
    main(parser.parse_args())
