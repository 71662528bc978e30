"""LanceDataModule over real Lance datasets: column types, nulls, plain loops, Trainer.fit,
version pinning, explain() and the fork warning."""

from __future__ import annotations

from collections import Counter

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning import (
    BufferShuffle,
    ConfigError,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    NullValueError,
    RowShuffle,
    ShardShuffle,
)
from lance_lightning.produce.convert import Ragged
from tests.helpers import RecordingModel, append_rows, flat, write_dataset

ROWS = 200


def _typed_uri(tmp_path, rows: int = ROWS) -> str:
    ids = np.arange(rows)
    extra = {
        "i32": pa.array(ids * 3, pa.int32()),
        "f64": pa.array(ids / 4.0, pa.float64()),
        "flag": pa.array(ids % 3 == 0, pa.bool_()),
        "name": pa.array([f"row-{i}" for i in ids], pa.string()),
        "blob": pa.array([bytes([i % 256, 7]) * (1 + i % 3) for i in ids], pa.binary()),
        "maybe": pa.array([None if i % 7 == 0 else int(i) for i in ids], pa.int64()),
        "maybe_s": pa.array([None if i % 5 == 0 else f"s{i}" for i in ids], pa.string()),
    }
    return write_dataset(tmp_path / "typed.lance", rows, extra=extra)


def _read_all(dm: LanceDataModule) -> list[dict]:
    dm.setup("fit")
    return list(dm.train_dataloader())


# ---------------------------------------------------------------------------------------------
# column types


def test_every_column_type_converts(tmp_path):
    uri = _typed_uri(tmp_path)
    columns = ["id", "label", "x", "vec", "i32", "f64", "flag", "name", "blob"]
    dm = LanceDataModule(
        train=LanceSource(uri, columns=columns), batch_size=32, drop_last=False, shuffle=RowShuffle(seed=3)
    )
    batches = _read_all(dm)
    assert [len(b["id"]) for b in batches] == [32] * 6 + [8]
    seen = []
    for batch in batches:
        assert list(batch) == columns
        ids = batch["id"]
        n = len(ids)
        assert ids.dtype == torch.int64 and ids.shape == (n,)
        assert batch["label"].dtype == torch.int64 and torch.equal(batch["label"], ids % 10)
        assert batch["x"].dtype == torch.float32 and torch.allclose(batch["x"], ids.float() / ROWS)
        assert batch["vec"].dtype == torch.float32 and batch["vec"].shape == (n, 8)
        expected_vec = (ids[:, None] * 8 + torch.arange(8)[None, :]).float()
        assert torch.equal(batch["vec"], expected_vec)
        assert batch["i32"].dtype == torch.int32 and torch.equal(batch["i32"].long(), ids * 3)
        assert batch["f64"].dtype == torch.float64 and torch.equal(batch["f64"], ids.double() / 4.0)
        assert batch["flag"].dtype == torch.bool and torch.equal(batch["flag"], ids % 3 == 0)
        assert isinstance(batch["name"], list) and batch["name"] == [f"row-{i}" for i in ids.tolist()]
        blob = batch["blob"]
        assert isinstance(blob, Ragged) and blob.values.dtype == torch.uint8
        assert [blob.row(r).numpy().tobytes() for r in range(n)] == [
            bytes([i % 256, 7]) * (1 + i % 3) for i in ids.tolist()
        ]
        seen += ids.tolist()
    assert sorted(seen) == list(range(ROWS))
    assert seen != list(range(ROWS))  # RowShuffle really shuffled


@pytest.mark.parametrize("column", ["maybe", "maybe_s"])
def test_null_without_fill_names_column_and_fill_nulls(tmp_path, column):
    uri = _typed_uri(tmp_path)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", column]), batch_size=50)
    with pytest.raises(NullValueError) as info:
        _read_all(dm)
    message = str(info.value)
    assert repr(column) in message and "fill_nulls" in message


def test_fill_nulls_fills(tmp_path):
    uri = _typed_uri(tmp_path)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "maybe", "maybe_s"]),
        batch_size=50,
        fill_nulls={"maybe": -1, "maybe_s": "<none>"},
    )
    batches = _read_all(dm)
    ids = torch.cat([b["id"] for b in batches])
    maybe = torch.cat([b["maybe"] for b in batches])
    names = [s for b in batches for s in b["maybe_s"]]
    assert ids.tolist() == list(range(ROWS))
    assert maybe.dtype == torch.int64
    assert maybe.tolist() == [-1 if i % 7 == 0 else i for i in range(ROWS)]
    assert names == ["<none>" if i % 5 == 0 else f"s{i}" for i in range(ROWS)]


# ---------------------------------------------------------------------------------------------
# a plain loop without a Trainer

