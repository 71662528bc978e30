"""Variable-length token columns (Ragged) and TokenWindows packing, checked against a plain
Python reference and through a real Lance dataset and LanceDataModule."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning import LanceDataModule, LanceSource, ShardShuffle
from lance_lightning.errors import ConfigError
from lance_lightning.produce.convert import Ragged, to_torch_batch
from lance_lightning.transforms import TokenWindows
from tests.helpers import write_dataset


def documents(rows: int, seed: int = 0) -> list[list[int]]:
    """Row ``i``: 0..40 tokens, values ``1000*i + j`` (so a token names its document)."""
    rng = np.random.default_rng(seed)
    return [[1000 * i + j for j in range(int(rng.integers(0, 41)))] for i in range(rows)]


def reference(
    docs: list[list[int]],
    window: int,
    stride: int,
    eos: int | None,
    labels: bool,
    windows: int | None = None,
    pad: int = 0,
    ignore: int = -100,
) -> dict[str, list]:
    """TokenWindows, written the slow obvious way."""
    stream: list[int] = []
    for doc in docs:
        stream += doc + ([eos] if eos is not None else [])
    span = window + (1 if labels else 0)
    count = windows if windows is not None else max(0, (len(stream) - span) // stride + 1)
    out: dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": []}
    for w in range(count):
        piece = stream[w * stride : w * stride + span]
        valid = [True] * len(piece) + [False] * (span - len(piece))
        piece = piece + [pad] * (span - len(piece))
        out["input_ids"].append(piece[:window])
        out["attention_mask"].append(valid[:window])
        out["labels"].append([t if ok else ignore for t, ok in zip(piece[1:], valid[1:])])
    return out


def ragged(docs: list[list[int]], typ: pa.DataType = pa.list_(pa.int32())) -> Ragged:
    return to_torch_batch(pa.table({"tokens": pa.array(docs, typ)}))["tokens"]


# -- Ragged from Arrow --------------------------------------------------------------------------------
@pytest.mark.parametrize("typ", [pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint16())])
def test_ragged_rows_equal_the_lists(typ: pa.DataType) -> None:
    docs = documents(30)
    table = pa.table({"tokens": pa.array(docs, typ)})
    for sliced, expected in ((table, docs), (table.slice(7, 11), docs[7:18])):
        r = to_torch_batch(sliced)["tokens"]
        assert isinstance(r, Ragged) and len(r) == len(expected)
        assert r.offsets.dtype == torch.int64 and int(r.offsets[0]) == 0
        assert [r.row(i).tolist() for i in range(len(r))] == expected
        assert r.lengths().tolist() == [len(d) for d in expected]


def test_ragged_values_share_the_arrow_buffer() -> None:
    array = pa.array(documents(10), pa.list_(pa.int64()))
    r = to_torch_batch(pa.table({"tokens": array}))["tokens"]
    assert r.values.data_ptr() == array.values.buffers()[1].address
    back = pickle.loads(pickle.dumps(r))
    assert torch.equal(back.values, r.values) and torch.equal(back.offsets, r.offsets)
    assert torch.equal(r.to("cpu").values, r.values)


def test_null_lists_need_fill_nulls() -> None:
    from lance_lightning.produce.convert import NullValueError

    table = pa.table({"tokens": pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))})
    with pytest.raises(NullValueError, match="'tokens'"):
        to_torch_batch(table)
    r = to_torch_batch(table, {"tokens": []})["tokens"]
    assert r.lengths().tolist() == [2, 0, 1]


# -- TokenWindows against the reference -----------------------------------------------------------------
CASES = [
    dict(window=8, stride=None, eos=None, labels=True),
    dict(window=8, stride=None, eos=-1, labels=True),
    dict(window=5, stride=3, eos=7, labels=False),
    dict(window=16, stride=4, eos=None, labels=True),
    dict(window=8, stride=None, eos=-1, labels=True, windows=12),  # more windows than tokens: padding
    dict(window=8, stride=None, eos=None, labels=False, windows=2),  # fewer: the rest is dropped
    dict(window=200, stride=None, eos=None, labels=True),  # no whole window: N = 0
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_windows_equal_reference(case: dict[str, Any]) -> None:
    docs = documents(6, seed=1)
    windows = case.get("windows")
    transform = TokenWindows(
        window=case["window"], stride=case["stride"], eos_id=case["eos"], labels=case["labels"], windows=windows
    )
    label = torch.arange(6)
    out = transform({"tokens": ragged(docs), "label": label})
    want = reference(docs, case["window"], case["stride"] or case["window"], case["eos"], case["labels"], windows)
    assert out["input_ids"].dtype == torch.int64
    assert out["input_ids"].shape == (len(want["input_ids"]), case["window"])
    assert out["input_ids"].tolist() == want["input_ids"]
    assert ("labels" in out) == case["labels"]
    if case["labels"]:
        assert out["labels"].tolist() == want["labels"]
    assert ("attention_mask" in out) == (windows is not None)
    if windows is not None:
        assert out["attention_mask"].tolist() == want["attention_mask"]
    assert "tokens" not in out and out["label"] is label  # other columns pass through
    total = sum(len(d) for d in docs) + (len(docs) if case["eos"] is not None else 0)
    assert transform.count(total) == len(want["input_ids"])


def test_fixed_size_list_tokens_are_documents_of_equal_length() -> None:
    tokens = torch.arange(4 * 6).view(4, 6)
    out = TokenWindows(column="t", window=4, eos_id=99)({"t": tokens})
    want = reference(tokens.tolist(), 4, 4, 99, True)
    assert out["input_ids"].tolist() == want["input_ids"] and out["labels"].tolist() == want["labels"]


def test_bad_inputs_and_config() -> None:
    with pytest.raises(ValueError, match="not token ids"):
        TokenWindows(column="t", window=2)({"t": ["a", "b"]})
    with pytest.raises(ValueError, match="not integer token ids"):
        TokenWindows(column="t", window=2)({"t": ragged([[1.5]], pa.list_(pa.float32()))})
    with pytest.raises(ValueError, match="not in the batch"):
        TokenWindows(column="t", window=2)({"x": torch.zeros(2)})
    for kwargs in (
        {"window": 0},
        {"stride": -1},
        {"windows": 0},
        {"eos_id": 1.5},
        {"dtype": "float32"},
        {"column": ""},
    ):
        with pytest.raises(ConfigError):
            TokenWindows(**kwargs)


# -- through Lance and the data module ----------------------------------------------------------------
def test_token_windows_through_the_data_module(tmp_path: Path) -> None:
    docs = documents(240, seed=2)
    uri = write_dataset(
        tmp_path / "tok.lance", 240, fragment_rows=80, extra={"tokens": pa.array(docs, pa.list_(pa.int32()))}
    )
    transform = TokenWindows(window=16, eos_id=-1, windows=20)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "tokens"]),
        batch_size=24,
        shuffle=ShardShuffle(shard_rows=48, seed=1),
        transform=transform,
        reader_threads=2,
    )
    loader = dm.train_dataloader()
    batches = list(loader)
    assert len(batches) == 10
    for batch in batches:
        ids = batch["id"].tolist()
        want = reference([docs[i] for i in ids], 16, 16, -1, True, windows=20)
        assert batch["input_ids"].shape == (20, 16)  # fixed shape, every batch
        assert batch["input_ids"].tolist() == want["input_ids"]
        assert batch["labels"].tolist() == want["labels"]
