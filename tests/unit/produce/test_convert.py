"""Tests for lance_lightning.produce.convert: Arrow batch → dict of tensors / lists."""

from __future__ import annotations

import warnings

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning.produce.convert import NullValueError, Ragged, UnsupportedColumnError, to_torch_batch

N = 6


def _tensor_type(shape: list[int], permutation: list[int] | None = None) -> pa.DataType:
    return pa.fixed_shape_tensor(pa.float32(), shape, permutation=permutation)


def _fsl(rows: int, size: int, dtype: type = np.float32, start: int = 0) -> pa.Array:
    """fixed_size_list<dtype>[size] holding start, start+1, ... row by row."""
    flat = pa.array(np.arange(start, start + rows * size, dtype=dtype))
    return pa.FixedSizeListArray.from_arrays(flat, size)


def _all_types_table() -> pa.Table:
    """One column of every supported type, N rows, no nulls."""
    ar = np.arange(N)
    nested = pa.array(
        np.arange(N * 6, dtype=np.int16).reshape(N, 3, 2).tolist(),
        pa.list_(pa.list_(pa.int16(), 2), 3),
    )
    ts = pa.array(ar + 1_700_000_000_000_000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.table(
        {
            "i8": pa.array(ar, pa.int8()),
            "i16": pa.array(ar, pa.int16()),
            "i32": pa.array(ar, pa.int32()),
            "i64": pa.array(ar, pa.int64()),
            "u8": pa.array(ar, pa.uint8()),
            "u16": pa.array(ar + 60000, pa.uint16()),
            "u32": pa.array(ar + 4_000_000_000, pa.uint32()),
            "u64": pa.array(ar + 2**62, pa.uint64()),
            "f16": pa.array(ar.astype(np.float16)),
            "f32": pa.array(ar.astype(np.float32)),
            "f64": pa.array(ar.astype(np.float64)),
            "flag": pa.array(ar % 2 == 0),
            "d32": pa.array(ar, pa.int32()).cast(pa.date32()),
            "d64": pa.array(ar * 86_400_000, pa.int64()).cast(pa.date64()),
            "ts": ts,
            "dur": pa.array(ar * 5, pa.int64()).cast(pa.duration("ms")),
            "vec": _fsl(N, 4),
            "nested": nested,
            "img": pa.ExtensionArray.from_storage(_tensor_type([2, 3]), _fsl(N, 6)),
            "s": pa.array([f"row{i}" for i in range(N)]),
            "ls": pa.array([f"L{i}" for i in range(N)], pa.large_string()),
            "sv": pa.array([f"v{i}" for i in range(N)], pa.string_view()),
            "bin": pa.array([bytes([i]) for i in range(N)]),
            "lbin": pa.array([bytes([i, i]) for i in range(N)], pa.large_binary()),
            "bv": pa.array([b"x" * i for i in range(N)], pa.binary_view()),
        }
    )


EXPECTED_DTYPES = {
    "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "u8": torch.uint8, "u16": torch.int32, "u32": torch.int64, "u64": torch.int64,
    "f16": torch.float16, "f32": torch.float32, "f64": torch.float64, "flag": torch.bool,
    "d32": torch.int64, "d64": torch.int64, "ts": torch.int64, "dur": torch.int64,
    "vec": torch.float32, "nested": torch.int16, "img": torch.float32,
}  # fmt: skip


def _check_all_types(table: pa.Table, out: dict) -> None:
    assert list(out) == table.column_names
    ar = np.arange(N)
    for name, dtype in EXPECTED_DTYPES.items():
        assert out[name].dtype == dtype, name
    for name in ("i8", "i16", "i32", "i64", "u8", "f16", "f32", "f64"):
        assert out[name].shape == (N,)
        assert out[name].tolist() == ar.tolist(), name
    assert out["u16"].tolist() == (ar + 60000).tolist()
    assert out["u32"].tolist() == (ar + 4_000_000_000).tolist()
    assert out["u64"].tolist() == (ar + 2**62).tolist()
    assert out["flag"].tolist() == (ar % 2 == 0).tolist()
    assert out["d32"].tolist() == ar.tolist()
    assert out["d64"].tolist() == (ar * 86_400_000).tolist()
    assert out["ts"].tolist() == (ar + 1_700_000_000_000_000).tolist()
    assert out["dur"].tolist() == (ar * 5).tolist()
    assert out["vec"].shape == (N, 4)
    assert torch.equal(out["vec"], torch.arange(N * 4, dtype=torch.float32).reshape(N, 4))
    assert out["nested"].shape == (N, 3, 2)
    assert torch.equal(out["nested"], torch.arange(N * 6, dtype=torch.int16).reshape(N, 3, 2))
    assert out["img"].shape == (N, 2, 3)
    assert torch.equal(out["img"], torch.arange(N * 6, dtype=torch.float32).reshape(N, 2, 3))
    assert out["s"] == [f"row{i}" for i in range(N)]
    assert out["ls"] == [f"L{i}" for i in range(N)]
    assert out["sv"] == [f"v{i}" for i in range(N)]
    assert rows_bytes(out["bin"]) == [bytes([i]) for i in range(N)]
    assert rows_bytes(out["lbin"]) == [bytes([i, i]) for i in range(N)]
    assert rows_bytes(out["bv"]) == [b"x" * i for i in range(N)]
    for name in ("s", "ls", "sv"):
        assert all(type(v) is str for v in out[name])
    for name in ("bin", "lbin", "bv"):
        assert isinstance(out[name], Ragged) and out[name].values.dtype == torch.uint8


def rows_bytes(ragged: Ragged) -> list[bytes]:
    return [ragged.row(i).numpy().tobytes() for i in range(len(ragged))]


def test_binary_column_is_zero_copy_and_respects_slices() -> None:
    """A binary column's bytes are the Arrow data buffer itself; a sliced table keeps its rows."""
    arr = pa.array([b"ab", b"", b"xyz", b"q"] * 100, pa.binary())
    table = pa.table({"b": arr}).slice(101, 3)
    out = to_torch_batch(table)["b"]
    assert rows_bytes(out) == [b"", b"xyz", b"q"]
    assert out.offsets.tolist() == [0, 0, 3, 4]
    data = arr.buffers()[2]
    assert data.address <= out.values.data_ptr() < data.address + data.size


def test_all_types_from_table_and_record_batch() -> None:
    table = _all_types_table()
    _check_all_types(table, to_torch_batch(table))
    _check_all_types(table, to_torch_batch(table.to_batches()[0]))


def test_lance_round_trip_all_types(tmp_path) -> None:
    # Lance 14 stores every supported type, the fixed_shape_tensor extension
    # included; string_view / binary_view come back as string / binary.
    table = _all_types_table()
    path = str(tmp_path / "all_types.lance")
    lance.write_dataset(table, path, max_rows_per_file=4)  # two fragments
    back = lance.dataset(path).to_table()
    assert isinstance(back.schema.field("img").type, pa.FixedShapeTensorType)
    _check_all_types(back, to_torch_batch(back))


def test_no_warnings_and_key_order() -> None:
    table = _all_types_table().select(["s", "f32", "flag", "img", "i8"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = to_torch_batch(table)
    assert list(out) == ["s", "f32", "flag", "img", "i8"]


@pytest.mark.parametrize("typ", [pa.int64(), pa.float32(), pa.uint8(), pa.float16()])
def test_zero_copy_for_single_chunk_without_nulls(typ: pa.DataType) -> None:
    arr = pa.array(np.arange(100).astype(typ.to_pandas_dtype()), typ)
    batch = pa.record_batch({"x": arr})
    tensor = to_torch_batch(batch)["x"]
    assert tensor.data_ptr() == arr.buffers()[1].address
    # Also through a table (combine_chunks of one chunk keeps the buffer).
    assert to_torch_batch(pa.table({"x": arr}))["x"].data_ptr() == arr.buffers()[1].address


def test_zero_copy_keeps_offset_of_sliced_batch() -> None:
    arr = pa.array(np.arange(100, dtype=np.int32))
    sliced = pa.record_batch({"x": arr}).slice(10, 20)
    col = sliced.column(0)
    tensor = to_torch_batch(sliced)["x"]
    assert tensor.data_ptr() == col.buffers()[1].address + col.offset * 4
    assert tensor.tolist() == list(range(10, 30))


def test_zero_copy_fixed_size_list_and_timestamp() -> None:
    vec = _fsl(10, 4)
    ts = pa.array(np.arange(10), pa.timestamp("ns"))
    out = to_torch_batch(pa.record_batch({"vec": vec, "ts": ts}))
    assert out["vec"].data_ptr() == vec.values.buffers()[1].address
    assert out["ts"].data_ptr() == ts.buffers()[1].address


def test_sliced_record_batch_all_types() -> None:
    full = _all_types_table().combine_chunks().to_batches()[0]
    sliced = full.slice(2, 3)
    out = to_torch_batch(sliced)
    assert out["i64"].tolist() == [2, 3, 4]
    assert out["flag"].tolist() == [True, False, True]
    assert out["d32"].tolist() == [2, 3, 4]
    assert out["u16"].tolist() == [60002, 60003, 60004]
    assert torch.equal(out["vec"], torch.arange(8, 20, dtype=torch.float32).reshape(3, 4))
    assert torch.equal(out["nested"], torch.arange(12, 30, dtype=torch.int16).reshape(3, 3, 2))
    assert torch.equal(out["img"], torch.arange(12, 30, dtype=torch.float32).reshape(3, 2, 3))
    assert out["s"] == ["row2", "row3", "row4"]
    assert rows_bytes(out["bv"]) == [b"xx", b"xxx", b"xxxx"]


def test_multi_chunk_table_is_combined() -> None:
    table = pa.concat_tables([pa.table({"x": pa.array(v, pa.int32())}) for v in ([1, 2], [3])])
    assert table.column("x").num_chunks == 2
    assert to_torch_batch(table)["x"].tolist() == [1, 2, 3]


def test_empty_batch() -> None:
    table = _all_types_table().slice(0, 0)
    out = to_torch_batch(table)
    assert out["f32"].shape == (0,)
    assert out["vec"].shape == (0, 4)
    assert out["img"].shape == (0, 2, 3)
    assert out["s"] == []


def test_fixed_shape_tensor_permutation_matches_pyarrow() -> None:
    arr = pa.ExtensionArray.from_storage(_tensor_type([2, 3], permutation=[1, 0]), _fsl(2, 6))
    tensor = to_torch_batch(pa.record_batch({"t": arr}))["t"]
    expected = arr.to_numpy_ndarray()
    assert tensor.shape == expected.shape == (2, 3, 2)
    assert np.array_equal(tensor.numpy(), expected)


@pytest.mark.parametrize(
    "arr",
    [
        pa.array([1, None, 3, None], pa.int64()),
        pa.array([1.0, None, 3.0, None], pa.float32()),
        pa.array(["a", None, "c", None]),
        pa.array([[1.0, 2.0], None, [3.0, 4.0], None], pa.list_(pa.float32(), 2)),
    ],
)
def test_nulls_raise_with_column_count_and_fix(arr: pa.Array) -> None:
    with pytest.raises(NullValueError) as info:
        to_torch_batch(pa.record_batch({"ok": pa.array(range(4)), "score": arr}))
    msg = str(info.value)
    assert "'score'" in msg and "2 null rows" in msg
    assert "fill_nulls={'score': <value>}" in msg
    assert "score IS NOT NULL" in msg


def test_null_inside_fixed_size_list_raises() -> None:
    arr = pa.array([[1.0, None], [3.0, 4.0]], pa.list_(pa.float32(), 2))
    with pytest.raises(NullValueError, match="'emb'"):
        to_torch_batch(pa.record_batch({"emb": arr}))
    nested = pa.array([[[1, 2], None], [[3, 4], [5, 6]]], pa.list_(pa.list_(pa.int8(), 2), 2))
    with pytest.raises(NullValueError, match="'deep'"):
        to_torch_batch(pa.record_batch({"deep": nested}))


def test_fill_nulls() -> None:
    batch = pa.record_batch(
        {
            "x": pa.array([1, None, 3], pa.int64()),
            "f": pa.array([None, 0.5, None], pa.float64()),
            "flag": pa.array([True, None, False]),
            "u": pa.array([None, 7, 8], pa.uint32()),
            "ts": pa.array([None, 5, 6], pa.timestamp("s")),
            "s": pa.array(["a", None, "c"]),
            "sv": pa.array([None, "b", "c"], pa.string_view()),
            "bv": pa.array([b"a", None, b"c"], pa.binary_view()),
            "vec": pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int32(), 2)),
        }
    )
    fills = {"x": -1, "f": 0.0, "flag": False, "u": 0, "ts": 0}
    fills |= {"s": "", "sv": "?", "bv": b"", "vec": [0, 0]}
    out = to_torch_batch(batch, fill_nulls={**fills, "not_a_column": 1})
    assert "not_a_column" not in out
    assert out["x"].tolist() == [1, -1, 3]
    assert out["f"].tolist() == [0.0, 0.5, 0.0]
    assert out["flag"].tolist() == [True, False, False]
    assert out["u"].dtype == torch.int64 and out["u"].tolist() == [0, 7, 8]
    assert out["ts"].tolist() == [0, 5, 6]
    assert out["s"] == ["a", "", "c"]
    assert out["sv"] == ["?", "b", "c"]
    assert rows_bytes(out["bv"]) == [b"a", b"", b"c"]
    assert out["vec"].tolist() == [[1, 2], [0, 0], [5, 6]]


@pytest.mark.parametrize(
    ("arr", "type_text"),
    [
        (pa.array([["a"], ["b", "c"]]), "list<item: string>"),
        (pa.array([{"a": 1}, {"a": 2}]), "struct<a: int64>"),
        (pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())), "map<string, int64>"),
        (pa.array(["a", "b"]).dictionary_encode(), "dictionary<values=string"),
        (pa.array([1, 2], pa.decimal128(5, 2)), "decimal128(5, 2)"),
        (pa.array([["a", "b"]], pa.list_(pa.string(), 2)), "fixed_size_list<item: string>[2]"),
        (pa.array([1, 2], pa.time32("s")), "time32[s]"),
        (pa.nulls(2), "null"),
    ],
)
def test_unsupported_type_names_column_and_type(arr: pa.Array, type_text: str) -> None:
    with pytest.raises(UnsupportedColumnError) as info:
        to_torch_batch(pa.record_batch({"weird": arr}))
    msg = str(info.value)
    assert "'weird'" in msg and type_text in msg
    assert "drop it from `columns`" in msg


def test_uint64_overflow_raises() -> None:
    ok = to_torch_batch(pa.record_batch({"id": pa.array([0, 2**63 - 1], pa.uint64())}))
    assert ok["id"].tolist() == [0, 2**63 - 1]
    with pytest.raises(UnsupportedColumnError, match="'id'.*does not fit in int64"):
        to_torch_batch(pa.record_batch({"id": pa.array([1, 2**63], pa.uint64())}))


def test_errors_are_standard_exception_subclasses() -> None:
    assert issubclass(NullValueError, ValueError)
    assert issubclass(UnsupportedColumnError, TypeError)
