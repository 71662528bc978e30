"""Blob columns: large binary values (encoded images) that Lance stores out of line.

Guarantees:
- A pinned source names its blob columns (`lance_lightning.source.blob_columns`); a scan returns
  descriptors for them, not bytes.
- `with_blobs` completes a read of the other columns with the blob columns' bytes, read by
  ``read_blobs`` (Lance's planned, coalesced blob reader): one call per blob column per read,
  positions in the read's row order. The result is a ``large_binary`` column, so the batch
  converts to the same uint8 `Ragged` as an inline binary column and feeds the same decode path.
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa


def with_blobs(
    dataset: lance.LanceDataset,
    table: pa.Table | None,
    positions: np.ndarray,
    columns: tuple[str, ...],
    blobs: tuple[str, ...],
) -> pa.Table:
    """``table`` (the non-blob ``columns`` at ``positions``, or None when there are none) with the
    ``blobs`` columns' bytes at ``positions`` added, its columns in ``columns`` order."""
    indices = pa.array(positions, pa.uint64())
    read = {name: _read_blob_column(dataset, name, indices) for name in blobs}
    arrays = [read[name] if name in read else table.column(name) for name in columns]
    return pa.table(arrays, names=list(columns))


def _read_blob_column(dataset: lance.LanceDataset, name: str, indices: pa.Array) -> pa.Array:
    rows = dataset.read_blobs(name, indices=indices, preserve_order=True)
    if len(rows) != len(indices):
        raise OSError(f"read_blobs of column {name!r} returned {len(rows)} rows for {len(indices)} positions")
    return pa.array([value for _, value in rows], pa.large_binary())
