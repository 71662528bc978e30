"""WebDataset members typed as WebDataset's own decoders read them (``webdataset.autodecode``).

Guarantees:
- An extension's column type is decided from every member of that extension in every shard, at
  survey time, so every unit (thread, process, Ray task, rerun) writes the same type. The rule
  looks at the extension's last part (``seg.cls`` is a ``cls``):
  - ``cls``, ``cls2``, ``class``, ``count``, ``index``, ``inx``: int64, each member ``int(bytes)``
    (surrounding whitespace allowed, as Python's ``int`` allows);
  - ``txt``, ``text``, ``transcript``: string, each member decoded as UTF-8;
  - ``json``, ``jsn``: a struct when every member is a JSON object with the same keys and each
    reads back from the struct (pyarrow's inferred field types) equal to its parsed JSON, else a
    string column holding each member's text.
  - any other extension: binary, the member's bytes (as before).
- Nothing is lost or guessed: if one member does not fit its extension's type (not an integer, out
  of int64's range, not UTF-8, not JSON), the whole column stays binary (the members' bytes) and the
  survey adds a note naming the column, the first such member and why; the report prints it.
  (WebDataset itself would give ``None`` for such a ``cls``: prepare keeps the bytes instead.)
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
_INT64 = (-(1 << 63), (1 << 63) - 1)


def kind(extension: str) -> str:
    """``int``, ``text``, ``json`` or ``bytes``: how WebDataset decodes the extension's members."""
    last = extension.rsplit(".", 1)[-1].lower()
    if last in INT_EXTENSIONS:
        return "int"
    if last in TEXT_EXTENSIONS:
        return "text"
    if last in JSON_EXTENSIONS:
        return "json"
    return "bytes"


class ColumnTyper:
    """Watches one typed extension's members during the survey and decides its Arrow type."""

    def __init__(self, extension: str) -> None:
        self.extension = extension
        self.kind = kind(extension)
        self.problem: str | None = None  # the first member that does not fit, and why
        self._keys: tuple[str, ...] | None = None
        self._objects = True
        self._examples: dict[pa.DataType, dict[str, Any]] = {}  # one object per inferred type
        self._big_int = False  # an integer a double cannot hold exactly (if unified with floats)

    def see(self, where: str, data: bytes) -> None:
        """Check one member (``where`` names it: shard:key.ext)."""
        if self.problem is not None:
            return
        try:
            value = decode(self.kind, data)
        except (ValueError, UnicodeDecodeError) as error:
            self.problem = f"{where} is {data[:40]!r}: {error}"
            return
        if self.kind == "json" and self._objects:
            if not isinstance(value, dict) or (self._keys is not None and set(value) != set(self._keys)):
                self._objects = False
            else:
                self._keys = self._keys or tuple(value)
                self._merge(value)

    def _merge(self, value: dict[str, Any]) -> None:
        try:
            array = pa.array([value])
            if array.to_pylist()[0] != value:  # e.g. a list of objects with other keys: nulls added
                self._objects = False
                return
            self._examples.setdefault(array.type, value)
            self._big_int = self._big_int or _has_big_int(value)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            self._objects = False

    def _struct(self) -> pa.DataType | None:
        """The struct type of all objects seen (pyarrow's inference over one object of each
        inferred type: an int field in one and a float in another is a double), or None."""
        if not (self._objects and self._keys and self._examples):
            return None
        try:
            examples = list(self._examples.values())
            array = pa.array(examples)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            return None
        if not pa.types.is_struct(array.type) or array.to_pylist() != examples:
            return None  # an object would not read back as itself (nested keys that differ)
        if self._big_int and len(self._examples) > 1:
            return None  # its types were unified: an integer past 2**53 might become a rounded double
        return array.type

    def arrow_type(self) -> pa.DataType:
        """The column's type (binary when a member did not fit)."""
        if self.problem is not None or self.kind == "bytes":
            return pa.large_binary()
        if self.kind == "int":
            return pa.int64()
        if self.kind == "text":
            return pa.large_string()
        return self._struct() or pa.large_string()

    def note(self, column: str) -> str | None:
        """The report line for a column that stays binary, or None."""
        if self.problem is None:
            return None
        wanted = {"int": "integers", "text": "UTF-8 text", "json": "JSON"}[self.kind]
        return f"column `{column}` kept as bytes, not {wanted}: {self.problem}"


def _has_big_int(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_big_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_big_int(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 53


def decode(kind_: str, data: bytes) -> Any:
    """A member's value as WebDataset's decoder gives it (``ValueError``/``UnicodeDecodeError`` if it does not fit)."""
    if kind_ == "int":
        value = int(data)
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError("outside int64's range")
        return value
    if kind_ == "text":
        return data.decode("utf-8")
    if kind_ == "json":
        return json.loads(data)
    return data


def cell(kind_: str, arrow_type: pa.DataType, data: bytes) -> Any:
    """The value a member stores in a column of ``arrow_type`` (decided by `ColumnTyper`)."""
    if pa.types.is_large_binary(arrow_type):
        return data
    if kind_ == "json" and not pa.types.is_struct(arrow_type):
        return data.decode("utf-8")
    return decode(kind_, data)
