"""Token packing across batches, pure: documents concatenated into a stream cut into windows.

Guarantees:
- The stream is the concatenation of the matching documents in storage order (plus ``eos_id``
  after each document when given). Window ``w`` covers stream tokens ``[w*L, w*L + L)`` (one more,
  ``w*L + L``, when labels are made: the last position's target), so a stream of ``T`` tokens
  holds ``(T - (1 if labels else 0)) // L`` windows; the rest (less than one window) is not
  trained, and ``explain`` says how much.
- The plan's unit is the window: the shuffle strategy orders windows as it orders rows (the
  documents inside the stream keep their storage order), the layout, ranks, the cursor and resume
  count windows. Windows are what is shuffled; a document longer than a window spans neighbouring
  windows that a shuffle sends to different batches.
- `DocumentIndex` holds one ``int64`` per document (the stream offset where it starts, plus the
  end): 8 bytes per document. ``locate`` maps windows to ``(first document, offset)`` with one
  ``searchsorted``; nothing else of the dataset's size is built.
- `pack_windows` builds ``input_ids``, ``labels``, ``position_ids``, ``document_ids`` of a batch
  of windows from the documents' tokens with whole-array numpy operations (no loop per token or
  per document); `sequence_bounds` adds ``cu_seqlens`` and ``max_seqlen`` (torch, vectorised).
- No I/O: `lance_lightning.plan.survey` counts the tokens at setup, `lance_lightning.read.packed`
  reads the documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError

LABEL_MODES = ("document", "stream", None)


class TokenPacking:
    """Pack a token-list column into windows of ``seq_len`` tokens across document boundaries.

    Args:
        column: The ``list<int>`` column holding each document's token ids.
        seq_len: Tokens per window (``L``); batches hold ``(batch_size, L)`` tensors.
        eos_id: Token appended after every document (``None``: nothing appended).
        labels: ``"document"``: next-token targets, ``ignore_index`` where the next token belongs
            to another document; ``"stream"``: next-token targets across documents too; ``None``:
            no ``labels`` in the batch.
        lengths_column: An integer column holding each document's token count: setup reads only
            it (cheap). ``None`` counts the tokens from ``column`` (one scan of the token lists: slower).
        ignore_index: The label of masked positions (``labels="document"``).
    """

    def __init__(
        self,
        column: str = "tokens",
        seq_len: int = 2048,
        eos_id: int | None = None,
        labels: str | None = "document",
        lengths_column: str | None = None,
        ignore_index: int = -100,
    ) -> None:
        if not isinstance(column, str) or not column:
            raise ConfigError("packing.column", column, "must be a column name", "set column: tokens")
        check_int("packing.seq_len", seq_len, 1, "set seq_len to 1 or more, e.g. 2048")
        check_int("packing.eos_id", eos_id, 0, "set eos_id to a token id >= 0, or null", optional=True)
        check_choice(
            "packing.labels", labels, LABEL_MODES, "must be 'document', 'stream' or None", "set labels: document"
        )
        if lengths_column is not None and (not isinstance(lengths_column, str) or not lengths_column):
            raise ConfigError(
                "packing.lengths_column", lengths_column, "must be a column name or None", "set lengths_column: null"
            )
        check_int("packing.ignore_index", ignore_index, None, "set ignore_index: -100")
        self.column = column
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.labels = labels
        self.lengths_column = lengths_column
        self.ignore_index = ignore_index

    @property
    def span(self) -> int:
        """Stream tokens a window reads: ``seq_len``, plus the last position's target with labels."""
        return self.seq_len + (1 if self.labels is not None else 0)

    def describe(self) -> dict[str, Any]:
        """Plain description (part of the plan's identity: a cursor of other windows is refused)."""
        return {k: v for k, v in vars(self).items() if k != "lengths_column"}

    def __repr__(self) -> str:
        return f"TokenPacking({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenPacking) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(tuple(vars(self).items()))


