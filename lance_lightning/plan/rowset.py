"""The rows a filter matches, kept compactly: "the i-th match" to its dataset position.

Guarantees:
- `scan_matches` evaluates the filter once, in one streaming scan, and never holds the matches as
  one array of positions: the filter projected as one boolean per row over the columns it reads
  (0.8-1.6 ms for issue #39's 400,000 rows, where a filtered scan of ``_rowoffset`` took
  5.1-5.5 ms, with a scalar index too; one measurement), or a filtered scan of ``_rowoffset``
  where Lance cannot project the filter or, from `INDEX_SCAN_ROWS` rows, a scalar index answers it.
- The result is one of three exact structures, chosen per dataset: `RangeRuns` (runs of
  consecutive matches: 16 bytes per run) while they take at most 1/8 of a bitmap, else the
  smaller of `MatchBitmap` (one bit per dataset row plus 8 bytes per 512 rows for rank/select:
  134 MiB at 10^9 rows) and `EliasFano` (about ``2 + log2(rows / matches)`` bits per match: 71 MiB
  for a 10% filter of 10^9 rows). Planning holds the bitmap plus at most 1/8 of it in runs, then
  the bitmap and the codes built from it 2^22 rows at a time, and returns the scan's freed heap
  to the OS afterwards (from `TRIM_AFTER_ROWS` rows scanned).
- ``select(index)`` maps match indices to sorted-order dataset positions in O(len(index) * log)
  work; ``select_range(first, count)`` maps consecutive ones in work linear in the rows they span
  (`select_runs` uses it for runs of consecutive indices: storage order, shards). Every structure
  pickles as a few numpy arrays (DataLoader workers receive them, never rescan;
  `lance_lightning.load.shared` sends them as shared memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Iterator

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Matches read per batch of the setup scan, with a short read-ahead: on 10^8 rows (10% filter)
#: 2^20-row batches with Lance's default read-ahead held 186 MB and took 10.9 s, 2^16-row batches
#: with 2 batches and 1 fragment ahead 125 MB and 1.8 s (2 loaded cores, warm page cache).
SCAN_BATCH_ROWS = 1 << 16
_BLOCK_WORDS = 8  # a rank/select block: 8 words of 64 bits
_CONVERT_WORDS = 1 << 16  # bitmap words turned into Elias-Fano codes at a time (2^22 rows)


class RangeRuns:
    """Matches as runs of consecutive positions: ``starts`` and the cumulative run lengths."""

    def __init__(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.before = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])  # matches before run i
        self.rows = int(self.before[-1])

    @property
    def nbytes(self) -> int:
        return self.starts.nbytes + self.before.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """What rebuilds it (`rowset_from_arrays`)."""
        return {"starts": self.starts, "lengths": np.diff(self.before)}

    def select(self, index: np.ndarray) -> np.ndarray:
        run = np.searchsorted(self.before, index, side="right") - 1
        return self.starts[run] + (index - self.before[run])

    def select_range(self, first: int, count: int) -> np.ndarray:
        """``select(arange(first, first + count))``."""
        return self.select(np.arange(first, first + count, dtype=np.int64))


class MatchBitmap:
    """Matches as one bit per dataset row, with cumulative counts per 512-row block."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = words
        counts = np.bitwise_count(words.reshape(-1, _BLOCK_WORDS)).sum(axis=1, dtype=np.int64)
        self.before = np.concatenate([[0], np.cumsum(counts)])  # matches before block b
        self.rows = int(self.before[-1])

    @property
    def nbytes(self) -> int:
        return self.words.nbytes + self.before.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """What rebuilds it (`rowset_from_arrays`)."""
        return {"words": self.words}

    def select(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        block = np.searchsorted(self.before, index, side="right") - 1
        rank = index - self.before[block]  # rank of the wanted match inside its block
        words = self.words[block[:, None] * _BLOCK_WORDS + np.arange(_BLOCK_WORDS)]
        counts = np.cumsum(np.bitwise_count(words), axis=1, dtype=np.int64)
        word = np.argmax(counts > rank[:, None], axis=1)
        rows = np.arange(len(index))
        rank -= counts[rows, word] - np.bitwise_count(words[rows, word]).astype(np.int64)
        bits = np.unpackbits(words[rows, word].view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        bit = np.argmax(np.cumsum(bits, axis=1) > rank[:, None], axis=1)
        return (block * _BLOCK_WORDS + word) * 64 + bit

    def select_range(self, first: int, count: int) -> np.ndarray:
        """``select(arange(first, first + count))``: the set bits of the blocks holding those
        matches, unpacked at once (linear in the rows they span, not ``count`` rank searches)."""
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        lo, hi = np.searchsorted(self.before, [first, first + count - 1], side="right") - 1
        words = self.words[lo * _BLOCK_WORDS : (hi + 1) * _BLOCK_WORDS]
        bits = np.unpackbits(words.view(np.uint8), bitorder="little").view(np.bool_)
        skip = first - int(self.before[lo])
        return np.flatnonzero(bits)[skip : skip + count].astype(np.int64) + lo * _BLOCK_WORDS * 64


class EliasFano:
    """Matches as Elias-Fano codes: each position's low ``width`` bits packed into words (``width``
    a power of two, so no value straddles two words), its high bits unary-coded in a
    `MatchBitmap` whose ``select(i) - i`` gives them back. About ``2 + log2(rows / matches)`` bits
    per match: 71 MiB for 10^8 matches among 10^9 rows, where the bitmap takes 134 MiB."""

    def __init__(self, upper: MatchBitmap, low: np.ndarray, width: int) -> None:
        self.upper = upper
        self.low = low
        self.width = width
        self.rows = upper.rows

    @staticmethod
    def _shape(matches: int, total_rows: int) -> tuple[int, int, int]:
        """``(width, upper words, low words)`` of the codes of ``matches`` among ``total_rows`` rows."""
        low_bits = min(32, int(total_rows // max(1, matches)).bit_length() - 1)  # floor(log2(rows per match))
        width = 1 << (low_bits.bit_length() - 1) if low_bits >= 1 else 0  # rounded down to a power of two
        upper = -(-(matches + (total_rows >> width) + 1) // 512) * _BLOCK_WORDS
        return width, upper, -(-matches // (64 // width)) if width else 0

    @classmethod
    def size_of(cls, matches: int, total_rows: int) -> int:
        """``nbytes`` of the codes of ``matches`` among ``total_rows`` rows, without building them."""
        _, upper, low = cls._shape(matches, total_rows)
        return 8 * (upper + low) + 8 * (upper // _BLOCK_WORDS + 1)  # words, low words, block counts

    @classmethod
    def from_bitmap(cls, bitmap: MatchBitmap, total_rows: int) -> EliasFano:
        """The same matches as ``bitmap`` (of ``total_rows`` rows), read 2^22 rows at a time."""
        width, upper_words, low_words = cls._shape(bitmap.rows, total_rows)
        per_word = 64 // width if width else 0
        upper = np.zeros(upper_words, dtype=np.uint64)
        low = np.zeros(low_words, dtype=np.uint64)
        done = 0
        for first in range(0, len(bitmap.words), _CONVERT_WORDS):
            bits = np.unpackbits(bitmap.words[first : first + _CONVERT_WORDS].view(np.uint8), bitorder="little")
            positions = np.flatnonzero(bits.view(np.bool_)).astype(np.int64) + first * 64  # bool: a faster nonzero
            if len(positions) == 0:
                continue
            index = np.arange(done, done + len(positions), dtype=np.int64)
            _set_bits(upper, (positions >> width) + index)
            if width:
                word = index // per_word
                values = (positions & ((1 << width) - 1)).astype(np.uint64) << ((index % per_word) * width).astype(
                    np.uint64
                )
                starts = np.concatenate([[0], np.flatnonzero(np.diff(word)) + 1])
                low[word[starts]] |= np.bitwise_or.reduceat(values, starts)
            done += len(positions)
        return cls(MatchBitmap(upper), low, width)

    @property
    def nbytes(self) -> int:
        return self.upper.nbytes + self.low.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """What rebuilds it (`rowset_from_arrays`)."""
        return {"upper": self.upper.words, "low": self.low, "width": np.array(self.width)}

    def select(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        high = self.upper.select(index) - index
        if not self.width:
            return high
        per_word = 64 // self.width
        shift = ((index % per_word) * self.width).astype(np.uint64)
        low = (self.low[index // per_word] >> shift) & np.uint64((1 << self.width) - 1)
        return (high << self.width) | low.astype(np.int64)

    def select_range(self, first: int, count: int) -> np.ndarray:
        """``select(arange(first, first + count))``, the high bits decoded as one range of the
        upper bitmap (`MatchBitmap.select_range`)."""
        index = np.arange(first, first + count, dtype=np.int64)
        high = self.upper.select_range(first, count) - index
        if not self.width:
            return high
        per_word = 64 // self.width
        shift = ((index % per_word) * self.width).astype(np.uint64)
        low = (self.low[index // per_word] >> shift) & np.uint64((1 << self.width) - 1)
        return (high << self.width) | low.astype(np.int64)


RowSet = RangeRuns | MatchBitmap | EliasFano

#: `select_runs` decodes runs of consecutive match indices as ranges while they average at least
#: this many indices (storage order, shards); shorter runs (a shuffle buffer) go through ``select``.
RANGE_SELECT_ROWS = 64


def select_runs(rowset: RowSet, index: np.ndarray) -> np.ndarray:
    """``rowset.select(index)``, with runs of consecutive indices decoded as ranges: a storage-ordered
    10% filter's batch positions in about 1/10 of the time rank searches take."""
    index = np.asarray(index, dtype=np.int64)
    if len(index) < RANGE_SELECT_ROWS:
        return rowset.select(index)
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    if (len(breaks) + 1) * RANGE_SELECT_ROWS > len(index):
        return rowset.select(index)
    edges = [0, *breaks.tolist(), len(index)]
    parts = [rowset.select_range(int(index[a]), b - a) for a, b in zip(edges[:-1], edges[1:])]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def rowset_from_arrays(arrays: dict[str, np.ndarray]) -> RowSet:
    """The `RowSet` whose ``arrays()`` these are."""
    if "upper" in arrays:
        upper = MatchBitmap(np.asarray(arrays["upper"], dtype=np.uint64))
        return EliasFano(upper, np.asarray(arrays["low"], dtype=np.uint64), int(arrays["width"]))
    if "words" in arrays:
        return MatchBitmap(np.asarray(arrays["words"], dtype=np.uint64))
    return RangeRuns(arrays["starts"], arrays["lengths"])


def scan_matches(dataset: lance.LanceDataset, filter: str, total_rows: int) -> RowSet:
    """The rows of ``dataset`` matching ``filter``, in one streaming scan (see module docstring)."""
    blocks = -(-max(1, total_rows) // (64 * _BLOCK_WORDS))
    words = np.zeros(blocks * _BLOCK_WORDS, dtype=np.uint64)
    most_runs = words.nbytes // 128  # runs are kept while they take at most 1/8 of the bitmap
    starts: list[np.ndarray] | None = []
    lengths: list[np.ndarray] = []
    runs, last = 0, -1
    for item in _match_batches(dataset, filter, total_rows):
        if isinstance(item, tuple):  # a projected batch: (booleans, position of the first)
            mask, start = item
            if starts is None and _or_mask(words, mask, start):
                continue
            offsets = np.flatnonzero(mask.to_numpy(zero_copy_only=False)) + start
        else:
            offsets = item
        if len(offsets) == 0:
            continue
        ordered = bool(np.all(offsets[1:] > offsets[:-1]))
        if not ordered:
            offsets = np.sort(offsets)
        _set_bits(words, offsets)
        if starts is not None and ordered and offsets[0] > last:
            first = np.concatenate([[0], np.flatnonzero(np.diff(offsets) != 1) + 1])
            starts.append(offsets[first])
            lengths.append(np.diff(np.append(first, len(offsets))))
            runs += len(first)
        else:
            starts = None
        last = int(offsets[-1])
        if starts is not None and runs > most_runs:
            starts = None
    if starts is not None and starts:
        del words
        found: RowSet = _merged_runs(np.concatenate(starts), np.concatenate(lengths))
    else:
        found = MatchBitmap(words)
        del words
        if EliasFano.size_of(found.rows, total_rows) < found.nbytes:
            found = EliasFano.from_bitmap(found, total_rows)
    if total_rows >= TRIM_AFTER_ROWS:
        _return_freed_memory()
    return found


def _match_batches(
    dataset: lance.LanceDataset, filter: str, total_rows: int
) -> Iterator[np.ndarray | tuple[pa.Array, int]]:
    """The matching rows, batch by batch: the filter evaluated as a projection (each batch a
    null-free boolean array and the position of its first row), or where that cannot run, or a
    scalar index answers the filter on a table of `INDEX_SCAN_ROWS` rows or more, a filtered scan
    of ``_rowoffset`` (each batch the matching positions)."""
    if total_rows < INDEX_SCAN_ROWS or not _index_answers(dataset, filter):
        projected = _projected(dataset, filter)
        first = next(projected, None)  # a filter Lance cannot project fails here, before any row counts
        if first is not None:
            yield first
            seen = first[1] + len(first[0])
            for mask, start in projected:
                yield mask, start
                seen = start + len(mask)
            if seen != total_rows:
                raise RuntimeError(f"the projection of filter {filter!r} gave {seen} rows, not {total_rows}")
            return
    scanner = dataset.scanner(
        columns=["_rowoffset"],
        filter=filter,
        batch_size=SCAN_BATCH_ROWS,
        scan_in_order=True,
        batch_readahead=2,
        fragment_readahead=1,
    )
    for batch in scanner.to_batches():
        yield batch.column(0).to_numpy().astype(np.int64)


def _projected(dataset: lance.LanceDataset, filter: str) -> Iterator[tuple[pa.Array, int]]:
    """``(booleans, position of the first)`` per batch of the filter projected as a column (NULL
    does not match, as in a filter); nothing when Lance cannot project it (a filter on ``_rowid``)."""
    try:
        batches = dataset.scanner(
            columns={"_match": f"({filter})"},
            batch_size=SCAN_BATCH_ROWS,
            scan_in_order=True,
            batch_readahead=2,
            fragment_readahead=1,
        ).to_batches()
        batch = next(batches, None)
    except (ValueError, OSError):
        return
    start = 0
    while batch is not None:
        column = batch.column(0)
        if not pa.types.is_boolean(column.type):
            return
        if column.null_count:
            column = pc.fill_null(column, False)
        yield column, start
        start += len(column)
        batch = next(batches, None)


def _index_answers(dataset: lance.LanceDataset, filter: str) -> bool:
    """Whether Lance answers ``filter`` with a scalar index."""
    try:
        return "ScalarIndexQuery" in dataset.scanner(columns=["_rowoffset"], filter=filter).explain_plan()
    except (ValueError, OSError):
        return False


#: A scalar index answers a filter instead of a projection of its columns from this many rows up
#: (below, reading the columns is cheaper: 0.8-1.6 ms against 5.1-5.5 ms at 400,000 rows, one
#: measurement; the crossover was not measured).
INDEX_SCAN_ROWS = 1 << 22


#: A scan of at least this many rows hands its freed heap back to the OS: a trim cost 17 ms after
#: 400,000 rows (more than the scan), where there is little to return.
TRIM_AFTER_ROWS = 1 << 24


def _return_freed_memory() -> None:
    """Hand the scan's freed heap back to the OS (glibc keeps it in its arenas otherwise: 581 MB of
    RSS after scanning 10^9 rows, 273 MB after this, with a 134 MB bitmap)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, looked up once (``find_library`` runs a subprocess); ``None`` elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def _or_mask(words: np.ndarray, mask: pa.Array, start: int) -> bool:
    """Set the bits of the rows ``mask`` (null-free booleans of the rows from ``start``) holds true
    by copying its bytes, where they line up with the words' bytes; False (nothing done) elsewhere."""
    if start % 8 or mask.offset % 8 or sys.byteorder != "little":
        return False
    count = (len(mask) + 7) // 8
    if count == 0:
        return True
    data = np.frombuffer(mask.buffers()[1], dtype=np.uint8, count=count, offset=mask.offset // 8).copy()
    if len(mask) % 8:
        data[-1] &= (1 << (len(mask) % 8)) - 1  # bits past the array's end are undefined
    target = words.view(np.uint8)
    target[start // 8 : start // 8 + count] |= data
    return True


def _set_bits(words: np.ndarray, offsets: np.ndarray) -> None:
    """Set the bits of the sorted ``offsets``."""
    word = offsets >> 6
    bits = np.left_shift(np.uint64(1), (offsets & 63).astype(np.uint64))
    first = np.concatenate([[0], np.flatnonzero(np.diff(word)) + 1])
    words[word[first]] |= np.bitwise_or.reduceat(bits, first)


def _merged_runs(starts: np.ndarray, lengths: np.ndarray) -> RangeRuns:
    """Runs of consecutive scan batches joined where one batch ends right before the next starts."""
    joins = np.flatnonzero(starts[1:] == starts[:-1] + lengths[:-1]) + 1
    if len(joins):
        keep = np.ones(len(starts), dtype=bool)
        keep[joins] = False
        group = np.cumsum(keep) - 1
        lengths = np.bincount(group, weights=lengths).astype(np.int64)
        starts = starts[keep]
    return RangeRuns(starts, lengths)
