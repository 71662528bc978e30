"""Reading planned batches of media clips (`lance_lightning.plan.clips`).

Guarantees:
- A batch spec's ``positions`` are clip units (the plan's unit). Unit ``u`` is clip ``u % K`` of
  matching row ``u // K``, starting at ``start_fractions(sampler, epoch, u)``: the same clip on
  every rank, worker, batch size and resume.
- A read group is one batch (reader threads decode batches in parallel). Its time is split in the
  reading thread's clock: the media files' reads stay in ``read`` (storage), the rest of decoding
  goes to ``decode``, so the monitor names the right bottleneck.
- Clips of the train split start where the train epoch puts them; the other splits' clips start
  where epoch 0 puts them, every pass (validation compares like with like, before and after a
  resume).
- Each media row of a group is opened once: kept open from an earlier clip (the process's
  `ClipDecoder` pool), else opened as a seekable ``lance.BlobFile`` (``take_blobs``: only the
  byte ranges the decoder asks for are read, `BLOB_READ_AHEAD` at a time; one of at most
  `READ_WHOLE_BYTES` is read whole, in one request) or, for a column that is not blob-encoded,
  from its bytes. Its clips are decoded in start order (forward seeks).
- Media that does not decode (a null value too, in a blob column as in a plain one), or is shorter
  than a clip, is a bad row of the split's policy:
  `RaiseOnBadRow` raises `BadRowError` naming the dataset row, the clip and the column;
  `ReplaceBadRow` decodes, in its place, the clip at another unit chosen by ``(seed, unit,
  attempt)``, so batch sizes never change and every rank keeps its batch count. Each bad clip is
  counted once as ``bad_rows`` in the reading thread's clock.
- Where ``prepare`` probed the media (`lance_lightning.media.probe`: ``video_frames``,
  ``audio_samples``), a file whose frame index (or audio length) disagrees with the probed
  value when it is opened is a bad row with that reason, never a clip cut from the other length.
  Planning opens no media file: clip starts are fractions, turned into frames by the decoder.
- Videos of different sizes in one batch with ``size: null`` raise `ConfigError` naming
  ``VideoClips.size``, both sizes and their rows, and the fix (set ``size``).
- Each batch is an Arrow table: the split's other columns of each clip's row, the media column as
  a ``fixed_shape_tensor`` (video ``uint8 [T, 3, H, W]``, audio ``float32 [channels, samples]``),
  ``<column>_timestamps`` (video frame times) or ``<column>_start`` (audio start, seconds), and
  ``_clip_row`` (the clip's dataset position at the pinned version).
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

from lance_lightning.errors import BadMedia, BadRowError, ConfigError
from lance_lightning.media.decoders import ClipDecoder, clip_decoder
from lance_lightning.media.probe import LENGTH_COLUMN
from lance_lightning.media.samplers import AudioClips
from lance_lightning.metrics.clock import active_clock
from lance_lightning.plan.clips import start_fractions
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.read.blobs import open_blob_files
from lance_lightning.read.lance_io import read_positions
from lance_lightning.read.reader import TAKE_GROUP_BYTES, BatchSpec, PlanReader, storage_index
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.vocabulary import CLIP_ROW

#: A media blob file reads ahead this much per storage read: the decoder's 16 KiB reads are served
#: from it (Lance's default, 512 KiB, fetched 524,288 bytes per clip where a 16-frame 128x128 clip
#: needs about 33 KB; no read-ahead makes a storage request of every decoder read).
BLOB_READ_AHEAD = 64 << 10
#: A media blob of at most this size is read whole, in one request, when it is opened.
READ_WHOLE_BYTES = 128 << 10


class ClipReader(PlanReader):
    """Reads one rank's batches of clips of one epoch of a clipped `ReadPlan`."""

    def __init__(
        self,
        plan: ReadPlan,
        epoch: int,
        world_size: int,
        rank: int,
        start: int,
        retry: RetryPolicy = DEFAULT_POLICY,
        take_group_bytes: int = TAKE_GROUP_BYTES,
        bad_rows: Any = None,
    ) -> None:
        super().__init__(plan, epoch, world_size, rank, start, retry, take_group_bytes)
        self.epoch = epoch if plan.split.split("/")[0] == "train" else 0
        if plan.clips is None:
            raise ValueError(f"ClipReader reads a clipped plan; split {plan.split!r} has no clips")
        self.units = plan.clips
        self.sampler = self.units.sampler
        self.policy = bad_rows
        self.decoder: ClipDecoder = clip_decoder(self.sampler)
        self.group_rows = self.first_group_rows = plan.batch_size
        self.first_inline = False
        column, source = self.sampler.column, plan.source
        self.blob = column in source.blob_columns
        self.others = dataclasses.replace(
            source,
            columns=tuple(c for c in source.columns if c != column),
            blob_columns=tuple(c for c in source.blob_columns if c != column),
        )
        self.media_bytes = dataclasses.replace(source, columns=(column,), blob_columns=())
        self.probed: Any = None  # the probed length column's source, once known (`_probed_lengths`)

    def positions(self, matched: np.ndarray) -> np.ndarray:
        """A batch spec's positions are clip units, read by `read_units`."""
        return matched

    def read_group(self, group: list[BatchSpec]) -> list[tuple[int, pa.Table]]:
        table = self.read_units(np.concatenate([spec.positions for spec in group]))
        bounds = np.cumsum([0, *(len(spec.positions) for spec in group)])
        return [(spec.step, table.slice(int(a), int(b - a))) for spec, a, b in zip(group, bounds[:-1], bounds[1:])]

    def read_units(self, units: np.ndarray) -> pa.Table:
        """The table of clips ``units`` (one row per clip, in that order)."""
        units = np.asarray(units, dtype=np.int64)
        rows = self.plan.row_positions(self.units.rows_of(units))
        fractions = start_fractions(self.sampler, self.epoch, units)
        started, _FILE_TIME.seconds = time.perf_counter(), 0.0
        media, times, rows = self._decode(units, rows, fractions)
        clock = active_clock()
        if clock is not None:  # inside the group's "read": decoding moves to "decode"
            decoding = time.perf_counter() - started - _FILE_TIME.seconds
            clock.add("read_seconds", -decoding)
            clock.add("decode_seconds", decoding)
            clock.add("decode_rows", len(units))
        columns: dict[str, pa.Array] = {}
        if self.others.columns:
            wanted, index = storage_index(rows)
            table = read_positions(self.others, wanted, scan_mode=False, retry=self.retry, batch_rows=self.batch_rows)
            if index is not None:
                table = table.take(pa.array(index))
            columns.update((name, table.column(name)) for name in table.column_names)
        columns[self.sampler.column] = _tensor(_stack(media, rows, self.sampler.column))
        suffix = "_start" if isinstance(self.sampler, AudioClips) else "_timestamps"
        columns[self.sampler.column + suffix] = _fixed_list(np.stack(times))
        columns[CLIP_ROW] = pa.array(rows, pa.int64())
        return pa.table(columns)

    def _decode(
        self, units: np.ndarray, rows: np.ndarray, fractions: np.ndarray
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """Each clip's (media, times), and the dataset row each came from (a bad one's replacement)."""
        media: list[Any] = [None] * len(units)
        times: list[Any] = [None] * len(units)
        final = rows.copy()
        by_row: dict[int, list[int]] = defaultdict(list)
        for slot in np.argsort(fractions, kind="stable"):
            by_row[int(rows[slot])].append(int(slot))
        for row, failed in self._each_row(by_row, fractions, media, times):
            for slot in failed:
                final[slot], media[slot], times[slot] = self._replace(int(units[slot]), row, failed[slot])
        return media, times, final

    def _each_row(self, by_row: dict[int, list[int]], fractions: np.ndarray, media: list, times: list):
        """Decode the clips of each row; yield ``(row, {slot: BadMedia})`` for rows with bad clips."""
        held = {row: self.decoder.opened(self._key(row)) for row in by_row}  # this thread's until released
        closed = np.array([row for row, opened in held.items() if opened is None], dtype=np.int64)
        files = dict(zip(closed.tolist(), self._files(closed))) if len(closed) else {}
        lengths = self._probed_lengths(closed)
        for row, slots in by_row.items():
            failed: dict[int, BadMedia] = {}
            opened = held[row]
            if opened is None:
                file = files.pop(row)
                try:
                    opened = self.decoder.open(file)
                except BadMedia as error:  # not media: every clip of it is bad
                    file.close()
                    yield row, dict.fromkeys(slots, error)
                    continue
                mismatch = _length_mismatch(opened, lengths.get(row))
                if mismatch is not None:
                    opened.close()
                    yield row, dict.fromkeys(slots, mismatch)
                    continue
            for slot in slots:
                try:
                    media[slot], times[slot] = self.decoder.decode(opened, float(fractions[slot]))
                except BadMedia as error:
                    failed[slot] = error
            if failed:  # a failed decode may leave the decoder mid-stream: not reused
                opened.close()
                yield row, failed
            else:
                self.decoder.release(self._key(row), opened)

    def _replace(self, unit: int, row: int, error: BadMedia) -> tuple[int, np.ndarray, np.ndarray]:
        """(row, media, times) of the clip decoded in place of the bad clip ``unit`` of ``row``."""
        clock = active_clock()
        if clock is not None:
            clock.add("bad_rows", 1)
        source = self.plan.source
        where = f"dataset row {row} of {source.uri} (version {source.version}), column {self.sampler.column!r}"
        if not hasattr(self.policy, "candidate"):  # `RaiseOnBadRow` (`ReplaceBadRow` chooses candidates)
            raise BadRowError(
                f"bad row: {where}: clip {unit % self.sampler.per_item} could not be decoded: {error.reason}. "
                "Fix or delete the row, filter it out, or pass `bad_rows=ReplaceBadRow()` to replace bad clips",
                row,
                self.sampler.column,
            ) from error
        for attempt in range(self.policy.max_attempts):
            candidate = self.policy.candidate(unit, attempt, self.plan.matched_rows)
            other = int(self.plan.row_positions(self.units.rows_of(np.array([candidate])))[0])
            if other == row:
                continue
            fraction = float(start_fractions(self.sampler, self.epoch, np.array([candidate]))[0])
            file = self._files(np.array([other]))[0]
            try:
                opened = self.decoder.open(file)
            except BadMedia:
                file.close()
                continue
            if _length_mismatch(opened, self._probed_lengths(np.array([other])).get(other)) is not None:
                opened.close()
                continue
            try:
                media, times = self.decoder.decode(opened, fraction)
            except BadMedia:
                continue
            finally:
                opened.close()
            return other, media, times
        raise BadRowError(
            f"bad row: {where} could not be decoded ({error.reason}), and none of {self.policy.max_attempts} "
            "replacement clips could either. Check the data, or raise `ReplaceBadRow.max_attempts`",
            row,
            self.sampler.column,
        ) from error

    def _probed_lengths(self, rows: np.ndarray) -> dict[int, int]:
        """The length ``prepare`` probed (`lance_lightning.media.probe`) of each of ``rows``
        (dataset positions), when the dataset has that column and the value is not null."""
        if self.probed is None:
            kind = "audio" if isinstance(self.sampler, AudioClips) else "video"
            name = LENGTH_COLUMN[kind]
            has = name in self.plan.source.open().schema.names
            self.probed = dataclasses.replace(self.media_bytes, columns=(name,)) if has else False
        if self.probed is False or not len(rows):
            return {}
        wanted, index = storage_index(rows)
        values = read_positions(self.probed, wanted, scan_mode=False, retry=self.retry).column(0).to_pylist()
        order = range(len(rows)) if index is None else index
        return {int(row): values[int(i)] for row, i in zip(rows, order) if values[int(i)] is not None}

    def _key(self, row: int) -> tuple[Any, ...]:
        source = self.plan.source
        return (source.uri, source.version, self.sampler.column, row)

    def _files(self, rows: np.ndarray) -> list[Any]:
        """A seekable file per row of ``rows`` (sorted or not): blob files, or the values' bytes; a null
        value, blob or bytes, is an empty file (bad media: the decoder rejects it, the policy applies)."""
        if self.blob:
            files = open_blob_files(self.plan.source, self.sampler.column, rows, self.retry, BLOB_READ_AHEAD)
            return [io.BytesIO(b"") if file is None else _small_read_whole(file) for file in files]
        wanted, index = storage_index(rows)
        values = read_positions(self.media_bytes, wanted, scan_mode=False, retry=self.retry).column(0)
        order = range(len(rows)) if index is None else index
        return [io.BytesIO(values[int(i)].as_py() or b"") for i in order]


def _length_mismatch(opened: Any, probed: int | None) -> BadMedia | None:
    """`BadMedia` when ``prepare`` probed another length than the opened file's frame index
    (video frames) or stream (audio samples) has: the file changed since, and a clip cut from
    either length could be wrong."""
    if probed is None:
        return None
    video = hasattr(opened, "frame_pts")
    found, unit = (opened.frames, "frames") if video else (opened.samples, "samples")
    if found == probed:
        return None
    column = LENGTH_COLUMN["video" if video else "audio"]
    return BadMedia(
        f"the file holds {found} {unit} but prepare probed {probed} (column {column!r}): it changed since "
        "it was prepared; prepare the dataset again"
    )


def _small_read_whole(file: Any) -> Any:
    """A small blob read whole in one request (opening an MP4 reads its start, its index at the
    end, then its start again: more than the file, 38.9 against 23.7 KiB for a 2 s video); a
    larger one as a `TimedFile` reading what the decoder asks for."""
    if file.size() > READ_WHOLE_BYTES:
        return TimedFile(file)
    started = time.perf_counter()
    try:
        return io.BytesIO(file.read())
    finally:
        file.close()
        _FILE_TIME.seconds = getattr(_FILE_TIME, "seconds", 0.0) + time.perf_counter() - started


class TimedFile(io.RawIOBase):
    """A blob file whose reads add their time to this thread's `_FILE_TIME` (storage, not decoding)."""

    def __init__(self, file: Any) -> None:
        super().__init__()
        self.file = file

    def readinto(self, buffer: Any) -> int:
        started = time.perf_counter()
        try:
            return self.file.readinto(buffer)
        finally:
            _FILE_TIME.seconds = getattr(_FILE_TIME, "seconds", 0.0) + time.perf_counter() - started

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.file.close()
        super().close()


#: Seconds the current thread spent in media file reads since its clip read began.
_FILE_TIME = threading.local()


def _stack(media: list[np.ndarray], rows: np.ndarray, column: str) -> np.ndarray:
    """The clips of a batch as one array; `ConfigError` naming ``VideoClips.size`` when videos of
    different sizes meet in one batch with ``size: null`` (no resize)."""
    shapes = {clip.shape for clip in media}
    if len(shapes) > 1:
        first = media[0].shape
        other = next(i for i, clip in enumerate(media) if clip.shape != first)
        sizes = [f"{shape[-2]}x{shape[-1]}" for shape in (first, media[other].shape)]
        raise ConfigError(
            "VideoClips.size",
            None,
            f"keeps each video's own size, and one batch holds clips of column {column!r} of {sizes[0]} "
            f"(dataset row {int(rows[0])}) and {sizes[1]} (dataset row {int(rows[other])}), which cannot be "
            "stacked into one tensor",
            f"set size: [height, width] (e.g. size: [{first[-2]}, {first[-1]}]) to resize every clip while decoding",
        )
    return np.stack(media)


def _tensor(values: np.ndarray) -> pa.Array:
    """``values`` (``[n, *shape]``) as an Arrow fixed-shape tensor column (no copy)."""
    kind = pa.fixed_shape_tensor(pa.from_numpy_dtype(values.dtype), values.shape[1:])
    return pa.ExtensionArray.from_storage(kind, _fixed_list(values.reshape(len(values), -1)))


def _fixed_list(values: np.ndarray) -> pa.Array:
    flat = np.ascontiguousarray(values).reshape(len(values), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
