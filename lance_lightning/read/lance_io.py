"""The Lance calls of a read: ranges of rows, rows at positions (taken, scanned with an allowlist,
or kept from the span they lie in), row ids, with retries.

Guarantees:
- Reads only touch the pinned dataset version, with only the planned columns. Blob columns
  (`lance_lightning.read.blobs`) are read as bytes with ``read_blobs``, one call per column per read.
- Each read is retried through transient storage errors (`lance_lightning.read.retry.RetryPolicy`);
  one that fails for good raises `DataReadError` naming the URI, version, rows and columns.
- Lance's I/O statistics of each read go to the `StageClock` measuring the reading thread
  (`lance_lightning.metrics.clock.record_io`).
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
from lance.dataset import serialize_row_addrs

from lance_lightning.metrics.clock import record_io
from lance_lightning.read.blobs import with_blobs
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy, describe_rows, describe_span
from lance_lightning.source import PinnedSource

#: Rows per Arrow batch of a read that does not know its rows' size (the map-style dataset, a
#: bad-row replacement): small enough for wide binary columns.
UNSIZED_BATCH_ROWS = 1024
#: A take of more sorted rows is made of calls of this many: Lance's memory for a call grows with
#: its rows, its speed barely (10^8 int64 rows in 1 MiB groups: 2,048-row calls 729k rows/s and
#: 62 MB of RSS growth, 8,192-row calls 797k and 83 MB; benchmarks/results/take_groups.md).
TAKE_CALL_ROWS = 2048
#: A span read (`read_span`) reads at most this many consecutive rows per Lance call: 16,384-row
#: offset/limit scans read a 400,000-row table of 524-byte rows in 64 ms of CPU, one scan of it all
#: in 270-310 ms (its 200 MB of fresh buffers).
SPAN_WINDOW_ROWS = 16384


def read_ranges(
    source: PinnedSource,
    ranges: list[tuple[int, int]],
    retry: RetryPolicy = DEFAULT_POLICY,
    batch_rows: int = UNSIZED_BATCH_ROWS,
) -> pa.Table:
    """The rows of ``ranges`` (``(first, rows)`` each) of the pinned version, in that order
    (retried): one offset/limit scan per range."""
    what = describe_span(
        min((first for first, _ in ranges), default=0),
        max((first + rows - 1 for first, rows in ranges), default=-1),
        sum(rows for _, rows in ranges),
        "scan",
        source.columns,
    )
    return retry.call(
        lambda: _read_ranges(source, ranges, batch_rows), what=what, uri=source.uri, version=source.version
    )


def read_positions(
    source: PinnedSource,
    positions: np.ndarray,
    scan_mode: bool,
    retry: RetryPolicy = DEFAULT_POLICY,
    batch_rows: int = UNSIZED_BATCH_ROWS,
) -> pa.Table:
    """Rows at the sorted, unique ``positions`` of the pinned version, in that order (retried).

    With ``scan_mode``, one scan restricted to those rows (it reads many ranges at scan speed);
    otherwise ``take`` calls of at most `TAKE_CALL_ROWS` rows (cheapest for scattered rows).
    """
    what = describe_rows(positions, "scan" if scan_mode else "take", source.columns)
    return retry.call(
        lambda: _read_positions(source, positions, scan_mode, batch_rows),
        what=what,
        uri=source.uri,
        version=source.version,
    )


def read_span(
    source: PinnedSource,
    positions: np.ndarray,
    retry: RetryPolicy = DEFAULT_POLICY,
    batch_rows: int = UNSIZED_BATCH_ROWS,
    window_rows: int = SPAN_WINDOW_ROWS,
) -> pa.Table:
    """Rows at the sorted, unique ``positions`` of the pinned version, in that order (retried): the
    consecutive rows they span, read by offset/limit scans of at most ``window_rows`` rows, each
    keeping only the wanted rows. Cheapest where the wanted rows are dense (a broad filter)."""
    what = describe_rows(positions, "span scan", source.columns)
    return retry.call(
        lambda: _read_span(source, positions, batch_rows, window_rows),
        what=what,
        uri=source.uri,
        version=source.version,
    )


def _read_span(source: PinnedSource, positions: np.ndarray, batch_rows: int, window_rows: int) -> pa.Table:
    dataset = source.open(reads=True)
    columns = [c for c in source.columns if c not in source.blob_columns]
    table = None
    if columns:
        parts = []
        lo = 0
        while lo < len(positions):
            first = int(positions[lo])
            hi = int(np.searchsorted(positions, first + window_rows, side="left"))
            wanted = positions[lo:hi]
            rows = int(wanted[-1]) + 1 - first
            read = dataset.scanner(columns=columns, offset=first, limit=rows, batch_size=batch_rows).to_table()
            if rows != len(wanted):
                keep = np.zeros(rows, dtype=np.bool_)
                keep[wanted - first] = True
                read = read.filter(pa.array(keep))
            parts.append(read)
            lo = hi
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if source.blob_columns:
        table = with_blobs(dataset, table, positions, source.columns, source.blob_columns)
    record_io(dataset)
    return table


def _read_ranges(source: PinnedSource, ranges: list[tuple[int, int]], batch_rows: int) -> pa.Table:
    dataset = source.open(reads=True)
    columns = [c for c in source.columns if c not in source.blob_columns]
    tables = (
        [
            dataset.scanner(columns=columns, offset=first, limit=rows, batch_size=batch_rows).to_table()
            for first, rows in ranges
        ]
        if columns
        else []
    )
    table = (tables[0] if len(tables) == 1 else pa.concat_tables(tables)) if tables else None
    if source.blob_columns:
        positions = np.concatenate([np.arange(first, first + rows, dtype=np.int64) for first, rows in ranges])
        table = with_blobs(dataset, table, positions, source.columns, source.blob_columns)
    record_io(dataset)
    return table


def _read_positions(source: PinnedSource, positions: np.ndarray, scan_mode: bool, batch_rows: int) -> pa.Table:
    dataset = source.open(reads=True)
    columns = [c for c in source.columns if c not in source.blob_columns]
    table = None
    if columns and scan_mode:
        allow = serialize_row_addrs(row_ids(source, dataset, positions).tolist())
        table = dataset.scanner(
            columns=columns, row_addr_allowlist=allow, batch_size=batch_rows, scan_in_order=True
        ).to_table()
    elif columns:
        parts = [
            dataset.take(positions[first : first + TAKE_CALL_ROWS], columns=columns)
            for first in range(0, len(positions), TAKE_CALL_ROWS)
        ]
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if source.blob_columns:  # the bytes of blob columns: one planned read_blobs call per column
        table = with_blobs(dataset, table, positions, source.columns, source.blob_columns)
    record_io(dataset)
    return table


def row_ids(source: PinnedSource, dataset: lance.LanceDataset, positions: np.ndarray) -> np.ndarray:
    """Lance row ids of the live-row ``positions``: computed from fragment sizes when the version
    has no deletions and no stable row ids (id = fragment id << 32 | offset), else looked up."""
    # data_tag: a dataset written again at the same path restarts its version numbers
    key = (source.uri, source.version, source.data_tag, tuple(sorted((source.storage_options or {}).items())))
    if key in _FRAGMENT_STARTS:
        fragments = _FRAGMENT_STARTS[key]
    else:
        fragments = _fragment_starts(dataset)
        _FRAGMENT_STARTS[key] = fragments
    if fragments is None:
        return dataset.take(positions, columns=["_rowid"]).column(0).to_numpy()
    starts, fragment_ids = fragments
    slot = np.searchsorted(starts, positions, side="right") - 1
    return (fragment_ids[slot] << np.uint64(32)) | (positions - starts[slot]).astype(np.uint64)


def _fragment_starts(dataset: lance.LanceDataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Each fragment's first position and its id; None when row ids cannot be computed (look
    them up with a take)."""
    fragments = dataset.get_fragments()
    if dataset.has_stable_row_ids or any(f.metadata.deletion_file is not None for f in fragments):
        return None
    sizes = np.array([f.metadata.physical_rows for f in fragments], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return starts, np.array([f.fragment_id for f in fragments], dtype=np.uint64)


#: `_fragment_starts` by source (None: row ids cannot be computed, look them up with a take).
_FRAGMENT_STARTS: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}
