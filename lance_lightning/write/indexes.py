"""Scalar indexes a prepare builds (``prepare --index label,split``, ``Prepare(index=[...])``).

Guarantees:
- `check_index_columns` refuses, before anything is written, a column the survey's schema does not
  have or whose type Lance cannot index with BTREE/BITMAP (binary, blobs, lists, structs): a
  `ConfigError` naming ``prepare.index``, the column and the columns that can be indexed.
- `build_indexes` runs inside the prepare's completion, after the last unit's commit and before the
  completion record: a complete dataset always has its indexes. A rerun after a kill between the
  two builds the missing ones (an index already there, by its name ``<column>_idx``, is kept) and
  then writes the record. Index commits carry no unit properties: the writer's resume reads them as
  part of the completion (`lance_lightning.write.ledger`).
- The index type is chosen by cardinality: BITMAP when the column has at most `BITMAP_MAX_VALUES`
  distinct values (labels, splits, languages: one bitmap per value), BTREE above (ids, paths,
  timestamps). Lance's documentation recommends BITMAP for low cardinality ("fewer than a few
  thousand unique values"); 1,000 stays well under it.
"""

from __future__ import annotations

from typing import Literal

import lance
import pyarrow as pa
import pyarrow.compute as pc

from lance_lightning.errors import ConfigError

#: Distinct values up to which a column gets a BITMAP index (above: BTREE).
BITMAP_MAX_VALUES = 1000


def _indexable(typ: pa.DataType) -> bool:
    return (
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_boolean(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_temporal(typ)
    )


def check_index_columns(columns: list[str] | None, schema: pa.Schema) -> None:
    """`ConfigError` for a column to index that ``schema`` lacks or that cannot be indexed."""
    able = [f.name for f in schema if _indexable(f.type) and not (f.metadata or {}).get(b"lance-encoding:blob")]
    for column in columns or []:
        if column not in schema.names:
            problem = f"is not a column of this prepare's dataset (its columns: {schema.names})"
        elif column not in able:
            problem = f"is {schema.field(column).type}, which a scalar index (BTREE, BITMAP) cannot index"
        else:
            continue
        raise ConfigError("prepare.index", column, problem, f"index some of {able}, or leave the index out")


def index_name(column: str) -> str:
    return f"{column}_idx"


def build_indexes(dataset: lance.LanceDataset, columns: list[str] | None) -> list[str]:
    """Build the missing indexes; return one description per column ("BITMAP on label (5 values)")."""
    have = {index["name"] for index in dataset.list_indices()}
    built = []
    for column in columns or []:
        values = pc.count_distinct(dataset.to_table(columns=[column])[column], mode="all").as_py()
        kind: Literal["BITMAP", "BTREE"] = "BITMAP" if values <= BITMAP_MAX_VALUES else "BTREE"
        if index_name(column) not in have:
            dataset.create_scalar_index(column, kind, name=index_name(column))
        built.append(f"{kind} on {column} ({values:,} distinct values)")
    return built
