"""Fixed-length token windows for language-model pretraining.

Guarantees: :class:`TokenWindows` packs the documents of one batch (a column of token-id lists,
which the converter gives as a `lance_lightning.produce.convert.Ragged`, or a 2-D tensor of equal-length
rows) into windows of exactly ``window`` tokens, with vectorised torch ops (no per-row or
per-window Python loop):

* The documents are concatenated in batch order (``eos_id``, when given, is appended after each),
  and window ``i`` starts at token ``i * stride``.
* With ``labels=True`` each window spans ``window + 1`` tokens: ``input_ids`` are the first
  ``window`` and ``labels`` the last ``window`` (next-token targets, already shifted).
* How many windows a batch yields: with ``windows=None`` (default) it is
  ``max(0, (T - span) // stride + 1)`` for ``T`` tokens and ``span = window (+1 with labels)``,
  so it varies from batch to batch and the tokens after the last whole window are dropped. With
  ``windows=k`` every batch yields exactly ``k`` windows (fixed shapes, e.g. for ``torch.compile``):
  extra tokens are dropped, missing ones are padded with ``pad_id``, their labels are
  ``ignore_index`` and an ``attention_mask`` (bool, False on padding) is added.
* The token column is replaced by ``input_ids`` (and ``labels``/``attention_mask``); every other
  column is passed through untouched (still one entry per document).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.produce.convert import Ragged

__all__ = ["TokenWindows"]

_DTYPES = {"int64": torch.int64, "int32": torch.int32}


class TokenWindows:
    """Packs a batch's token-id documents into ``(N, window)`` ``input_ids`` (and ``labels``).

    Args:
        column: Column of token ids: ``list<int>``/``large_list<int>`` (variable length) or
            ``fixed_size_list<int>``.
        window: Tokens per window (the model's context length).
        stride: Tokens between window starts; default ``window`` (no overlap). Smaller overlaps.
        eos_id: Token appended after every document (document separator); ``None`` appends none.
        labels: Also return next-token ``labels`` (each window then spans ``window + 1`` tokens).
        windows: Fixed number of windows per batch (pad or drop to it); ``None``: as many as fit.
        pad_id: Padding token for ``windows=k`` batches that run short.
        ignore_index: Label of padded positions (the ``ignore_index`` of the loss).
        dtype: Integer type of ``input_ids``/``labels``: ``"int64"`` (what embeddings take) or ``"int32"``.
    """

    def __init__(
        self,
        column: str = "tokens",
        window: int = 2048,
        stride: int | None = None,
        eos_id: int | None = None,
        labels: bool = True,
        windows: int | None = None,
        pad_id: int = 0,
        ignore_index: int = -100,
        dtype: Literal["int64", "int32"] = "int64",
    ) -> None:
        if not isinstance(column, str) or not column:
            raise ConfigError("column", column, "must be a column name", 'set column: "tokens"')
        for name, value, optional in (("window", window, False), ("stride", stride, True), ("windows", windows, True)):
            check_int(
                name,
                value,
                1,
                f"set {name} to a positive integer" + (" or None" if optional else ""),
                optional=optional,
            )
        for name, value in (("eos_id", eos_id), ("pad_id", pad_id), ("ignore_index", ignore_index)):
            check_int(
                name, value, None, f"set {name} to an integer", problem="must be an integer token id", optional=True
            )
        if dtype not in _DTYPES:
            raise ConfigError("dtype", dtype, "unknown token dtype", 'use "int64" or "int32"')
        self.column = column
        self.window = window
        self.stride = stride or window
        self.eos_id = eos_id
        self.labels = bool(labels)
        self.windows = windows
        self.pad_id = pad_id
        self.ignore_index = ignore_index
        self.dtype = dtype

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"

    @property
    def span(self) -> int:
        """Tokens one window covers (``window``, plus one for the shifted labels)."""
        return self.window + (1 if self.labels else 0)

    def count(self, tokens: int) -> int:
        """Windows a batch of ``tokens`` tokens (separators included) yields."""
        if self.windows is not None:
            return self.windows
        return max(0, (tokens - self.span) // self.stride + 1)

    def stream(self, values: Any) -> torch.Tensor:
        """The batch's documents back to back (with ``eos_id`` after each), as one 1-D tensor."""
        if isinstance(values, Ragged):
            flat, offsets = values.values, values.offsets
        elif isinstance(values, torch.Tensor) and values.dim() == 2:
            flat = values.reshape(-1)
            offsets = torch.arange(values.shape[0] + 1, device=values.device) * values.shape[1]
        else:
            raise ValueError(
                f"TokenWindows: column {self.column!r} holds {type(values).__name__}, not token ids; it needs a "
                "list<int>/large_list<int> column (read as Ragged) or a fixed_size_list<int> column (a 2-D tensor)"
            )
        if flat.is_floating_point() or flat.dtype == torch.bool:
            raise ValueError(f"TokenWindows: column {self.column!r} holds {flat.dtype} values, not integer token ids")
        flat = flat.to(_DTYPES[self.dtype])
        if self.eos_id is None:
            return flat
        docs = offsets.numel() - 1
        lengths = offsets[1:] - offsets[:-1]
        out = torch.full((flat.numel() + docs,), self.eos_id, dtype=flat.dtype, device=flat.device)
        doc_of_token = torch.repeat_interleave(torch.arange(docs, device=flat.device), lengths)
        out[torch.arange(flat.numel(), device=flat.device) + doc_of_token] = flat
        return out

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.column not in batch:
            raise ValueError(
                f"TokenWindows: column {self.column!r} is not in the batch (columns: {sorted(batch)}); "
                "set column= to the token-id column"
            )
        stream = self.stream(batch[self.column])
        count = self.count(stream.numel())
        needed = (count - 1) * self.stride + self.span if count else 0
        valid = None
        if needed > stream.numel():  # only with a fixed `windows`: pad the tail
            valid = torch.arange(needed, device=stream.device) < stream.numel()
            pad = torch.full((needed - stream.numel(),), self.pad_id, dtype=stream.dtype, device=stream.device)
            stream = torch.cat([stream, pad])
        if count:
            spans = stream[:needed].unfold(0, self.span, self.stride)  # (count, span), a view
        else:
            spans = stream.new_empty((0, self.span))
        result = {k: v for k, v in batch.items() if k != self.column}
        result["input_ids"] = spans[:, : self.window].contiguous()
        if self.labels:
            result["labels"] = spans[:, 1:].contiguous()
        if self.windows is not None:
            mask = (
                valid[:needed].unfold(0, self.span, self.stride)
                if valid is not None
                else torch.ones_like(spans, dtype=torch.bool)
            )
            result["attention_mask"] = mask[:, : self.window].contiguous()
            if self.labels:
                result["labels"][~mask[:, 1:]] = self.ignore_index
        return result
