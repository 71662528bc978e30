"""Setup I/O of a plan, and only here: count the rows, evaluate the filter, sample the row size.

Guarantees:
- A filter is evaluated once, at setup, in one streaming scan (`lance_lightning.plan.rowset`).
- A filter that matches nothing, or a dataset without rows, raises `ConfigError` naming the split.
- `build_plan` = `survey` (I/O) + `lance_lightning.plan.planner.plan_reads` (pure).
"""

from __future__ import annotations

import lance

from lance_lightning.errors import ConfigError
from lance_lightning.plan.planner import ReadPlan, Survey, plan_reads
from lance_lightning.plan.rowset import RowSet, scan_matches
from lance_lightning.plan.strategies import FilterRead, ShuffleStrategy
from lance_lightning.source import PinnedSource

#: Rows read at setup to estimate the bytes per row.
ROW_BYTES_SAMPLE = 64


def survey(split: str, source: PinnedSource) -> Survey:
    """Count (and, with a filter, find) the rows of ``source`` and measure their size."""
    dataset = source.open()
    matches: RowSet | None = None
    matched = source.total_rows
    if source.filter is not None:
        matches = scan_matches(dataset, source.filter, source.total_rows)
        matched = matches.rows
        if matched == 0:
            raise ConfigError(
                f"{split}.filter",
                source.filter,
                f"matches no rows of {source.uri} (version {source.version})",
                "loosen the filter or check the column values",
            )
    if matched == 0:
        raise ConfigError(f"{split}.uri", source.uri, "the dataset has no rows", "write rows first")
    return Survey(matched, matches, _row_bytes(dataset, source))


def build_plan(
    split: str,
    source: PinnedSource,
    strategy: ShuffleStrategy | None,
    filter_read: FilterRead | None,
    batch_size: int,
    drop_last: bool,
    world_size: int,
    pad: bool = True,
) -> ReadPlan:
    """Survey and plan the rows of ``source``; raise `ConfigError` for plans that cannot work."""
    return plan_reads(
        split, source, survey(split, source), strategy, filter_read, batch_size, drop_last, world_size, pad
    )


def _row_bytes(dataset: lance.LanceDataset, source: PinnedSource) -> int:
    """Arrow bytes per row of the source's columns, measured on its first rows (at most 64)."""
    sample = dataset.scanner(
        columns=list(source.columns), limit=ROW_BYTES_SAMPLE, blob_handling="all_binary"
    ).to_table()  # blobs' bytes, not their descriptors
    return max(1, -(-sample.nbytes // max(1, sample.num_rows)))