@dataclass(frozen=True)
class DocumentIndex:
    """Where each matching document starts in the stream: ``starts[i]`` (``starts[-1]`` = tokens)."""

    packing: TokenPacking
    starts: np.ndarray = field(repr=False, compare=False)

    @classmethod
    def from_counts(cls, packing: TokenPacking, counts: np.ndarray) -> DocumentIndex:
        """The index of documents with ``counts`` tokens each (``eos_id`` adds one per document)."""
        buffer = np.empty(len(counts) + 1, dtype=np.int64)
        buffer[1:] = counts
        return cls.from_buffer(packing, buffer)

    @classmethod
    def from_buffer(cls, packing: TokenPacking, buffer: np.ndarray) -> DocumentIndex:
        """`from_counts` of the counts in ``buffer[1:]`` (int64), computed in place: setup never
        holds more than the index's 8 bytes per document."""
        buffer[0] = 0
        if packing.eos_id is not None:
            buffer[1:] += 1
        np.cumsum(buffer, out=buffer)
        return cls(packing, buffer)

    @property
    def documents(self) -> int:
        return len(self.starts) - 1

    @property
    def tokens(self) -> int:
        return int(self.starts[-1])

    @property
    def windows(self) -> int:
        return max(0, (self.tokens - self.packing.span + self.packing.seq_len) // self.packing.seq_len)

    @property
    def dropped_tokens(self) -> int:
        """Stream tokens no window's ``input_ids`` hold (the tail, less than one window)."""
        return self.tokens - self.windows * self.packing.seq_len

    def locate(self, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(document, offset)`` where each window starts: its first document and the token
        index inside it."""
        first = np.asarray(windows, dtype=np.int64) * self.packing.seq_len
        document = np.searchsorted(self.starts, first, side="right") - 1
        return document, first - self.starts[document]

    def documents_of(self, windows: np.ndarray) -> np.ndarray:
        """The sorted indices of the documents (among the matching ones) that ``windows`` span."""
        windows = np.unique(np.asarray(windows, dtype=np.int64))  # few: a group's windows
        first, _ = self.locate(windows)
        last, _ = self.locate_token(windows * self.packing.seq_len + self.packing.span - 1)
        # Both ends grow with the window: start each run after the previous run's end (no overlap).
        first[1:] = np.maximum(first[1:], last[:-1] + 1)
        counts = np.maximum(0, last - first + 1)
        return np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())

    def locate_token(self, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(document, index inside it)`` of stream tokens ``stream``."""
        document = np.searchsorted(self.starts, stream, side="right") - 1
        return document, stream - self.starts[document]


def pack_windows(
    index: DocumentIndex, windows: np.ndarray, documents: np.ndarray, values: np.ndarray, offsets: np.ndarray
) -> dict[str, np.ndarray]:
    """The packed arrays of ``windows``, from the tokens of ``documents`` (sorted, every document
    the windows span, e.g. `DocumentIndex.documents_of`): document ``documents[k]``'s tokens are
    ``values[offsets[k]:offsets[k+1]]`` (without ``eos_id``, which is added here)."""
    packing = index.packing
    seq_len, span = packing.seq_len, packing.span
    stream = np.asarray(windows, dtype=np.int64)[:, None] * seq_len + np.arange(span, dtype=np.int64)
    doc_starts = index.starts[documents]
    slot = np.searchsorted(doc_starts, stream, side="right") - 1  # the document holding each token
    inside = stream - doc_starts[slot]
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = offsets[1:] - offsets[:-1]
    tokens = np.asarray(values, dtype=np.int64)
    if packing.eos_id is None:
        ids = tokens[offsets[slot] + inside]
    else:
        eos = inside >= lengths[slot]
        ids = np.where(eos, packing.eos_id, tokens[np.where(eos, 0, offsets[slot] + inside)] if len(tokens) else 0)
    new_piece = np.ones(slot.shape, dtype=bool)
    new_piece[:, 1:] = slot[:, 1:] != slot[:, :-1]
    out = {
        "input_ids": ids[:, :seq_len],
        "position_ids": inside[:, :seq_len],
        "document_ids": np.cumsum(new_piece[:, :seq_len], axis=1, dtype=np.int32) - 1,
    }
    if packing.labels is not None:
        labels = ids[:, 1:].copy()
        if packing.labels == "document":
            labels[new_piece[:, 1:]] = packing.ignore_index
        out["labels"] = labels
    return out


def sequence_bounds(document_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cu_seqlens`` (int32, from 0 to ``B*L``) and ``max_seqlen`` (int64 scalar) of the document
    pieces of a ``(B, L)`` batch of ``document_ids``: a piece starts at each window start and at
    each change of document; pieces never cross windows."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.nonzero(starts.reshape(-1)).reshape(-1)
    cu_seqlens = torch.cat([first, first.new_tensor([document_ids.numel()])]).to(torch.int32)
    longest = (cu_seqlens[1:] - cu_seqlens[:-1]).max() if len(first) else torch.tensor(0)
    return cu_seqlens, longest.to(torch.int64)
