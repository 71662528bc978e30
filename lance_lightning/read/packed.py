"""Reading planned batches of token windows (packing, `lance_lightning.plan.packing`).

Guarantees:
- A batch spec's ``positions`` are window indices (the plan's unit). Read groups hold about
  `GROUP_TOKENS` tokens of windows (at least one batch). A read group reads every
  document its windows span once, with the token column only, by dataset positions
  (``ReadPlan.row_positions``): offset/limit scans when they are at most `MAX_RANGE_SCANS` runs of
  consecutive rows, else one call (a restricted scan for scan plans, a take for take plans), as
  the row reader does, with the same retries.
- Each batch comes out as an Arrow table of ``(windows, seq_len)`` fixed-size lists
  (``input_ids``, ``labels``, ``position_ids`` int64, ``document_ids`` int32) that converts to
  tensors without a copy; the converter adds ``cu_seqlens`` and ``max_seqlen``.
- A document whose token list disagrees with the setup count (``lengths_column``) raises
  `DataReadError` naming the row: windows would silently shift otherwise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_lightning.errors import DataReadError
from lance_lightning.plan.packing import pack_windows
from lance_lightning.read.lance_io import read_positions, read_ranges
from lance_lightning.read.reader import (
    MAX_RANGE_SCANS,
    BatchSpec,
    PlanReader,
    contiguous_ranges,
    first_group_rows,
    read_batch_rows,
)

#: A read group of windows holds about this many tokens (at least one batch).
GROUP_TOKENS = 1 << 18


class PackedReader(PlanReader):
    """Reads one rank's batches of windows of one epoch of a packed `ReadPlan`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.plan.documents is None:
            raise ValueError(f"PackedReader reads a packed plan; split {self.plan.split!r} has no documents index")
        self.index = self.plan.documents
        self.tokens = replace(self.plan.source, columns=(self.index.packing.column,), blob_columns=())
        # Groups of about GROUP_TOKENS tokens: packing's arrays then stay in the CPU caches
        # (2048-token windows: 1023-window groups read 2,386 windows/s, 128-window ones 4,327).
        windows = max(self.plan.batch_size, GROUP_TOKENS // self.index.packing.span)
        first = first_group_rows(self.plan) if self.plan.method == "take" else self.group_rows
        self.group_rows = self.first_group_rows = min(first, windows)
        # Arrow batches sized by documents (what is read), not windows (the plan's rows).
        self.batch_rows = read_batch_rows(4 * max(1, self.index.tokens // max(1, self.index.documents)) + 8)

    def positions(self, matched: np.ndarray) -> np.ndarray:
        """A batch spec's positions are window indices: the plan's units, read by `read_units`."""
        return matched

    def read_group(self, group: list[BatchSpec]) -> list[tuple[int, pa.Table]]:
        packed = self.read_units(np.concatenate([spec.positions for spec in group]))
        bounds = np.cumsum([0, *(len(spec.positions) for spec in group)])
        return [
            (spec.step, packed.slice(int(first), int(end - first)))
            for spec, first, end in zip(group, bounds[:-1], bounds[1:])
        ]

    def read_units(self, windows: np.ndarray) -> pa.Table:
        """The packed table of ``windows`` (window indices), one row per window in that order."""
        documents = self.index.documents_of(windows)
        positions = self.plan.row_positions(documents)
        ranges = contiguous_ranges(positions, MAX_RANGE_SCANS)
        if ranges is not None:
            table = read_ranges(self.tokens, ranges, self.retry, self.batch_rows)
        else:
            table = read_positions(
                self.tokens,
                positions,
                scan_mode=self.plan.method == "scan",
                retry=self.retry,
                batch_rows=self.batch_rows,
            )
        values, offsets = self._tokens(table.column(0), documents, positions)
        arrays = pack_windows(self.index, windows, documents, values, offsets)
        seq_len = self.index.packing.seq_len
        columns = {
            name: pa.FixedSizeListArray.from_arrays(pa.array(arrays[name].reshape(-1)), seq_len)
            for name in ("input_ids", "labels", "position_ids", "document_ids")
            if name in arrays
        }
        return pa.table(columns)

    def _tokens(
        self, column: pa.ChunkedArray, documents: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The documents' tokens back to back and their offsets; checked against the index."""
        lists = column.combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
        expected = self.index.starts[documents + 1] - self.index.starts[documents]
        if self.index.packing.eos_id is not None:
            expected = expected - 1
        wrong = np.flatnonzero(lengths != expected)
        if len(wrong):
            row = int(positions[wrong[0]])
            source = self.plan.source
            raise DataReadError(
                f"packing: dataset row {row} of {source.uri} (version {source.version}) holds "
                f"{lengths[wrong[0]]} token(s) in {self.index.packing.column!r}, but setup counted "
                f"{expected[wrong[0]]} (from {self.index.packing.lengths_column!r}); fix the lengths column, or set "
                "lengths_column: null to count the tokens",
                uri=source.uri,
                version=source.version,
                what=f"row {row}",
                attempts=1,
                transient=False,
            )
        return values, offsets
