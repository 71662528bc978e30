"""Probe: what evaluating a filter leaves in the training process, scanned in process or in a child.

Backs `CHILD_SCAN_ROWS` (``lance_lightning/plan/filter_scan.py``) and the row-set sizes of
``lance_lightning/plan/rowset.py``. For each size of the scale benchmark's int64 datasets
(``common.scale_dataset`` writes them, as the harness's scale suite does) and the 10% filter ``x % 10 = 0``, a fresh process
pins the source, runs one tiny scan (so Lance's runtime exists in both cases), then calls
`find_matches` in process or in a child, and prints the seconds, the structure kept and its size,
and the RSS growth and peak growth over the call. Not part of ``python -m benchmarks all``.

    uv run python benchmarks/probes/probe_filter_scan.py --rows 1e8,1e9
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common
from benchmarks.common import peak_rss_mb, rss_mb, run_child

FILTER = "x % 10 = 0"


def one(uri: str, child: bool) -> dict:
    """One measurement, in this (fresh) process."""
    from lance_lightning import LanceSource, pin_source
    from lance_lightning.plan.filter_scan import find_matches

    source = pin_source(LanceSource(uri, columns=["x"], filter=FILTER), "train")
    source.open().scanner(columns=["x"], limit=10).to_table()
    base, peak_before = rss_mb(), peak_rss_mb()
    started = time.perf_counter()
    found = find_matches(source, child_from_rows=0 if child else 1 << 62)
    return {
        "seconds": time.perf_counter() - started,
        "kept": type(found).__name__,
        "kept_mib": found.nbytes / 2**20,
        "rss_growth_mb": rss_mb() - base,
        "peak_growth_mb": peak_rss_mb() - peak_before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1e8")
    parser.add_argument("--cache", default=str(common.SCALE_CACHE))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1] == "child")))
        return
    print("| rows | scanned | seconds | kept | kept MiB | RSS growth MB | peak growth MB |")
    print("|---:|---|---:|---|---:|---:|---:|")
    for rows in (int(float(r)) for r in args.rows.split(",")):
        uri = common.scale_dataset(Path(args.cache), rows)  # the scale suite's table, written here when missing
        for where in ("process", "child"):
            r = run_child([__file__, "--one", uri, where])
            print(
                f"| 10^{len(str(rows)) - 1} | in {where} | {r['seconds']:.2f} | {r['kept']} | {r['kept_mib']:.0f} "
                f"| {r['rss_growth_mb']:.0f} | {r['peak_growth_mb']:.0f} |"
            )


if __name__ == "__main__":
    main()
