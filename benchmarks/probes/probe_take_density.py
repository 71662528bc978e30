"""Probe: Lance's ``take`` rows/s by the share of a file's rows it takes (the density).

The physics behind RowShuffle's rows/s at scale (``benchmarks/results/scale.md``): a read group of
G sorted rows out of N takes rows at density G/N, so with G bounded by memory the density, and
with it the take's rows/s, falls as the table grows. For each Lance file format version, a
dataset of one ``int64`` column ``x = row`` and ``--rows`` rows (one fragment, written once to
``--cache``) is taken at densities 2^-11 .. 2^-1: random sorted rows, in calls of the reader's
`TAKE_CALL_ROWS`, repeated until ``--seconds`` pass. Printed per density: rows/s, the bytes
Lance read and the I/O requests it made per row taken, and the group (rows, and MiB of the
positions and values the reader holds, 16 bytes a row) that density means at 10^8 and 10^9 rows.
Not part of ``python -m benchmarks all``.

    uv run python benchmarks/probes/probe_take_density.py --versions 2.0,2.1,2.2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common
from benchmarks.common import RESULTS_DIR, command_line, machine
from lance_lightning.read.lance_io import TAKE_CALL_ROWS  # noqa: E402

DENSITIES = [2.0**-e for e in range(11, 0, -1)]
HELD_BYTES_PER_ROW = 16  # an int64 position and an int64 value per row of a group


def dataset(cache: Path, rows: int, version: str) -> lance.LanceDataset:
    path = cache / f"density_{version}_{rows}.lance"
    if not path.exists():
        table = pa.table({"x": np.arange(rows, dtype=np.int64)})
        lance.write_dataset(table, str(path), max_rows_per_file=rows, data_storage_version=version)
    return lance.dataset(str(path))


def measure(ds: lance.LanceDataset, rows: int, density: float, seconds: float) -> dict:
    """Rows/s, bytes and requests per row of takes of ``density * rows`` sorted random rows."""
    rng = np.random.default_rng(0)
    count = max(1, round(density * rows))
    taken, spent, stats_bytes, stats_iops = 0, 0.0, 0, 0
    while spent < seconds:
        positions = np.sort(rng.choice(rows, count, replace=False))
        ds.io_stats_incremental()
        started = time.perf_counter()
        for first in range(0, count, TAKE_CALL_ROWS):
            ds.take(positions[first : first + TAKE_CALL_ROWS], columns=["x"])
        spent += time.perf_counter() - started
        stats = ds.io_stats_incremental()
        taken, stats_bytes, stats_iops = taken + count, stats_bytes + stats.read_bytes, stats_iops + stats.read_iops
    return {"rows_per_s": taken / spent, "bytes_per_row": stats_bytes / taken, "iops_per_row": stats_iops / taken}


def group_at(density: float, rows: int) -> str:
    group = density * rows
    return f"{group:,.0f} ({group * HELD_BYTES_PER_ROW / 2**20:,.0f} MiB)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="2.2")
    parser.add_argument("--rows", type=lambda text: int(float(text)), default=1 << 22)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--cache", default=str(common.SCALE_CACHE))
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Take density: Lance's take rows/s by the share of a file's rows it takes",
        "",
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
        f"Machine: {machine()}. One fragment of {args.rows:,} rows of one int64 column `x = row`; "
        f"random sorted rows taken in calls of {TAKE_CALL_ROWS:,}, repeated for {args.seconds:g} s per density. "
        "A RowShuffle read group of G rows out of N takes at density G/N; the last two "
        f"columns are the group that density means at 10^8 and 10^9 rows ({HELD_BYTES_PER_ROW} bytes "
        "held per row: position and value).",
        "",
        "| format | density | rows/s | bytes read per row | requests per 1,000 rows | group at 10^8 rows | "
        "group at 10^9 rows |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for version in args.versions.split(","):
        ds = dataset(cache, args.rows, version)
        ds.take(np.arange(4), columns=["x"])  # open the file once before timing
        for density in DENSITIES:
            r = measure(ds, args.rows, density, args.seconds)
            lines.append(
                f"| {version} | 2^{int(np.log2(density))} | {r['rows_per_s']:,.0f} | {r['bytes_per_row']:,.0f} | "
                f"{1000 * r['iops_per_row']:,.1f} | {group_at(density, 10**8)} | {group_at(density, 10**9)} |"
            )
            print(lines[-1], flush=True)
    out = RESULTS_DIR / "take_density.md"
    common.write_result(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
