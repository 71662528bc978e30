"""A resume restores the saved cursor only onto the same plan, and the cursor is small.

What the tests establish:
- a changed filter, seed, strategy, source, columns or version is refused before training with a
  `CursorMismatchError` naming the field; so is another dataset written at the checkpoint's path;
- a version written after the checkpoint is ignored: the resume reads the pinned version, and plans
  the train split once, at that version; a deleted pinned version is reported (`ConfigError`);
- the saved cursor holds plain values only (it loads with ``weights_only=True``) and its size does
  not grow with the dataset.

The tests train with a real Trainer on a real Lance dataset (the `uri` fixture of
tests/scenarios/conftest.py: 300 rows in 3 fragments) and restore from a real checkpoint file.
Run A trains to step k (``max_steps=k``) and saves ``step=k.ckpt`` with
``ModelCheckpoint(every_n_train_steps=k)``; run B resumes from it; run C trains uninterrupted.
Exact means: A's first k batches followed by B's batches equal C's batches, same ids, same order.
"""

from __future__ import annotations

import pickle
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pytest
import torch

from lance_lightning import ConfigError, CursorMismatchError, LanceDataModule, LanceSource
from lance_lightning.cursor.position import STATE_KEYS
from tests.harness import (
    BATCH,
    DM_KEY,
    FILTER,
    ROWS,
    assert_epoch_once,
    assert_exact,
    ckpt_file,
    epoch_batches,
    fit,
    make_dm,
)
from tests.helpers import RecordingModel, append_rows, assert_one_saved_cursor, flat, write_dataset


# -- 1. strict restore ------------------------------------------------------------------------------
def _checkpoint_at(tmp_path: Path, dm: LanceDataModule, k: int = 5, **kwargs: Any) -> Path:
    fit(tmp_path, dm, name="A", ckpt_every=k, max_steps=k, **kwargs)
    return ckpt_file(tmp_path, "A", k)


@pytest.mark.parametrize(
    ("change", "field", "saved", "current"),
    [
        ("filter", "plan.filter", "'label < 7'", "'label < 8'"),
        ("seed", "plan.shuffle", "'seed': 2", "'seed': 3"),
        ("strategy", "plan.shuffle", "'RowShuffle'", "'ShardShuffle'"),
        ("source", "plan.uri", "ds.lance'", "other.lance'"),
        ("columns", "plan.columns", "['id', 'label', 'x', 'vec']", "['id', 'x']"),
        ("version", "plan.version", "has 1,", " 2."),
    ],
)
@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
def test_changed_plan_is_refused_before_training(
    tmp_path: Path, uri: str, change: str, field: str, saved: str, current: str, cursor_callback: bool
) -> None:
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER), cursor_callback=cursor_callback)
    shuffle, source = "row:2", LanceSource(uri, filter=FILTER)
    if change == "filter":
        source = LanceSource(uri, filter="label < 8")
    elif change == "seed":
        shuffle = "row:3"
    elif change == "strategy":
        shuffle = "shard:32:2"
    elif change == "source":
        other = tmp_path / "other.lance"
        shutil.copytree(uri, other)
        source = LanceSource(str(other), filter=FILTER)
    elif change == "columns":
        source = LanceSource(uri, columns=["id", "x"], filter=FILTER)
    elif change == "version":
        source = LanceSource(uri, filter=FILTER, version=append_rows(uri, 50))
    model = RecordingModel()
    with pytest.raises(CursorMismatchError) as error:
        fit(
            tmp_path,
            make_dm(uri, shuffle, source=source),
            name="B",
            ckpt_path=ckpt,
            model=model,
            cursor_callback=cursor_callback,
        )
    message = str(error.value)
    assert error.value.field == field, message
    assert f"`{field}`" in message, message
    saved_part, _, current_part = message.partition("the current plan has")
    assert saved in saved_part and current in current_part, message
    assert model.seen == [], "training started before the mismatch was detected"


def test_a_dataset_written_again_at_the_same_path_is_refused(tmp_path: Path, uri: str) -> None:
    """Another dataset at the checkpoint's path, with its version number and row count: refused
    naming ``plan.data`` before training (before, the resume skipped rows of the new data)."""
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER))
    shutil.rmtree(uri)
    write_dataset(uri, ROWS, fragment_rows=50)  # version 1 again: the same ids, other files
    model = RecordingModel()
    with pytest.raises(CursorMismatchError) as error:
        fit(tmp_path, make_dm(uri, "row:2", FILTER), name="B", ckpt_path=ckpt, model=model)
    assert error.value.field == "plan.data", str(error.value)
    assert model.seen == []