STRATEGIES = [
    NoShuffle(),
    ShardShuffle(shard_rows=64, seed=1),
    ShardShuffle(shard_rows=50, seed=2, shuffle_within_shard=True),
    RowShuffle(seed=0),
    RowShuffle(seed=5, clump_rows=16),
    BufferShuffle(buffer_rows=256, seed=4, shard_rows=32),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
@pytest.mark.parametrize("filtered", [False, True], ids=["all", "filter"])
def test_plain_loop_reads_every_row_once(tmp_path, strategy, filtered):
    rows = 1000
    uri = write_dataset(tmp_path / "ds.lance", rows, fragment_rows=300)
    source = LanceSource(uri, columns=["id", "x"], filter="label < 5" if filtered else None)
    expected = [i for i in range(rows) if not filtered or i % 10 < 5]
    dm = LanceDataModule(train=source, batch_size=48, shuffle=strategy, drop_last=False)
    dm.setup("fit")
    loader = dm.train_dataloader()
    full, tail = divmod(len(expected), 48)
    assert len(loader) == full + (1 if tail else 0)
    batches = [b["id"].tolist() for b in loader]
    assert len(batches) == len(loader)
    assert [len(b) for b in batches] == [48] * full + ([tail] if tail else [])
    ids = flat(batches)
    assert sorted(ids) == expected  # every matching row exactly once
    if isinstance(strategy, NoShuffle):
        assert ids == expected
    else:
        assert ids != expected


def test_plain_loop_next_iteration_is_next_epoch(dataset_uri):
    """Without a Trainer the loader counts its own epochs; ``set_epoch`` picks one."""
    dm = LanceDataModule(train=LanceSource(dataset_uri, columns=["id"]), batch_size=100, shuffle=RowShuffle(seed=0))
    dm.setup("fit")
    loader = dm.train_dataloader()
    first = flat([b["id"].tolist() for b in loader])
    second = flat([b["id"].tolist() for b in loader])
    assert sorted(first) == sorted(second) == list(range(1000))
    assert second != first, "the second iteration repeated epoch 0's order"
    loader.set_epoch(0)
    assert flat([b["id"].tolist() for b in loader]) == first
    loader.set_epoch(1)
    assert flat([b["id"].tolist() for b in loader]) == second


def test_plain_loop_drop_last_len_matches(dataset_uri):
    dm = LanceDataModule(train=LanceSource(dataset_uri), batch_size=64, shuffle=RowShuffle(seed=1))
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert len(loader) == 1000 // 64
    ids = flat([b["id"].tolist() for b in loader])
    assert len(ids) == len(set(ids)) == (1000 // 64) * 64
    assert set(ids) <= set(range(1000))


# ---------------------------------------------------------------------------------------------
# Trainer.fit


def _fit(dm: LanceDataModule, trainer_kwargs: dict, **overrides) -> RecordingModel:
    model = RecordingModel()
    trainer = pl.Trainer(**{**trainer_kwargs, **overrides})
    trainer.fit(model, datamodule=dm)
    return model


def test_trainer_fit_in_process(small_uri, trainer_kwargs):
    dm = LanceDataModule(
        train=LanceSource(small_uri),
        val=LanceSource(small_uri, filter="label = 0"),
        batch_size=16,
        shuffle=RowShuffle(seed=0),
        drop_last=False,
    )
    model = _fit(dm, trainer_kwargs, max_epochs=2)
    assert len(model.seen) == 2 * 7
    for epoch in (0, 1):
        ids = flat(model.seen[epoch * 7 : (epoch + 1) * 7])
        assert sorted(ids) == list(range(100))
    assert flat(model.seen[:7]) != flat(model.seen[7:])  # a new order each epoch
    assert sorted(flat(model.val_seen[-1:])) == list(range(0, 100, 10))


def test_trainer_fit_max_steps(dataset_uri, trainer_kwargs):
    dm = LanceDataModule(
        train=LanceSource(dataset_uri, columns=["id", "x"]), batch_size=32, shuffle=ShardShuffle(shard_rows=100, seed=0)
    )
    model = _fit(dm, trainer_kwargs, max_steps=5)
    assert len(model.seen) == 5 and all(len(s) == 32 for s in model.seen)
    ids = flat(model.seen)
    assert len(set(ids)) == len(ids)


@pytest.mark.slow
def test_trainer_fit_two_forkserver_workers(small_uri, trainer_kwargs):
    """num_workers=2 with the default context: the ids seen are exactly each epoch's rows, in
    the same order as in-process reading (worker round-robin keeps the planned order)."""
    kwargs = dict(batch_size=8, shuffle=RowShuffle(seed=7), drop_last=False)
    dm = LanceDataModule(train=LanceSource(small_uri, columns=["id", "x"]), num_workers=2, **kwargs)
    assert dm.multiprocessing_context == "forkserver"
    model = _fit(dm, trainer_kwargs, max_epochs=2)
    loader = dm.train_dataloader()
    assert loader.num_workers == 2
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    steps = 13  # ceil(100 / 8)
    assert len(model.seen) == 2 * steps
    for epoch in (0, 1):
        assert sorted(flat(model.seen[epoch * steps : (epoch + 1) * steps])) == list(range(100))

    reference = _fit(
        LanceDataModule(train=LanceSource(small_uri, columns=["id", "x"]), num_workers=0, **kwargs),
        trainer_kwargs,
        max_epochs=2,
    )
    assert model.seen == reference.seen


# ---------------------------------------------------------------------------------------------
# version pinning


def test_version_pinned_at_setup_survives_append(tmp_path, trainer_kwargs):
    uri = write_dataset(tmp_path / "grow.lance", 100)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10, shuffle=RowShuffle(seed=0))
    dm.setup("fit")
    pinned = dm.plans["train"].source.version
    new_version = append_rows(uri, 50)
    assert new_version > pinned

    ids = flat([b["id"].tolist() for b in dm.train_dataloader()])
    assert sorted(ids) == list(range(100))

    model = _fit(dm, trainer_kwargs, max_epochs=1)  # Trainer.fit runs setup('fit') again
    assert dm.plans["train"].source.version == pinned
    assert sorted(flat(model.seen)) == list(range(100))

    fresh = LanceDataModule(train=LanceSource(uri, columns=["id"]), batch_size=10)
    fresh.setup("fit")
    assert fresh.plans["train"].source.version == new_version
    assert sorted(flat([b["id"].tolist() for b in fresh.train_dataloader()])) == list(range(150))

    old = LanceDataModule(train=LanceSource(uri, columns=["id"], version=pinned), batch_size=10)
    old.setup("fit")
    assert len(old.train_dataloader()) == 10


# ---------------------------------------------------------------------------------------------
# explain


def test_explain_mentions_rows_strategy_method_batches(dataset_uri):
    dm = LanceDataModule(
        train=LanceSource(dataset_uri, filter="label = 3"), batch_size=20, shuffle=ShardShuffle(shard_rows=128, seed=0)
    )
    dm.setup("fit")
    text = dm.explain("train")
    assert "rows: 100 of 1,000" in text
    assert "label = 3" in text and "10.00%" in text
    assert "ShardShuffle" in text and "shard_rows=128" in text
    assert "read: scan" in text
    assert "5 per rank" in text and "batch_size 20" in text

    rare = LanceDataModule(
        train=LanceSource(dataset_uri, filter="id < 20"), batch_size=4, shuffle=ShardShuffle(shard_rows=128, seed=0)
    )
    rare.setup("fit")
    assert "read: take" in rare.explain("train") and "rows: 20 of 1,000" in rare.explain("train")

    rows = LanceDataModule(train=LanceSource(dataset_uri), batch_size=64, shuffle=RowShuffle(seed=0))
    text = rows.explain("train")  # plans on demand, without setup
    assert "rows: 1,000 of 1,000" in text and "RowShuffle" in text and "read: take" in text
    assert "15 per rank" in text and "drop_last" in text


# ---------------------------------------------------------------------------------------------
# multiprocessing context


def test_fork_context_is_refused(dataset_uri):
    with pytest.raises(ConfigError, match="fork-safe"):
        LanceDataModule(train=LanceSource(dataset_uri), num_workers=2, multiprocessing_context="fork")


def test_fork_context_without_workers_is_accepted(dataset_uri, recwarn):
    LanceDataModule(train=LanceSource(dataset_uri), num_workers=0, multiprocessing_context="fork")
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning) and "fork" in str(w.message)]


