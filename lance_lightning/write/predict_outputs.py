"""A ``predict_step``'s output as Arrow columns, one value per batch row, checked batch after batch.

Guarantees:
- `OutputColumns.convert` turns one batch's output into ``{column: pyarrow.Array}`` of exactly the
  batch's row count: a tensor ``(N,)`` is a scalar column, ``(N, D)`` a fixed-size list of ``D``
  (``float16``, ``float32``, ``float64``, integer or bool, kept as given; ``D`` >= 1); a list of ``N`` strings a
  string column; a list of ``N`` 1-D tensors or a `Ragged` a variable-length list column; a dict of
  such values several columns (its keys are the column names).
- The first batch fixes each column's Arrow type; a later batch whose columns, type or vector size
  differ, an output whose row count is not the batch's, a non-tensor output, ``bfloat16`` or a
  tensor of three or more dimensions is a `ConfigError` that names the column and the batch, raised
  in ``write_on_batch_end``: before anything is committed.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import torch

from lance_lightning.errors import ConfigError
from lance_lightning.produce.convert import Ragged

_ARROW_OF_TORCH: dict[torch.dtype, pa.DataType] = {
    torch.float16: pa.float16(),
    torch.float32: pa.float32(),
    torch.float64: pa.float64(),
    torch.int8: pa.int8(),
    torch.int16: pa.int16(),
    torch.int32: pa.int32(),
    torch.int64: pa.int64(),
    torch.uint8: pa.uint8(),
    torch.bool: pa.bool_(),
}


class OutputColumns:
    """The columns a run writes and their Arrow types (fixed by the first batch, or given).

    Args:
        names: The columns: one for an output that is a single value, else a dict output's keys.
        types: Column -> Arrow type already fixed (by the run's earlier batches, `read_types`).
    """

    def __init__(self, names: list[str], types: dict[str, pa.DataType] | None = None) -> None:
        self.names = list(names)
        self.types: dict[str, pa.DataType] = dict(types or {})

    def convert(self, prediction: Any, rows: int, batch_idx: int) -> dict[str, pa.Array]:
        """The batch's output as columns of ``rows`` values each (module docstring)."""
        if isinstance(prediction, dict):
            outputs = prediction
            if sorted(map(str, outputs)) != sorted(self.names):
                raise ConfigError(
                    "predict_step output",
                    sorted(map(str, outputs)),
                    f"batch {batch_idx} returned the keys {sorted(map(str, outputs))}, the writer's columns are "
                    f"{sorted(self.names)}",
                    "return one dict key per column named in LancePredictionWriter(columns=[...])",
                )
        elif len(self.names) == 1:
            outputs = {self.names[0]: prediction}
        else:
            raise ConfigError(
                "predict_step output",
                type(prediction).__name__,
                f"batch {batch_idx} returned one value, the writer writes {len(self.names)} columns {self.names}",
                "return a dict with one key per column",
            )
        columns = {str(name): _column(str(name), value, rows, batch_idx) for name, value in outputs.items()}
        if not self.types:
            self.types = {name: array.type for name, array in columns.items()}
            return columns
        for name, array in columns.items():
            if array.type != self.types[name]:
                raise ConfigError(
                    f"predict_step output[{name!r}]",
                    str(array.type),
                    f"batch {batch_idx} gives column '{name}' the type {array.type}, earlier batches "
                    f"{self.types[name]}",
                    "return the same dtype and vector size for every batch (cast with .to(torch.float32))",
                )
        return columns


def types_json(types: dict[str, pa.DataType]) -> dict[str, str]:
    """Column types as JSON (a serialized Arrow schema), for the run's ``columns.json``."""
    schema = pa.schema([pa.field(name, kind) for name, kind in types.items()])
    return {"schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}


def read_types(saved: dict[str, str] | None) -> dict[str, pa.DataType]:
    """The types `types_json` saved (empty for ``None``)."""
    if saved is None:
        return {}
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(saved["schema"])))
    return {field.name: field.type for field in schema}


_FIX = (
    "return a tensor with one row per batch row ((N,) or (N, D)), a list of N strings or 1-D tensors, "
    "or a dict of those (one per column)"
)


def _column(name: str, value: Any, rows: int, batch_idx: int) -> pa.Array:
    param = f"predict_step output[{name!r}]"
    if isinstance(value, torch.Tensor):
        array = _tensor_column(param, value, batch_idx)
    elif isinstance(value, Ragged):
        array = _ragged_column(param, value.values, value.offsets, batch_idx)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
        array = pa.array(list(value), type=pa.string())
    elif isinstance(value, (list, tuple)) and value and all(isinstance(item, torch.Tensor) for item in value):
        flat = [item.reshape(-1) for item in value]
        offsets = torch.tensor([0, *np.cumsum([len(item) for item in flat]).tolist()], dtype=torch.int64)
        array = _ragged_column(param, torch.cat(flat), offsets, batch_idx)
    else:
        raise ConfigError(param, _shown(value), f"batch {batch_idx} returned a {type(value).__name__}", _FIX)
    if len(array) != rows:
        raise ConfigError(
            param,
            f"{len(array)} rows",
            f"batch {batch_idx} has {rows} rows but its output for column '{name}' has {len(array)}",
            "return one output row per batch row (do not reduce over the batch dimension)",
        )
    return array


def _tensor_column(param: str, value: torch.Tensor, batch_idx: int) -> pa.Array:
    kind = _arrow_type(param, value.dtype, batch_idx)
    data = value.detach().cpu()
    if data.dim() == 1:
        return pa.array(data.numpy(), type=kind)
    if data.dim() == 2 and data.shape[1] == 0:
        raise ConfigError(
            param,
            f"shape {tuple(data.shape)}",
            f"batch {batch_idx} returned vectors of size 0: the column would hold no values (Lance refuses it)",
            "return at least one value per row ((N,) or (N, D) with D >= 1)",
        )
    if data.dim() == 2:
        flat = pa.array(data.contiguous().reshape(-1).numpy(), type=kind)
        return pa.FixedSizeListArray.from_arrays(flat, int(data.shape[1]))
    raise ConfigError(
        param,
        f"shape {tuple(data.shape)}",
        f"batch {batch_idx} returned a {data.dim()}-D tensor; a column holds a scalar or a vector per row",
        "flatten each row (output.flatten(1)) or return a dict of 1-D/2-D tensors",
    )


def _ragged_column(param: str, values: torch.Tensor, offsets: torch.Tensor, batch_idx: int) -> pa.Array:
    kind = _arrow_type(param, values.dtype, batch_idx)
    flat = pa.array(values.detach().cpu().reshape(-1).numpy(), type=kind)
    return pa.LargeListArray.from_arrays(pa.array(offsets.detach().cpu().numpy(), type=pa.int64()), flat)


def _arrow_type(param: str, dtype: torch.dtype, batch_idx: int) -> pa.DataType:
    kind = _ARROW_OF_TORCH.get(dtype)
    if kind is None:
        raise ConfigError(
            param,
            str(dtype),
            f"batch {batch_idx} returned {dtype}, which Lance columns do not store",
            "cast it in predict_step, e.g. output.to(torch.float32) or .to(torch.float16)",
        )
    return kind


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
