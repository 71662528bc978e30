"""Blob columns: large binary values (encoded images) that Lance stores out of line.

Guarantees:
- A pinned source names its blob columns (`lance_lightning.source.blob_columns`); a scan returns
  descriptors for them, not bytes.
- `with_blobs` completes a read of the other columns with the blob columns' bytes, read by
  ``read_blobs`` (Lance's planned, coalesced blob reader): one call per blob column per read,
  positions in the read's row order. The result is a ``large_binary`` column, so the batch
  converts to the same uint8 `Ragged` as an inline binary column and feeds the same decode path.
- A transform that names blob columns in its ``blob_files`` attribute gets them as file objects
  instead: `reading_without` drops them from the read (their bytes are never fetched), and
  `open_blob_files` hands each row's blob on as a seekable ``lance.BlobFile`` (``read``, ``seek``,
  ``read_range(offset, length)``), opened with ``take_blobs`` in the batch's row order, so media
  can be streamed. A ``BlobFile`` does not pickle: in DataLoader worker processes the transform
  must consume the files (decode them) before the batch leaves the worker.
"""

from __future__ import annotations

import dataclasses

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy, describe_rows
from lance_lightning.source import PinnedSource


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
    arrays = []
    for name in columns:
        if name in read:
            arrays.append(read[name])
        elif table is None:
            raise ValueError(f"with_blobs: column {name!r} is not a blob column and no table of the others was read")
        else:
            arrays.append(table.column(name))
    return pa.table(arrays, names=list(columns))


def _read_blob_column(dataset: lance.LanceDataset, name: str, indices: pa.Array) -> pa.Array:
    rows = dataset.read_blobs(name, indices=indices, preserve_order=True)
    if len(rows) != len(indices):
        raise OSError(f"read_blobs of column {name!r} returned {len(rows)} rows for {len(indices)} positions")
    return pa.array([value for _, value in rows], pa.large_binary())


def reading_without(source: PinnedSource, files: tuple[str, ...]) -> PinnedSource:
    """``source`` reading every column but the blob columns ``files`` (handed on as file objects)."""
    return dataclasses.replace(
        source,
        columns=tuple(name for name in source.columns if name not in files),
        blob_columns=tuple(name for name in source.blob_columns if name not in files),
    )


def open_blob_files(
    source: PinnedSource,
    name: str,
    positions: np.ndarray,
    retry: RetryPolicy = DEFAULT_POLICY,
    buffer_bytes: int | None = None,
) -> list[lance.BlobFile | None]:
    """A seekable ``BlobFile`` for the blob of column ``name`` at each of ``positions`` of the pinned
    version, in order (``None`` where the row's blob is null; opening them is retried through
    transient storage errors); each reads ahead
    ``buffer_bytes`` per storage read (``None``: Lance's default, 512 KiB)."""
    indices = pa.array(np.asarray(positions), pa.uint64())

    def take() -> list[lance.BlobFile | None]:
        sized = {} if buffer_bytes is None else {"buffer_size": buffer_bytes}
        files = source.open(reads=True).take_blobs(name, indices=indices, **sized)
        if len(files) != len(indices):
            raise OSError(f"take_blobs of column {name!r} returned {len(files)} files for {len(indices)} positions")
        return files

    what = describe_rows(np.asarray(positions), "blob files", [name])
    return retry.call(take, what=what, uri=source.uri, version=source.version)
