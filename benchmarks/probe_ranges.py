"""Probe: what one read group of shuffled shards costs Lance, by how the group is read.

Backs the read-group sizing in ``lance_lightning/read.py`` (`group_rows`): for 16,384 rows made
of shards of 1024 or 8192 rows in random order, it times the scan restricted to those rows (what
a group spanning several shards costs), one offset/limit scanner per shard, a ``take``, and one
offset/limit scan of a single 16,384-row range (what a group inside one shard costs). Prints the
median of 30 calls of each; not part of ``run_all.py`` (it measures Lance, not the loader).

Usage (from the repository root, under the machine's benchmark lock)::

    python benchmarks/probe_ranges.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import lance  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
from lance_lightning import LanceSource  # noqa: E402
from lance_lightning.read import read_positions  # noqa: E402
from lance_lightning.source import pin_source  # noqa: E402

COLUMNS = ["id", "label", "vec"]
GROUP_ROWS = 16384


def median_ms(fn: Callable[[], object], calls: int = 30) -> float:
    fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> int:
    common.steady_allocator()
    uri = common.vec_dataset(common.DEFAULT_CACHE, 1_000_000)
    dataset = lance.dataset(uri)
    source = pin_source(LanceSource(uri, columns=COLUMNS), "probe")
    rng = np.random.default_rng(0)
    print(f"command: {common.command_line()}\nmachine: {common.machine()}\n{uri}, columns {COLUMNS}")
    for shard in (1024, 8192):
        starts = np.sort(rng.choice(1_000_000 // shard - 1, GROUP_ROWS // shard, replace=False)) * shard
        positions = np.concatenate([np.arange(s, s + shard) for s in starts])
        print(f"{GROUP_ROWS} rows as {len(starts)} shards of {shard}:")
        print(f"  one scan restricted to the rows (allowlist): {median_ms(lambda: read_positions(source, positions, True)):.2f} ms")
        print(f"  one offset/limit scanner per shard:          "
              f"{median_ms(lambda: [dataset.scanner(columns=COLUMNS, offset=int(s), limit=shard, batch_size=1024).to_table() for s in starts]):.2f} ms")
        print(f"  take:                                        "
              f"{median_ms(lambda: dataset.take(positions, columns=COLUMNS)):.2f} ms")
    single = np.arange(100_000, 100_000 + GROUP_ROWS)
    print(f"{GROUP_ROWS} rows as one range (offset/limit): {median_ms(lambda: read_positions(source, single, True)):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
