"""Probe: what one read group of shuffled shards costs Lance, by how the group is read.

Backs the read-group sizing in ``lance_lightning/read/reader.py`` (`group_rows`): for 16,384 rows made
of shards of 1024 or 8192 rows in random order, it times the scan restricted to those rows (what
a group spanning several shards costs), one offset/limit scanner per shard, a ``take``, and one
offset/limit scan of a single 16,384-row range (what a group inside one shard costs); then one
range of 8,192 and of 16,384 rows in 1024-row Arrow batches and in the batches `read_batch_rows`
picks (two calls of 8,192 rows minus one of 16,384 is what a call costs on top of its rows).
Prints the median of 30 calls of each; not part of ``python -m benchmarks all`` (it measures Lance, not the
loader).

Usage (from the repository root, under the machine's benchmark lock)::

    python benchmarks/probes/probe_ranges.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import lance  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common
from lance_lightning import LanceSource  # noqa: E402
from lance_lightning.read.lance_io import read_positions, read_ranges  # noqa: E402
from lance_lightning.read.reader import read_batch_rows  # noqa: E402
from lance_lightning.source import pin_source  # noqa: E402

COLUMNS = ["id", "label", "vec"]
GROUP_ROWS = 16384


def main() -> int:
    common.steady_allocator()
    uri = common.vec_dataset(common.DEFAULT_CACHE, 1_000_000)
    dataset = lance.dataset(uri)
    source = pin_source(LanceSource(uri, columns=COLUMNS), "probe")
    rng = np.random.default_rng(0)
    sample = dataset.scanner(columns=COLUMNS, limit=64).to_table()
    batch_rows = read_batch_rows(sample.nbytes // sample.num_rows)
    print(
        f"command: {common.command_line()}\nmachine: {common.machine()}\n{uri}, columns {COLUMNS}, "
        f"{batch_rows}-row Arrow batches"
    )
    for shard in (1024, 8192):
        starts = np.sort(rng.choice(1_000_000 // shard - 1, GROUP_ROWS // shard, replace=False)) * shard
        positions = np.concatenate([np.arange(s, s + shard) for s in starts])
        print(f"{GROUP_ROWS} rows as {len(starts)} shards of {shard}:")
        allowlist = common.median_ms(lambda: read_positions(source, positions, True, batch_rows=batch_rows))
        per_shard = common.median_ms(
            lambda: [
                dataset.scanner(columns=COLUMNS, offset=int(s), limit=shard, batch_size=batch_rows).to_table()
                for s in starts
            ]
        )
        take = common.median_ms(lambda: dataset.take(positions, columns=COLUMNS))
        print(f"  one scan restricted to the rows (allowlist): {allowlist:.2f} ms")
        print(f"  one offset/limit scanner per shard:          {per_shard:.2f} ms")
        print(f"  take:                                        {take:.2f} ms")
    one_range = common.median_ms(lambda: read_ranges(source, [(100_000, GROUP_ROWS)], batch_rows=batch_rows))
    print(f"{GROUP_ROWS} rows as one range (offset/limit): {one_range:.2f} ms")
    print(
        "one range by its rows and Arrow batch rows (what a Lance call costs on top of its rows), "
        "the four calls interleaved:"
    )
    calls = {
        (rows, size): (lambda rows=rows, size=size: read_ranges(source, [(300_000, rows)], batch_rows=size))
        for rows in (GROUP_ROWS // 2, GROUP_ROWS)
        for size in (1024, batch_rows)
    }
    for (rows, size), ms in common.interleaved_median_ms(calls).items():
        print(f"  {rows} rows in {size}-row batches: {ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
