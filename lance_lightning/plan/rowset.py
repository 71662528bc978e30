"""The rows a filter matches, kept compactly: "the i-th match" to its dataset position.

Guarantees:
- `scan_matches` evaluates the filter once, in one streaming scan of ``_rowoffset`` (Lance uses a
  scalar index when one exists), and never holds the matches as one array of positions.
- The result is one of three exact structures, chosen per dataset: `RangeRuns` (runs of
  consecutive matches: 16 bytes per run) while they take at most 1/8 of a bitmap, else the
  smaller of `MatchBitmap` (one bit per dataset row plus 8 bytes per 512 rows for rank/select:
  134 MiB at 10^9 rows) and `EliasFano` (about ``2 + log2(rows / matches)`` bits per match: 71 MiB
  for a 10% filter of 10^9 rows). Planning holds the bitmap plus at most 1/8 of it in runs, then
  the bitmap and the codes built from it 2^22 rows at a time, and returns the scan's freed heap
  to the OS afterwards.
- ``select(index)`` maps match indices to sorted-order dataset positions in O(len(index) * log)
  work; every structure pickles as a few numpy arrays (DataLoader workers receive them, never
  rescan; `lance_lightning.load.shared` sends them as shared memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import lance
import numpy as np

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

    @classmethod
    def from_bitmap(cls, bitmap: MatchBitmap, total_rows: int) -> EliasFano:
        """The same matches as ``bitmap`` (of ``total_rows`` rows), read 2^22 rows at a time."""
        rows = max(1, bitmap.rows)
        low_bits = min(32, int(total_rows // rows).bit_length() - 1)  # floor(log2(rows per match))
        width = 1 << (low_bits.bit_length() - 1) if low_bits >= 1 else 0  # rounded down to a power of two
        per_word = 64 // width if width else 0
        upper = np.zeros(-(-(bitmap.rows + (total_rows >> width) + 1) // 512) * _BLOCK_WORDS, dtype=np.uint64)
        low = np.zeros(-(-bitmap.rows // per_word) if width else 0, dtype=np.uint64)
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


RowSet = RangeRuns | MatchBitmap | EliasFano


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
    scanner = dataset.scanner(
        columns=["_rowoffset"],
        filter=filter,
        batch_size=SCAN_BATCH_ROWS,
        scan_in_order=True,
        batch_readahead=2,
        fragment_readahead=1,
    )
    for batch in scanner.to_batches():
        offsets = batch.column(0).to_numpy().astype(np.int64)
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
        coded = EliasFano.from_bitmap(found, total_rows)
        if coded.nbytes < found.nbytes:
            found = coded
    _return_freed_memory()
    return found


def _return_freed_memory() -> None:
    """Hand the scan's freed heap back to the OS (glibc keeps it in its arenas otherwise: 581 MB of
    RSS after scanning 10^9 rows, 273 MB after this, with a 134 MB bitmap)."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


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
