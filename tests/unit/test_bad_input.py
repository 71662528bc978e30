"""Bad input fails early, in the main process, with a `ConfigError` that names the parameter,
shows the bad value and says how to fix it; a cursor from another plan is refused by field."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from lance_lightning import (
    BufferShuffle,
    ConfigError,
    CursorMismatchError,
    FilterRead,
    LanceDataModule,
    LanceSource,
    RowShuffle,
    ShardShuffle,
)
from lance_lightning.plan.planner import check_fits
from lance_lightning.source import pin_source
from tests.helpers import RecordingModel, append_rows, plan_of, write_dataset


def _check(error: pytest.ExceptionInfo, param: str, value_text: str) -> str:
    message = str(error.value)
    assert f"`{param}`" in message, message
    assert value_text in message, message
    assert "Fix:" in message, message
    assert error.value.param == param
    return message


def _setup_error(source: LanceSource, stage: str = "fit", **kwargs) -> pytest.ExceptionInfo:
    dm = LanceDataModule(train=source, **kwargs)
    with pytest.raises(ConfigError) as info:
        dm.setup(stage)
    return info


# ---------------------------------------------------------------------------------------------
# sources


def test_uri_that_does_not_exist(tmp_path):
    uri = str(tmp_path / "missing.lance")
    info = _setup_error(LanceSource(uri))
    message = _check(info, "train.uri", repr(uri))
    assert "no Lance dataset exists there" in message


def test_column_that_is_not_there(dataset_uri):
    info = _setup_error(LanceSource(dataset_uri, columns=["id", "lable"]))
    message = _check(info, "train.columns", "'lable'")
    assert "['lable']" in message and "'label'" in message  # names the missing and the existing columns


def test_filter_that_does_not_parse(dataset_uri):
    bad = "label = = 3"
    info = _setup_error(LanceSource(dataset_uri, filter=bad))
    _check(info, "train.filter", repr(bad))


def test_filter_on_missing_column(dataset_uri):
    bad = "lable > 3"
    info = _setup_error(LanceSource(dataset_uri, filter=bad))
    message = _check(info, "train.filter", repr(bad))
    assert "label" in message  # the fix lists the real columns


@pytest.mark.parametrize("bad", ["id / 0 > 1", "CAST(CAST(id AS string) || 'x' AS int) > 3"])
def test_filter_that_fails_only_when_evaluated(dataset_uri, bad):
    """Pinning plans the filter without reading (it passes); the survey that evaluates it raises the
    same error, in the main process, at setup."""
    pin_source(LanceSource(dataset_uri, filter=bad), "train")  # planned: no data read, no error
    message = _check(_setup_error(LanceSource(dataset_uri, filter=bad)), "train.filter", repr(bad))
    assert "Lance cannot run this filter" in message and "'label'" in message, message


def test_filter_that_fails_only_when_evaluated_stops_fit_before_training(trainer_kwargs, dataset_uri):
    dm = LanceDataModule(train=LanceSource(dataset_uri, filter="id / 0 > 1"), batch_size=10)
    model = RecordingModel()
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs)
    with pytest.raises(ConfigError, match="train.filter"):
        trainer.fit(model, datamodule=dm)
    assert model.seen == []


def test_filter_matching_no_rows(dataset_uri):
    bad = "label > 100"
    info = _setup_error(LanceSource(dataset_uri, filter=bad))
    message = _check(info, "train.filter", repr(bad))
    assert "matches no rows" in message


def test_version_that_does_not_exist(dataset_uri):
    append_rows(dataset_uri, 10)  # versions 1 and 2 exist
    info = _setup_error(LanceSource(dataset_uri, version=7))
    message = _check(info, "train.version", "=7")
    assert "[1, 2]" in message


def test_val_source_errors_name_the_split(dataset_uri, tmp_path):
    dm = LanceDataModule(train=LanceSource(dataset_uri), val=LanceSource(str(tmp_path / "nope.lance")))
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    _check(info, "val.uri", "nope.lance")


# ---------------------------------------------------------------------------------------------
# splits and sizes


def test_test_split_not_configured(dataset_uri):
    info = _setup_error(LanceSource(dataset_uri), stage="test")
    message = _check(info, "test", "None")
    assert "data.test" in message


def test_trainer_validate_without_val(dataset_uri, trainer_kwargs):
    dm = LanceDataModule(train=LanceSource(dataset_uri), batch_size=10)
    trainer = pl.Trainer(**trainer_kwargs)
    with pytest.raises(ConfigError) as info:
        trainer.validate(RecordingModel(), datamodule=dm)
    message = _check(info, "val", "None")
    assert "data.val" in message


def test_batch_size_larger_than_split(small_uri):
    info = _setup_error(LanceSource(small_uri, filter="label = 1"), batch_size=64)
    message = _check(info, "batch_size", "=64")
    assert "10 row(s)" in message and "drop_last=False" in message


def test_batch_size_larger_than_split_is_fine_without_drop_last(small_uri):
    dm = LanceDataModule(train=LanceSource(small_uri, filter="label = 1"), batch_size=64, drop_last=False)
    dm.setup("fit")
    assert [len(b["id"]) for b in dm.train_dataloader()] == [10]


def test_world_size_larger_than_rows(small_uri):
    pinned = pin_source(LanceSource(small_uri, filter="id < 3"), "train")
    with pytest.raises(ConfigError) as info:
        check_fits(plan_of("train", pinned, RowShuffle(seed=0), FilterRead(), 1, False), 4)
    message = _check(info, "world_size", "=4")
    assert "3 row(s)" in message
    check_fits(plan_of("train", pinned, RowShuffle(seed=0), FilterRead(), 1, False), 3)  # fits


def test_world_size_times_batch_larger_than_rows(small_uri):
    pinned = pin_source(LanceSource(small_uri), "train")
    with pytest.raises(ConfigError) as info:
        check_fits(plan_of("train", pinned, None, None, 30, True), 4)
    _check(info, "batch_size", "=30")


# ---------------------------------------------------------------------------------------------
# data module and strategy arguments (raised at construction)


@pytest.mark.parametrize(
    ("kwargs", "param", "value_text"),
    [
        ({"num_workers": -1}, "num_workers", "=-1"),
        ({"batch_size": 0}, "batch_size", "=0"),
        ({"reader_threads": -2}, "reader_threads", "=-2"),
        ({"device_ahead": -1}, "device_ahead", "=-1"),
        ({"prefetch_factor": 0}, "prefetch_factor", "=0"),
        ({"multiprocessing_context": "threads"}, "multiprocessing_context", "'threads'"),
    ],
)
def test_bad_datamodule_arguments(dataset_uri, kwargs, param, value_text):
    with pytest.raises(ConfigError) as info:
        LanceDataModule(train=LanceSource(dataset_uri), **kwargs)
    _check(info, param, value_text)


def test_source_that_is_not_a_lance_source(dataset_uri):
    with pytest.raises(ConfigError) as info:
        LanceDataModule(train=dataset_uri)
    _check(info, "train", repr(dataset_uri))


def test_fill_nulls_names_column_not_read(dataset_uri):
    info = _setup_error(LanceSource(dataset_uri, columns=["id", "x"]), fill_nulls={"label": 0})
    message = _check(info, "fill_nulls", "{'label': 0}")
    assert "['label']" in message and "['id', 'x']" in message


def test_buffer_shuffle_shard_larger_than_buffer():
    with pytest.raises(ConfigError) as info:
        BufferShuffle(buffer_rows=100, shard_rows=500)
    message = _check(info, "shard_rows", "=500")
    assert "buffer_rows=100" in message


@pytest.mark.parametrize(
    ("make", "param", "value_text"),
    [
        (lambda: RowShuffle(clump_rows=0), "clump_rows", "=0"),
        (lambda: RowShuffle(seed=-1), "seed", "=-1"),
        (lambda: ShardShuffle(shard_rows=0), "shard_rows", "=0"),
        (lambda: BufferShuffle(buffer_rows=0), "buffer_rows", "=0"),
        (lambda: FilterRead(method="index"), "method", "'index'"),
        (lambda: FilterRead(take_below=1.5), "take_below", "=1.5"),
    ],
)
def test_bad_strategy_arguments(make, param, value_text):
    with pytest.raises(ConfigError) as info:
        make()
    _check(info, param, value_text)


# ---------------------------------------------------------------------------------------------
# a checkpointed cursor from another plan


def _state_after(dm: LanceDataModule, batches: int = 3) -> dict:
    dm.setup("fit")
    iterator = iter(dm.train_dataloader())
    for _ in range(batches):
        next(iterator)
    state = dm.state_dict()
    assert state["train_cursor"]["steps"] == batches
    return state


def _dm(uri: str, **kwargs) -> LanceDataModule:
    source = dict(uri=uri, columns=["id", "x"], filter=kwargs.pop("filter", "label < 8"))
    return LanceDataModule(train=LanceSource(**source), batch_size=10, **kwargs)


@pytest.mark.parametrize(
    ("change", "field", "saved", "current"),
    [
        ({"shuffle": RowShuffle(seed=1)}, "plan.shuffle", "'seed': 0", "'seed': 1"),
        ({"shuffle": ShardShuffle(seed=0)}, "plan.shuffle", "'RowShuffle'", "'ShardShuffle'"),
        ({"filter": "label < 9"}, "plan.filter", "'label < 8'", "'label < 9'"),
    ],
)
def test_cursor_from_another_plan_is_refused(dataset_uri, change, field, saved, current):
    state = _state_after(_dm(dataset_uri, shuffle=RowShuffle(seed=0)))
    other = _dm(dataset_uri, **{"shuffle": RowShuffle(seed=0), **change})
    with pytest.raises(CursorMismatchError) as info:
        other.load_state_dict(state)
    message = str(info.value)
    assert info.value.field == field
    assert f"`{field}`" in message and saved in message and current in message
    assert "resume_data=False" in message


@pytest.mark.parametrize("old", [1, 2, 3, 4])
def test_cursor_of_an_older_format_is_refused(dataset_uri, old):
    # Older cursors count rows of epoch orders that later formats changed (2: the short shard last;
    # 3: every permutation a keyed bijection; 4: mixture draws; 5: trainer epoch e reads data epoch e).
    state = _state_after(_dm(dataset_uri, shuffle=RowShuffle(seed=0)))
    state["train_cursor"] = {**state["train_cursor"], "format": old}
    with pytest.raises(CursorMismatchError) as info:
        _dm(dataset_uri, shuffle=RowShuffle(seed=0)).load_state_dict(state)
    assert info.value.field == "format"
    message = str(info.value)
    assert f"the checkpoint has {old}, the current plan has 5" in message
    assert "another lance-lightning version" in message and "needs that version" in message
    assert "resume_data=False" in message and "Restore the original setting" not in message


def test_cursor_from_another_dataset_is_refused(dataset_uri, tmp_path):
    state = _state_after(_dm(dataset_uri, shuffle=RowShuffle(seed=0)))
    other_uri = write_dataset(tmp_path / "other.lance", 1000)
    other = _dm(other_uri, shuffle=RowShuffle(seed=0))
    with pytest.raises(CursorMismatchError) as info:
        other.load_state_dict(state)
    message = str(info.value)
    assert info.value.field == "plan.uri"
    assert repr(dataset_uri) in message and repr(other_uri) in message


def test_cursor_mismatch_is_ignored_with_resume_data_false(dataset_uri):
    state = _state_after(_dm(dataset_uri, shuffle=RowShuffle(seed=0)))
    other = _dm(dataset_uri, shuffle=RowShuffle(seed=1), resume_data=False)
    other.load_state_dict(state)  # no error: the data epoch starts fresh on purpose
    other.setup("fit")
    assert len(list(other.train_dataloader())) == 80


def test_corrupt_image_with_the_default_policy_names_row_and_column(tmp_path) -> None:
    """No ``bad_rows`` given: the default (a lazy ``RaiseOnBadRow``) raises `BadRowError`."""
    from lance_lightning.produce.badrows import BadRowError
    from lance_lightning.transforms import DecodeImage
    from tests.images import write_image_dataset

    uri = write_image_dataset(tmp_path / "img.lance", 40, bad=(13,), fragment_rows=64)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "image"]), batch_size=8, transform=DecodeImage(size=8, normalize=False)
    )
    dm.setup("fit")
    with pytest.raises(BadRowError, match=r"dataset row 13 \(id=13\).*column 'image'"):
        for _ in dm.train_dataloader():
            pass