def test_new_version_after_checkpoint_is_ignored(tmp_path: Path, uri: str) -> None:
    k, shuffle = 5, "row:2"
    c = fit(tmp_path, make_dm(uri, shuffle, FILTER), name="C")
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, shuffle, FILTER), k)
    a_seen = c.seen[:k]  # run A == C up to k (checked in test_mid_epoch_resume_is_exact)
    new_version = append_rows(uri, 200)
    assert new_version == 2 and lance.dataset(uri).count_rows() == ROWS + 200
    dm = make_dm(uri, shuffle, FILTER)
    b = fit(tmp_path, dm, name="B", ckpt_path=ckpt)
    assert dm.plans["train"].source.version == 1
    assert_exact(a_seen, b.seen, c.seen, k)
    assert max(flat(b.seen)) < ROWS, "rows of the new version were read"


def test_a_resume_at_an_older_version_surveys_the_train_split_once(
    tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning calls ``setup`` before it restores the checkpoint: the train split is planned
    once, at the checkpoint's version, not first at the latest version and then again."""
    from lance_lightning.plan import split as planning_entry

    k, shuffle = 5, "row:2"
    c = fit(tmp_path, make_dm(uri, shuffle, FILTER), name="C")
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, shuffle, FILTER), k)
    append_rows(uri, 200)
    surveyed: list[tuple[str, int]] = []
    real_survey = planning_entry.survey

    def counting_survey(split: str, source: Any, **options: Any) -> Any:
        surveyed.append((split, source.version))
        return real_survey(split, source, **options)

    monkeypatch.setattr(planning_entry, "survey", counting_survey)
    dm = make_dm(uri, shuffle, FILTER)
    b = fit(tmp_path, dm, name="B", ckpt_path=ckpt, max_epochs=3)
    assert [s for s in surveyed if s[0] == "train"] == [("train", 1)]
    assert_exact(c.seen[:k], epoch_batches(b, 0), epoch_batches(c, 0), k)
    for epoch in (1, 2):  # later epochs: the pinned version's rows, each once
        assert_epoch_once(flat(epoch_batches(b, epoch)), uri, FILTER + " AND id < 300", BATCH)
    surveyed.clear()
    fit(tmp_path, make_dm(uri, shuffle, FILTER), name="D", max_steps=2)
    assert [s for s in surveyed if s[0] == "train"] == [("train", 2)]


def test_deleted_pinned_version_is_reported(tmp_path: Path, uri: str) -> None:
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER))
    append_rows(uri, 50)
    append_rows(uri, 50)
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    assert 1 not in [v["version"] for v in lance.dataset(uri).versions()]
    model = RecordingModel()
    with pytest.raises(ConfigError) as error:
        fit(tmp_path, make_dm(uri, "row:2", FILTER), name="B", ckpt_path=ckpt, model=model)
    message = str(error.value)
    assert error.value.param == "train.version" and "`train.version`=1" in message, message
    assert "no longer exists" in message, message
    assert model.seen == []


# -- 2. state size ----------------------------------------------------------------------------------
def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def test_cursor_state_is_small_and_constant(tmp_path: Path) -> None:
    sizes: dict[int, dict[str, int]] = {}
    for rows, folder in ((1_000, "small"), (100_000, "large")):
        uri = write_dataset(tmp_path / folder / "ds.lance", rows, fragment_rows=rows // 4)
        root = tmp_path / f"run_{folder}"
        fit(root, make_dm(uri, "row:2", FILTER), name="A", ckpt_every=3, max_steps=3)
        ckpt = torch.load(ckpt_file(root, "A", 3), weights_only=True)
        assert_one_saved_cursor(ckpt)
        states = {"datamodule": ckpt[DM_KEY]["train_cursor"]}
        for where, state in states.items():
            assert set(state) == set(STATE_KEYS), f"{where}: {sorted(state)}"
            assert _is_plain(state), f"{where} state holds non-plain values: {state}"
            assert state["plan"]["rows"] == rows * 7 // 10
        sizes[rows] = {where: len(pickle.dumps(state)) for where, state in states.items()}
    for where in sizes[1_000]:
        small, large = sizes[1_000][where], sizes[100_000][where]
        assert large < 4096, f"{where} cursor is {large} bytes"
        assert abs(large - small) <= 8, f"{where} cursor grows with the dataset: {small} -> {large} bytes"
