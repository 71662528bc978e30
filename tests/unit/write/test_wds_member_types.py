"""WebDataset member typing (`lance_lightning.write.wds_types`), as an invariant: whatever the
members, the column type decided from all of them stores each member so that it reads back as
WebDataset decodes it (a struct or int/string), or as the member's own text/bytes (the fallback)."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lance_lightning.write.wds_types import ColumnTyper, cell

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
_json = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xyz"), inner, max_size=3),
    max_leaves=8,
)
_objects = st.dictionaries(st.sampled_from("abc"), _json, max_size=3)


def _column(extension: str, members: list[bytes]) -> tuple[pa.DataType, list]:
    typer = ColumnTyper(extension)
    for n, data in enumerate(members):
        typer.see(f"s.tar:k{n}.{extension}", data)
    typ = typer.arrow_type()
    return typ, pa.array([cell(typer.kind, typ, data) for data in members], type=typ).to_pylist()


@settings(max_examples=300, deadline=None)
@given(st.lists(_objects | _json, min_size=1, max_size=6))
@example([{"a": {"x": 1}}, {"a": {"y": 2}}])  # nested keys that differ: nulls would be added
@example([{"a": [{"x": 1}, {"y": 2}]}])  # a list of objects with other keys
@example([{"a": 0.5}, {"a": 1}, {"a": (1 << 60) + 1}])  # unified to double: the big int rounded
def test_json_members_read_back_as_parsed_or_as_their_text(values: list) -> None:
    members = [json.dumps(v).encode() for v in values]
    typ, got = _column("json", members)
    if pa.types.is_struct(typ):
        assert got == [json.loads(m) for m in members]
        assert all(isinstance(v, dict) for v in values)
    else:
        assert typ == pa.large_string() and got == [m.decode() for m in members]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(1 << 70), 1 << 70).map(lambda i: str(i).encode()) | st.binary(max_size=6), min_size=1))
def test_cls_members_are_int64_exactly_when_every_one_parses(members: list[bytes]) -> None:
    def parses(data: bytes) -> bool:
        try:
            return -(1 << 63) <= int(data) < 1 << 63
        except ValueError:
            return False

    typ, got = _column("cls", members)
    if all(parses(m) for m in members):
        assert typ == pa.int64() and got == [int(m) for m in members]
    else:
        assert typ == pa.large_binary() and got == members
