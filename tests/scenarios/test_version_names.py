"""A version named as Lance names it (issue #52): a tag or a moment (``asof``) wherever a version is
accepted, in Python and YAML; the number it names is pinned in the cursor and shown with its name in
``explain()`` and the resume line; a resume after the tag moved reads the version its checkpoint
read, in the resumed epoch and every epoch after it. Each wrong name is a `ConfigError` naming the
parameter, before anything is trained."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceMixture, LanceSource, RowShuffle
from tests.helpers import RecordingModel, append_rows, fit_recording, flat, run_cli, write_dataset

ROWS, BATCH, K = 120, 10, 4


@pytest.fixture
def tagged(tmp_path: Path) -> tuple[str, datetime]:
    """Version 1 (120 rows) tagged ``release-1``; version 2 appends 60; the moment between them."""
    uri = write_dataset(tmp_path / "t.lance", ROWS, fragment_rows=40)
    time.sleep(0.05)
    between = datetime.now(timezone.utc)
    time.sleep(0.05)
    append_rows(uri, 60)
    lance.dataset(uri).tags.create("release-1", 1)
    return uri, between


def _dm(uri: str, **source: Any) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], **source), batch_size=BATCH, shuffle=RowShuffle(seed=5)
    )


@contextlib.contextmanager
def _printed() -> Iterator[list[str]]:
    """The lines the data module prints through Lightning's rank-zero logger (the plan, the resume line)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("named", ["tag", "asof"])
def test_a_tag_or_a_moment_pins_the_version_it_names(tmp_path: Path, tagged: tuple[str, datetime], named: str) -> None:
    uri, between = tagged
    source = {"version": "release-1"} if named == "tag" else {"asof": between.isoformat()}
    dm = _dm(uri, **source)
    by_number = fit_recording(tmp_path / "n", _dm(uri, version=1), max_epochs=2)
    model = fit_recording(tmp_path / "t", dm, max_epochs=2)
    assert model.seen == by_number.seen and max(flat(model.seen)) < ROWS  # version 1's rows only
    shown = "tag release-1" if named == "tag" else f"as of {between.isoformat()}"
    assert f"@ version 1 ({shown})" in dm.explain(), dm.explain()


def test_resume_after_the_tag_moved_reads_the_checkpoints_version(tmp_path: Path, tagged: tuple[str, datetime]) -> None:
    uri, _ = tagged
    whole = fit_recording(tmp_path / "whole", _dm(uri, version=1), max_epochs=3)
    fit_recording(tmp_path / "a", _dm(uri, version="release-1"), ckpt_every=K, max_steps=K)
    saved = torch.load(tmp_path / "a" / "ckpt" / f"step={K}.ckpt", weights_only=True)
    assert saved["LanceDataModule"]["train_cursor"]["plan"]["version"] == 1  # the number, not the tag
    lance.dataset(uri).tags.update("release-1", 2)
    with _printed() as lines:
        resumed = fit_recording(
            tmp_path / "b", _dm(uri, version="release-1"), max_epochs=3, ckpt=tmp_path / "a" / "ckpt" / f"step={K}.ckpt"
        )
    assert resumed.seen == whole.seen[K:], "the resumed epoch or a later one differs from the uninterrupted run"
    plan = next(line for line in lines if line.startswith("split 'train'"))
    # Both the name and the number the checkpoint pinned, and where the tag points now.
    shown = "version 1 (tag release-1 when the checkpoint was saved; it now names version 2)"
    assert f"@ {shown}," in plan, plan
    assert f"resume: data epoch 0 at row {K * BATCH} of {ROWS} ({shown};" in plan, plan