def test_buffer_shuffle_mixes_shards_within_window(dataset_uri):
    """BufferShuffle: each window of buffer_rows holds whole shards, its rows mixed across them."""
    dm = LanceDataModule(
        train=LanceSource(dataset_uri, columns=["id"]),
        batch_size=100,
        shuffle=BufferShuffle(buffer_rows=200, seed=0, shard_rows=50),
    )
    dm.setup("fit")
    ids = flat([b["id"].tolist() for b in dm.train_dataloader()])
    assert Counter(ids) == Counter(range(1000))
    for start in range(0, 1000, 200):
        window = ids[start : start + 200]
        shards = Counter(i // 50 for i in window)
        assert len(shards) == 4 and set(shards.values()) == {50}  # 4 whole shards per window
        first_shard = [i // 50 for i in window[:50]]
        assert len(set(first_shard)) > 1  # rows of different shards interleave


def test_relative_uri_after_chdir_reads_the_dataset_it_names(tmp_path, monkeypatch) -> None:
    """Two datasets at the same relative path and version: each module reads its own."""
    for name, rows in (("a", 30), ("b", 80)):
        lance.write_dataset(pa.table({"id": list(range(rows))}), str(tmp_path / name / "ds.lance"))
    for name, rows in (("a", 30), ("b", 80)):
        monkeypatch.chdir(tmp_path / name)
        dm = LanceDataModule(train=LanceSource("ds.lance"), batch_size=10)
        dm.setup("fit")
        assert dm.plans["train"].matched_rows == rows
        assert sum(len(batch["id"]) for batch in dm.train_dataloader()) == rows


def test_module_without_val_is_freed_without_the_cyclic_gc(small_uri: str) -> None:
    """No reference cycle: a module (and its loaders, whose workers shut down in ``__del__``) is freed
    as soon as the last reference goes, not at some later cyclic collection."""
    import gc
    import weakref

    dm = LanceDataModule(train=LanceSource(small_uri, columns=["id"]), batch_size=10)
    dm.setup("fit")
    freed = weakref.ref(dm.train_dataloader())
    gc.disable()
    try:
        del dm
        assert freed() is None
    finally:
        gc.enable()
