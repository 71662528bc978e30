"""Schema problems found at ``setup()``, from the datasets' schemas, before any batch is read.

Guarantees: `check_read_schema` raises `ConfigError` (naming the parameter, the value and the fix)
in the main process, before any worker starts, when
- a read column has an Arrow type no batch can hold (struct, map, union, ...);
- a ``fill_nulls`` value cannot fill its column's type (e.g. ``"zero"`` for a float column);
- a transform expects another type for a column it names (e.g. `DecodeImage` on an integer
  column). A transform takes part by defining ``check_schema(schema: pyarrow.Schema)``; `Compose`
  asks each of its transforms.
What it accepts converts as `lance_lightning.produce.convert` says; it never reads rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lance_lightning.errors import ConfigError
from lance_lightning.produce.convert import UnsupportedColumnError, column_kind
from lance_lightning.vocabulary import Split


def read_schema(plan: Any) -> pa.Schema:
    """The Arrow schema of the columns ``plan`` reads (from the pinned dataset's metadata), blob
    columns as the bytes their reader yields."""
    schema = plan.source.open().schema
    blobs = set(plan.source.blob_columns)
    return pa.schema(
        [pa.field(name, pa.large_binary()) if name in blobs else schema.field(name) for name in plan.source.columns]
    )


def check_read_schema(plans: Mapping[Split, Any], fill_nulls: Mapping[str, Any], transform: Any) -> None:
    """Raise `ConfigError` for a column, fill value or transform that cannot work (module docstring)."""
    for split, plan in plans.items():
        schema = read_schema(plan)
        for field in schema:
            if isinstance(field.type, pa.ExtensionType) and not isinstance(field.type, pa.FixedShapeTensorType):
                continue  # converted by its reader (e.g. Lance blobs), not from its storage type
            storage = field.type.storage_type if isinstance(field.type, pa.ExtensionType) else field.type
            try:
                column_kind(field.name, storage)
            except UnsupportedColumnError as error:
                raise ConfigError(
                    f"{split}.columns",
                    list(plan.source.columns),
                    str(error).split(";")[0],
                    f"drop {field.name!r} from `{split}.columns`, or cast it to a supported type "
                    "when writing the dataset",
                ) from None
            if field.name in fill_nulls:
                _check_fill(field, fill_nulls[field.name])
        check = getattr(transform, "check_schema", None)
        if check is not None:
            check(schema)


def _check_fill(field: pa.Field, value: Any) -> None:
    try:
        pc.fill_null(pa.nulls(1, field.type), value)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as error:
        example = {"str": '""', "bytes": 'b""'}.get(column_kind(field.name, field.type), "0")
        raise ConfigError(
            f"fill_nulls.{field.name}",
            value,
            f"cannot fill nulls of column {field.name!r}, whose Arrow type is {field.type} "
            f"({str(error).splitlines()[0]})",
            f"give a value of that type, e.g. fill_nulls: {{{field.name}: {example}}}",
        ) from None
