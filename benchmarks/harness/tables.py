"""The one way the harness and its studies write a result table: `table` turns the column heads, each
column's alignment and value format, and rows of values into markdown lines.

Guarantees:
- ``heads`` is the table's head as it reads (``"rows/s | vs best peer | ..."``); ``specs`` holds
  one Python format spec a column, separated by spaces (so a spec holds no space). A spec's first
  character, when it is ``<`` (left, also the default), ``>`` (right) or ``^`` (centre), aligns
  the column as well (``---``, ``---:``, ``:---:``): ``>,.0f`` is a right-aligned column of
  ``12,345``. Heads and specs of different counts are refused (ValueError).
- A value is written by `cell`: a ``str`` as it is (a label, or a figure already put together),
  None and NaN as ``missing`` ("—" unless the table says otherwise), anything else as
  ``format(value, spec)``.
- A row of a length other than the columns' is refused (ValueError), never written shifted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

_RULE = {"<": "---", ">": "---:", "^": ":---:"}


def cell(value: Any, spec: str = "", missing: str = "—") -> str:
    """One value as a table writes it: a string as it is, None and NaN as ``missing``."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def table(heads: str, specs: str, rows: Iterable[Sequence[Any]], missing: str = "—") -> list[str]:
    """The markdown lines of a table: its head, its alignment rule, then one line a row."""
    names, formats = heads.split(" | "), specs.split()
    if len(names) != len(formats):
        raise ValueError(f"{len(names)} heads and {len(formats)} specs: {heads!r}, {specs!r}")
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(_RULE.get(f[:1], "---") for f in formats) + "|"]
    for row in rows:
        if len(row) != len(names):
            raise ValueError(f"a row of {len(row)} values for {len(names)} columns: {row!r}")
        lines.append("| " + " | ".join(cell(v, f, missing) for v, f in zip(row, formats)) + " |")
    return lines