@pytest.mark.parametrize("tag", ["kept", "deleted"])
def test_resume_line_names_a_tag_that_stayed_or_was_deleted(
    tmp_path: Path, tagged: tuple[str, datetime], tag: str
) -> None:
    """A tag still at the checkpoint's version is shown as configured; a deleted one is named with
    what is wrong with it now, and the resume still reads the checkpoint's version."""
    uri, _ = tagged
    whole = fit_recording(tmp_path / "whole", _dm(uri, version=1), max_epochs=2)
    fit_recording(tmp_path / "a", _dm(uri, version="release-1"), ckpt_every=K, max_steps=K)
    if tag == "deleted":
        lance.dataset(uri).tags.delete("release-1")
    with _printed() as lines:
        resumed = fit_recording(
            tmp_path / "b", _dm(uri, version="release-1"), max_epochs=2, ckpt=tmp_path / "a" / "ckpt" / f"step={K}.ckpt"
        )
    assert resumed.seen == whole.seen[K:]
    plan = next(line for line in lines if line.startswith("split 'train'"))
    shown = (
        "version 1 (tag release-1)"
        if tag == "kept"
        else "version 1 (tag release-1 when the checkpoint was saved; now no tag of that name at "
    )
    assert f"resume: data epoch 0 at row {K * BATCH} of {ROWS} ({shown}" in plan, plan


def test_a_tag_from_yaml(tmp_path: Path, tagged: tuple[str, datetime]) -> None:
    uri, _ = tagged
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""\
trainer:
  accelerator: cpu
  max_steps: 3
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
  callbacks:
    - class_path: lance_lightning.DataCursorCheckpoint
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x], version: release-1}}
  batch_size: {BATCH}
"""
    )
    with _printed() as lines:
        code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err
    assert any("@ version 1 (tag release-1)" in line for line in lines), lines
    (checkpoint,) = (tmp_path / "root" / "checkpoints").glob("*.ckpt")
    assert torch.load(checkpoint, weights_only=True)["LanceDataModule"]["train_cursor"]["plan"]["version"] == 1


@pytest.mark.parametrize(
    ("source", "param", "says"),
    [
        ({"version": "release-9"}, "train.version", "no tag of that name"),
        ({"version": "release-1", "asof": "2026-01-01T00:00:00"}, "train.asof", "given together with"),
        ({"asof": "yesterday"}, "train.asof", "is not an ISO 8601 time"),
        ({"asof": "2001-01-01T00:00:00+00:00"}, "train.asof", "no version of"),
        ({"version": 7}, "train.version", "that version does not exist"),
    ],
    ids=["unknown-tag", "both", "unparsed", "too-early", "no-such-number"],
)
def test_a_wrong_name_is_refused_before_training(
    tmp_path: Path, tagged: tuple[str, datetime], source: dict[str, Any], param: str, says: str
) -> None:
    uri, _ = tagged
    model = RecordingModel()
    with pytest.raises(ConfigError) as error:
        trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
        trainer.fit(model, datamodule=_dm(uri, **source))
    assert error.value.param == param and says in str(error.value), str(error.value)
    assert model.seen == []
    if "tag" in says:
        assert "release-1" in str(error.value)  # the existing tags are listed


def test_a_mixture_source_named_by_a_tag_is_shown_with_it_after_the_tag_moved(
    tmp_path: Path, tagged: tuple[str, datetime]
) -> None:
    """A mixture's sources are re-pinned as a plain source is, and shown the same way."""
    uri, _ = tagged
    other = write_dataset(tmp_path / "other.lance", ROWS, fragment_rows=40)

    def mixture_dm() -> LanceDataModule:
        sources = [LanceSource(uri, columns=["id", "x"], version="release-1"), LanceSource(other, columns=["id", "x"])]
        return LanceDataModule(
            train=LanceMixture(sources, weights=[0.5, 0.5], names=["tagged", "plain"], block=10),
            batch_size=BATCH,
            shuffle=RowShuffle(seed=5),
        )

    whole = fit_recording(tmp_path / "whole", mixture_dm(), max_epochs=2)
    fit_recording(tmp_path / "a", mixture_dm(), ckpt_every=K, max_steps=K)
    lance.dataset(uri).tags.update("release-1", 2)
    with _printed() as lines:
        resumed = fit_recording(
            tmp_path / "b", mixture_dm(), max_epochs=2, ckpt=tmp_path / "a" / "ckpt" / f"step={K}.ckpt"
        )
    assert resumed.seen == whole.seen[K:]
    text = "\n".join(lines)
    assert "version 1 (tag release-1 when the checkpoint was saved; it now names version 2)" in text, text
