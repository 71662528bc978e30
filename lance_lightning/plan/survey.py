"""Setup I/O of a plan, and only here: count the rows, evaluate the filter, sample the row size.

Guarantees:
- A filter is evaluated once, at setup, in one streaming scan (`lance_lightning.plan.filter_scan`;
  pinning only planned it: an error that only evaluation meets, such as a failing cast, is a
  `ConfigError` naming ``<split>.filter`` here), by one process per node: its matches and row
  size are kept in the survey cache (`lance_lightning.plan.survey_cache`), where the node's other
  processes (DDP ranks, later runs) load them instead of scanning
  (``LANCE_LIGHTNING_SURVEY_CACHE=off``: every process scans).
- A filter that matches nothing, or a dataset without rows, raises `ConfigError` naming the split
  (unless ``allow_empty``: a map dataset may have no rows).
- With packing, `survey_tokens` counts each matching document's tokens: from the integer
  ``lengths_column`` when given (reads only that column), else from the token lists (one scan of
  the token column: slower). It keeps 8 bytes per document (`DocumentIndex`), built in place: no more at its peak.
  A missing column, or one of the wrong type, raises `ConfigError` naming it.
- The row size comes from the schema where every column has a fixed width, else from a 64-row sample.
- With clips, `survey_clips` checks the media column (a blob or binary column the split reads) and
  counts ``per_item`` clips per matching row; no media is read at setup (the 64-row sample is
  skipped: a clip's size comes from the sampler).
- A plan is `survey` (+ `survey_tokens`) (I/O) + `lance_lightning.plan.planner.plan_reads` (pure),
  composed by the planning entry, `lance_lightning.plan.split.plan_split`.
"""

from __future__ import annotations

import re
from dataclasses import replace

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_lightning.errors import ConfigError
from lance_lightning.media.decoders import check_pyav
from lance_lightning.media.samplers import AudioClips, ClipSampler, VideoClips
from lance_lightning.open_errors import filter_error
from lance_lightning.plan.clips import ClipUnits
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.plan.packing import DocumentIndex, TokenPacking
from lance_lightning.plan.planner import Survey
from lance_lightning.plan.rowset import RowSet
from lance_lightning.plan.survey_cache import cached_survey
from lance_lightning.source import PinnedSource

#: Rows read at setup to estimate the bytes per row.
ROW_BYTES_SAMPLE = 64


def survey(split: str, source: PinnedSource, *, allow_empty: bool = False, sample_rows: bool = True) -> Survey:
    """Count (and, with a filter, find) the rows of ``source`` and measure their size (without
    ``sample_rows``: 1 byte, for the caller to set); a source without matching rows is a
    `ConfigError` unless ``allow_empty``."""
    dataset = source.open()
    matches: RowSet | None = None
    matched = source.total_rows
    row_bytes: int | None = None
    if source.filter is not None:
        cached = cached_survey(
            source, lambda: (_matches(split, source, dataset), _row_bytes(dataset, source) if sample_rows else None)
        )
        matches, row_bytes = cached.matches, cached.row_bytes
        matched = matches.rows
        if matched == 0 and not allow_empty:
            raise ConfigError(
                f"{split}.filter",
                source.filter,
                f"matches no rows of {source.uri} (version {source.version})",
                "loosen the filter or check the column values",
            )
    if matched == 0 and not allow_empty:
        raise ConfigError(f"{split}.uri", source.uri, "the dataset has no rows", "write rows first")
    if row_bytes is None or not sample_rows:
        row_bytes = _row_bytes(dataset, source) if sample_rows else 1
    counted_by = index_answer(dataset, source.filter) if source.filter is not None else None
    return Survey(matched, matches, row_bytes, counted_by=counted_by)


def index_answer(dataset: lance.LanceDataset, filter_: str) -> str | None:
    """Which scalar indexes Lance's scanner answers ``filter_`` with (its ``explain_plan``, which
    reads no data): "the BITMAP index on label and the BTREE index on split", or None (a scan)."""
    try:
        plan = dataset.scanner(filter=filter_, columns=[], with_row_id=True).explain_plan()
        fields = {index["name"]: index["fields"] for index in dataset.list_indices()}
    except (ValueError, OSError):  # explain only; the count itself raised nothing
        return None
    used = dict.fromkeys(re.findall(r"\]@(\w+)\((\w+)\)", plan))
    named = [f"the {kind.upper()} index on {', '.join(fields.get(name, [name]))}" for name, kind in used]
    return " and ".join(named) or None


def _matches(split: str, source: PinnedSource, dataset: lance.LanceDataset) -> RowSet:
    """The filter's matches; an error only evaluating the filter meets is a `ConfigError` naming it."""
    try:
        return find_matches(source)
    except ConfigError:
        raise
    except ValueError as error:  # e.g. Arrow's, for a cast that fails on a value
        raise filter_error(f"{split}.filter", source.filter or "", error, dataset.schema.names) from None


