"""Turns one Arrow record batch (or table) into one training batch.

The result is a dict of column name → tensor or list, in the input's column
order, converted per column for the whole batch, never per row in Python; the
only row loop is ``Array.to_pylist()`` (a C-level loop) for string columns.

Guarantees:

* Numeric columns come back as tensors of shape ``(n,)`` that share memory
  with the Arrow buffer whenever the column is one chunk without nulls; only
  bools (bit-packed), widened types, date32, multi-chunk tables and filled
  columns are copied.
* Unsigned types torch handles poorly are widened (``uint16`` → ``int32``,
  ``uint32`` → ``int64``); ``uint64`` is reinterpreted as ``int64`` only when
  every value is below ``2**63``.
* Dates, timestamps and durations become ``int64`` tensors of their stored
  integer values (days, or units of the type's time unit).
* ``fixed_size_list`` (nested too) and ``arrow.fixed_shape_tensor`` columns
  become tensors of shape ``(n, d1, d2, ...)`` with one reshape.
* Variable-length ``list`` / ``large_list`` columns of integers or floats
  (e.g. token ids) become a :class:`Ragged`: one flat ``values`` tensor that
  shares the Arrow buffer, plus ``int64`` ``offsets`` of length ``n + 1``
  (row ``i`` is ``values[offsets[i]:offsets[i+1]]``). No per-row loop.
* Binary columns (``binary``, ``large_binary``, ``binary_view``) become a
  :class:`Ragged` of ``uint8`` rows whose ``values`` share the Arrow data
  buffer: one batch of encoded images costs no copy and no Python object per
  row (``batch["image"].row(i).numpy().tobytes()`` is row ``i``'s bytes).
* Nulls are never silently passed through: they are filled from
  ``fill_nulls`` or rejected with :class:`NullValueError`, and anything that
  has no faithful tensor or list form is rejected with
  :class:`UnsupportedColumnError`. Both errors name the column and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from lance_lightning.errors import NullValueError, UnsupportedColumnError

__all__ = ["NullValueError", "Ragged", "UnsupportedColumnError", "to_torch_batch"]


@dataclass(frozen=True)
class Ragged:
    """A batch of variable-length rows: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    ``offsets`` is an ``int64`` tensor of ``len(self) + 1`` non-decreasing entries starting at 0;
    ``values`` holds every row back to back (``uint8`` for a binary column). It moves like a tensor
    (``to``, ``pin_memory``), so Lightning's batch transfer and the DataLoader's pinning handle it.
    """

    values: torch.Tensor
    offsets: torch.Tensor

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, index: int) -> torch.Tensor:
        return self.values[int(self.offsets[index]) : int(self.offsets[index + 1])]

    def to(self, *args: Any, **kwargs: Any) -> Ragged:
        return Ragged(self.values.to(*args, **kwargs), self.offsets.to(*args, **kwargs))

    def pin_memory(self, *args: Any) -> Ragged:
        return Ragged(self.values.pin_memory(*args), self.offsets.pin_memory(*args))

    def is_pinned(self) -> bool:
        return self.values.is_pinned()


# Unsigned types torch cannot hold (or hold fully), widened to a signed type.
_WIDEN = {pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def to_torch_batch(data: pa.Table | pa.RecordBatch, fill_nulls: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Convert a table or record batch into ``{column: tensor | list}``.

    ``fill_nulls`` maps column names to the value that replaces their nulls;
    names that are not in ``data`` are ignored here.
    """
    fill_nulls = fill_nulls or {}
    out: dict[str, Any] = {}
    for i, name in enumerate(data.schema.names):
        arr = data.column(i)
        if isinstance(arr, pa.ChunkedArray):
            # combine_chunks() copies even a lone chunk; take that one as is.
            arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
        out[name] = _convert_column(name, arr, fill_nulls)
    return out


def _convert_column(name: str, arr: pa.Array, fill_nulls: Mapping[str, Any]) -> Any:
    shape: list[int] | None = None
    permutation: list[int] | None = None
    if isinstance(arr.type, pa.FixedShapeTensorType):
        shape, permutation = list(arr.type.shape), arr.type.permutation
        arr = arr.storage  # fixed_size_list<value>[prod(shape)], same validity
    kind = column_kind(name, arr.type)  # reject unsupported types before looking at nulls
    if arr.null_count and name in fill_nulls:
        if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
            # Arrow has no fill_null kernel for view types; to_pylist copies anyway.
            arr = arr.cast(pa.large_string() if kind == "str" else pa.large_binary())
        arr = pc.fill_null(arr, fill_nulls[name])
    if arr.null_count:
        raise NullValueError(
            f"column {name!r} has {arr.null_count} null rows (of {len(arr)}) and tensors "
            f"cannot hold nulls; pass fill_nulls={{{name!r}: <value>}} to LanceDataModule, "
            f'or filter the rows out with filter="{name} IS NOT NULL"'
        )
    if kind == "str":
        return arr.to_pylist()
    if kind == "bytes":
        return _ragged_bytes(arr)
    if kind == "scalar":
        return _primitive_tensor(name, arr)
    if kind == "list":
        return _ragged(name, arr)
    n = len(arr)
    dims: list[int] = []
    while True:
        # flatten() skips null slots, so nulls at any level would shift the values.
        if arr.null_count:
            raise NullValueError(
                f"column {name!r} has nulls inside its fixed-size lists and tensors "
                "cannot hold nulls; fix the data or drop it from `columns`"
            )
        if not pa.types.is_fixed_size_list(arr.type):
            break
        size = arr.type.list_size
        dims.append(size)
        # The values of this slice (`.values` is the whole child; `flatten()`, a compute call,
        # costs more than the rest of a 256-row batch's conversion). No nulls here: checked above.
        arr = arr.values.slice(arr.offset * size, len(arr) * size)
    tensor = _primitive_tensor(name, arr).reshape(n, *(shape or dims))
    if permutation is not None and permutation != list(range(len(permutation))):
        # Arrow stores fixed_shape_tensor rows in `shape` order; the logical
        # tensor is that one with its dims permuted (a view, no copy).
        tensor = tensor.permute(0, *(p + 1 for p in permutation))
    return tensor


