"""Probe: RowShuffle's rows/s and memory by take-group size and rows per Lance ``take`` call.

Backs the default ``take_group_bytes`` (`TAKE_GROUP_BYTES`, ``lance_lightning/read/reader.py``) and `TAKE_CALL_ROWS`
(``lance_lightning/read/lance_io.py``). Lance decodes about one chunk per row it takes when the
rows are sparse in the file, so the reader sorts a large group of the epoch's rows before taking
them (neighbours then share chunks), and takes them in calls of bounded rows (Lance's memory for
a call grows with its rows). For each (group bytes, call rows) pair and each size of the scale
benchmark's int64 datasets (``common.scale_dataset`` writes them, as the harness's scale suite does), a fresh process reads
``--batches`` RowShuffle batches of 256 rows after the first and prints rows/s and its RSS growth
over the iteration (NoShuffle grows 4-5 MB). Not part of ``python -m benchmarks all``.

    uv run python benchmarks/probes/probe_take.py --rows 1e6,1e8 --groups 32K,1M,2M --calls 2048,8192
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common
from benchmarks.common import rss_mb, run_child

BATCH = 256


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def one(uri: str, group_bytes: int, call_rows: int, batches: int) -> dict:
    """One measurement, in this (fresh) process."""
    import lance_lightning as ll
    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.read import lance_io

    lance_io.TAKE_CALL_ROWS = call_rows

    dm = LanceDataModule(
        train=LanceSource(uri, columns=["x"]),
        shuffle=ll.RowShuffle(seed=0),
        batch_size=BATCH,
        take_group_bytes=group_bytes,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    base = rss_mb()
    epoch = iter(loader)
    next(epoch)
    batches = min(batches, len(loader) - 1)
    started = time.perf_counter()
    for _ in range(batches):
        next(epoch)
    return {"rows_per_s": batches * BATCH / (time.perf_counter() - started), "rss_growth_mb": rss_mb() - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1e6,1e8")
    parser.add_argument("--groups", default="32K,1M,2M,4M", help="take-group bytes")
    parser.add_argument("--calls", default="2048,8192", help="rows per take call")
    parser.add_argument("--batches", type=int, default=12000)
    parser.add_argument("--cache", default=str(common.SCALE_CACHE))
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        uri, group, call, batches = args.one
        print(json.dumps(one(uri, int(group), int(call), int(batches))))
        return
    print("| rows | take group | rows per call | rows/s | RSS growth MB |\n|---:|---:|---:|---:|---:|")
    for rows in (int(float(r)) for r in args.rows.split(",")):
        uri = common.scale_dataset(Path(args.cache), rows)  # the scale suite's table, written here when missing
        for group in args.groups.split(","):
            for call in args.calls.split(","):
                r = run_child([__file__, "--one", uri, str(size(group)), call, str(args.batches)])
                print(
                    f"| 10^{len(str(rows)) - 1} | {group} | {call} | {r['rows_per_s']:,.0f} | {r['rss_growth_mb']:.0f} |"
                )


if __name__ == "__main__":
    main()