def survey_clips(split: str, source: PinnedSource, surveyed: Survey, sampler: ClipSampler) -> Survey:
    """``surveyed`` counting ``sampler.per_item`` clips per matching row (no media read)."""
    check_pyav()  # the decoder: a missing one is named here, in the main process, before any read
    media_type = _column_type(source.open(), sampler.column, "clips.column", split)
    if sampler.column not in source.columns:
        raise ConfigError(
            "clips.column",
            sampler.column,
            f"split '{split}' does not read it (its columns: {list(source.columns)})",
            f"add {sampler.column!r} to the split's LanceSource columns",
        )
    binary = pa.types.is_binary(media_type) or pa.types.is_large_binary(media_type)
    if sampler.column not in source.blob_columns and not binary:
        raise ConfigError(
            "clips.column",
            sampler.column,
            f"column of split '{split}' holds {media_type}, not encoded media (binary or a Lance blob)",
            "name the column holding the encoded files (prepare --format videofolder writes 'video')",
        )
    units = ClipUnits(sampler, surveyed.matched_rows)
    if isinstance(sampler, AudioClips):
        clip_bytes = 4 * sampler.channels * sampler.samples
    elif isinstance(sampler, VideoClips):
        height, width = sampler.size or (224, 224)
        clip_bytes = 3 * height * width * sampler.frames
    else:
        raise TypeError(f"clips: {type(sampler).__name__} is neither VideoClips nor AudioClips")
    return replace(surveyed, matched_rows=units.clips, row_bytes=clip_bytes, clips=units)


def survey_tokens(split: str, source: PinnedSource, surveyed: Survey, packing: TokenPacking) -> Survey:
    """``surveyed`` with the documents' `DocumentIndex`: its sequence counts windows."""
    dataset = source.open()
    token_type = _column_type(dataset, packing.column, "packing.column", split)
    if not (pa.types.is_list(token_type) or pa.types.is_large_list(token_type)) or not pa.types.is_integer(
        token_type.value_type
    ):
        raise ConfigError(
            "packing.column",
            packing.column,
            f"column of {source.uri} has type {token_type}, not a list of integers (token ids)",
            "name a list<int32> / list<int64> column of token ids",
        )
    counted = packing.lengths_column or packing.column
    if packing.lengths_column is not None:
        length_type = _column_type(dataset, counted, "packing.lengths_column", split)
        if not pa.types.is_integer(length_type):
            raise ConfigError(
                "packing.lengths_column",
                counted,
                f"column of {source.uri} has type {length_type}, not an integer type",
                "name the integer column of token counts, or set lengths_column: null to count the tokens",
            )
    counts = np.empty(surveyed.matched_rows + 1, dtype=np.int64)  # becomes the index, in place
    filled = 1
    for batch in dataset.scanner(columns=[counted], filter=source.filter, batch_size=1 << 16).to_batches():
        values = batch.column(0)
        if packing.lengths_column is None:
            values = pc.fill_null(pc.list_value_length(values), 0)
        elif values.null_count:
            raise ConfigError(
                "packing.lengths_column", counted, "column has nulls", "fill the token counts, or set it to null"
            )
        counts[filled : filled + len(values)] = values.to_numpy()
        filled += len(values)
    index = DocumentIndex.from_buffer(packing, counts)
    if index.windows == 0:
        raise ConfigError(
            "packing.seq_len",
            packing.seq_len,
            f"split '{split}' has {index.tokens:,} token(s), less than one window of seq_len tokens",
            f"use seq_len <= {max(1, index.tokens - (packing.span - packing.seq_len))}, or more data",
        )
    itemsize = max(4, token_type.value_type.bit_width // 8)
    return replace(surveyed, matched_rows=index.windows, row_bytes=packing.span * itemsize, documents=index)


def _column_type(dataset: lance.LanceDataset, column: str, param: str, split: str) -> pa.DataType:
    names = dataset.schema.names
    if column not in names:
        raise ConfigError(param, column, f"no such column in split '{split}'", f"use one of {names}")
    return dataset.schema.field(column).type


def _row_bytes(dataset: lance.LanceDataset, source: PinnedSource) -> int:
    """Arrow bytes per row of the source's columns: from the schema when every column has a fixed
    width (no I/O: a 64-row sample read cost 0.5-4 ms of setup), else measured on its first rows
    (at most 64)."""
    bits = [_fixed_bits(dataset.schema.field(name).type) for name in source.columns]
    fixed = [b for b in bits if b is not None]
    if len(fixed) == len(bits):
        return max(1, -(-sum(fixed) // 8))
    sample = dataset.scanner(
        columns=list(source.columns), limit=ROW_BYTES_SAMPLE, blob_handling="all_binary"
    ).to_table()  # blobs' bytes, not their descriptors
    return max(1, -(-sample.nbytes // max(1, sample.num_rows)))


def _fixed_bits(typ: pa.DataType) -> int | None:
    """Bits per value of a fixed-width Arrow type (fixed-size lists and tensors of them included);
    ``None`` for variable-width types (strings, binary, lists), whose size a sample measures."""
    if isinstance(typ, pa.ExtensionType):
        typ = typ.storage_type
    if pa.types.is_fixed_size_list(typ):
        inner = _fixed_bits(typ.value_type)
        return None if inner is None else inner * typ.list_size
    try:
        return typ.bit_width
    except ValueError:  # not fixed-width
        return None
