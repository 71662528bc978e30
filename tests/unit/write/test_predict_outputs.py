"""`OutputColumns`: each kind of ``predict_step`` output as its Arrow column, and the checks that
refuse what cannot be a column (no Lightning, no dataset)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from lance_lightning import ConfigError, Ragged
from lance_lightning.write.predict_outputs import OutputColumns, read_types, types_json


@pytest.mark.parametrize(
    ("output", "kind", "first"),
    [
        (torch.arange(6, dtype=torch.float16).reshape(3, 2), pa.list_(pa.float16(), 2), [0.0, 1.0]),
        (torch.arange(6, dtype=torch.float32).reshape(3, 2), pa.list_(pa.float32(), 2), [0.0, 1.0]),
        (torch.tensor([1, 2, 3]), pa.int64(), 1),
        (torch.tensor([True, False, True]), pa.bool_(), True),
        (["a", "bb", "c"], pa.string(), "a"),
        ([torch.tensor([1.0]), torch.tensor([]), torch.tensor([2.0, 3.0])], pa.large_list(pa.float32()), [1.0]),
        (Ragged(torch.tensor([5, 6, 7]), torch.tensor([0, 0, 2, 3])), pa.large_list(pa.int64()), []),
    ],
)
def test_each_output_kind_is_one_column(output: object, kind: pa.DataType, first: object) -> None:
    columns = OutputColumns(["p"]).convert(output, 3, batch_idx=0)
    assert columns["p"].type == kind and len(columns["p"]) == 3 and columns["p"][0].as_py() == first


def test_a_dict_is_several_columns_and_types_round_trip() -> None:
    outputs = OutputColumns(["emb", "label"])
    columns = outputs.convert({"emb": torch.zeros(2, 4), "label": ["x", "y"]}, 2, batch_idx=0)
    assert list(columns) == ["emb", "label"]
    assert read_types(types_json(outputs.types)) == outputs.types
    again = OutputColumns(["emb", "label"], read_types(types_json(outputs.types)))
    with pytest.raises(ConfigError, match="batch 5 gives column 'emb' the type"):
        again.convert({"emb": torch.zeros(2, 5), "label": ["x", "y"]}, 2, batch_idx=5)


@pytest.mark.parametrize(
    ("names", "output", "message"),
    [
        (["a", "b"], torch.zeros(2), "returned one value, the writer writes 2 columns"),
        (["a"], {"b": torch.zeros(2)}, r"returned the keys \['b'\]"),
        (["a"], torch.zeros(2, 2, 2), "returned a 3-D tensor"),
        (["a"], [1, 2], "returned a list"),
        (["a"], torch.zeros(3), "has 2 rows but its output for column 'a' has 3"),
        (["a"], torch.zeros(2, dtype=torch.complex64), "complex64"),
    ],
)
def test_what_cannot_be_a_column_is_refused(names: list[str], output: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OutputColumns(names).convert(output, 2, batch_idx=0)