def column_kind(name: str, typ: pa.DataType) -> str:
    """Classify a type as "scalar", "fixed_list", "str" or "bytes", or raise."""
    try:
        return _KINDS[typ]
    except KeyError:
        kind = _KINDS[typ] = _column_kind(name, typ)  # raises for an unsupported type: never kept
        return kind
    except TypeError:  # an unhashable type
        return _column_kind(name, typ)


#: Kinds of the types seen (a batch's columns are classified once per type, not once per batch).
_KINDS: dict[pa.DataType, str] = {}


def _column_kind(name: str, typ: pa.DataType) -> str:
    t = pa.types
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return "str"
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ):
        return "bytes"
    if _is_numeric(typ):
        return "scalar"
    if (t.is_list(typ) or t.is_large_list(typ)) and (t.is_integer(typ.value_type) or t.is_floating(typ.value_type)):
        return "list"
    inner = typ
    while t.is_fixed_size_list(inner):
        inner = inner.value_type
    if inner is not typ and _is_numeric(inner):
        return "fixed_list"
    raise UnsupportedColumnError(
        f"column {name!r} has Arrow type {typ}, which cannot become a tensor or "
        "a list of str (supported: integers, floats, bool, dates, timestamps, "
        "durations, fixed_size_list / fixed_shape_tensor of those, list / large_list of "
        "integers or floats, strings, binary); "
        "drop it from `columns`, or cast it to a supported type when writing the dataset"
    )


def _is_numeric(typ: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_integer(typ)
        or t.is_floating(typ)
        or t.is_boolean(typ)
        or (t.is_temporal(typ) and not (t.is_time(typ) or t.is_interval(typ)))
    )


def _primitive_tensor(name: str, arr: pa.Array) -> torch.Tensor:
    """Tensor of shape (n,) from a null-free primitive array, zero-copy if possible."""
    typ = arr.type
    if pa.types.is_boolean(typ):
        # Arrow packs bools into bits, so a copy is unavoidable; the new numpy
        # array is writable and torch.from_numpy takes it without a warning.
        return torch.from_numpy(arr.to_numpy(zero_copy_only=False))
    if typ in _WIDEN:
        arr = arr.cast(_WIDEN[typ])
    elif pa.types.is_uint64(typ):
        top = pc.max(arr).as_py()
        if top is not None and top >= 2**63:
            raise UnsupportedColumnError(
                f"column {name!r} (uint64) holds {top}, which does not fit in int64 "
                "(torch has no uint64 tensors); drop it from `columns` or cast it "
                "when writing the dataset"
            )
        arr = arr.view(pa.int64())  # same bits, all values < 2**63: no copy
    elif pa.types.is_date32(typ):
        arr = arr.view(pa.int32()).cast(pa.int64())
    elif pa.types.is_temporal(typ):  # date64, timestamp, duration: 64-bit storage
        arr = arr.view(pa.int64())
    # DLPack hands torch the Arrow buffer itself (slice offset included) and
    # keeps it alive; unlike torch.from_numpy on the read-only array that
    # to_numpy(zero_copy_only=True) returns, it raises no non-writable warning.
    # The tensor aliases the batch's buffer, which nothing else reads after
    # conversion, so in-place edits by a transform are harmless.
    return torch.from_dlpack(arr)


def _ragged_bytes(arr: pa.Array) -> Ragged:
    """`Ragged` uint8 rows from a null-free binary array: values share the Arrow data buffer."""
    if pa.types.is_binary_view(arr.type):
        arr = arr.cast(pa.large_binary())
    _, offset_buffer, data = arr.buffers()
    offset_type = pa.int64() if pa.types.is_large_binary(arr.type) else pa.int32()
    offsets = pa.Array.from_buffers(offset_type, arr.offset + len(arr) + 1, [None, offset_buffer])
    offsets = torch.from_dlpack(offsets.slice(arr.offset)).to(torch.int64)  # a copy of n + 1 entries only
    first, last = int(offsets[0]), int(offsets[-1])
    values = torch.from_dlpack(pa.Array.from_buffers(pa.uint8(), len(data), [None, data]))
    return Ragged(values[first:last], offsets - first)


def _ragged(name: str, arr: pa.Array) -> Ragged:
    """`Ragged` from a null-free list array: values share the Arrow buffer, offsets are rebased."""
    values = arr.values  # the whole child array; a slice of `arr` only moves its offsets
    if values.null_count:
        raise NullValueError(
            f"column {name!r} has nulls inside its lists and tensors cannot hold nulls; "
            "fix the data or drop it from `columns`"
        )
    offsets = torch.from_dlpack(arr.offsets).to(torch.int64)  # n + 1 entries (a copy of those only)
    first, last = int(offsets[0]), int(offsets[-1])
    return Ragged(_primitive_tensor(name, values)[first:last], offsets - first)
