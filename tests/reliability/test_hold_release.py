"""A version hold that no checkpoint can need is released; every hold is said, with how to release it.

Real `Trainer.fit` runs on a real Lance dataset: a fit that raises in its first step (before any
checkpoint) leaves no ``lance-lightning-*`` tag, so a later ``cleanup_old_versions`` with Lance's
defaults runs; a fit that raises after a checkpoint keeps its tag, says so with the command that
releases it, and ``explain()`` of the next data module lists it with that command, which works.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.hold import TAG_PREFIX, list_holds
from tests.helpers import RecordingModel, append_rows, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]

ROWS, BATCH = 200, 20


class RaiseAt(pl.Callback):
    """Raises before training batch ``batch`` of the first epoch."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.batch:
            raise RuntimeError(f"failed at batch {batch_idx}")


@contextmanager
def lightning_output() -> Iterator[list[str]]:
    """The lines Lightning's info log gets (what a fit prints on rank zero)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, logger = Keep(level=logging.INFO), logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def _fit_failing_at(root: Path, uri: str, batch: int) -> list[str]:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=2, save_top_k=-1), RaiseAt(batch)],
    )
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=BATCH)
    with lightning_output() as lines, pytest.raises(RuntimeError, match=f"failed at batch {batch}"):
        trainer.fit(RecordingModel(), datamodule=dm)
    return lines


def test_a_fit_failing_in_its_first_step_leaves_no_tag(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    lines = _fit_failing_at(tmp_path, uri, 0)
    assert list_holds(lance.dataset(uri)) == {}, "no checkpoint was written: nothing could need the tag"
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())
    placed = next(line for line in lines if line.startswith("version hold: the Lance tag "))
    tag = placed.split()[5]
    assert tag.startswith(TAG_PREFIX) and f"lance-lightning holds {uri} --release {tag}" in placed, placed
    assert "uv run" in placed or not os.environ.get("UV"), "under `uv run` the hint needs `uv run` to run as printed"
    removed = [line for line in lines if line.startswith("version hold: removed ")]
    assert removed == [f"version hold: removed {tag}: the fit stopped before writing any checkpoint that could need it"]
    append_rows(uri, 20)  # a later maintenance job with Lance's defaults (it refuses tagged old versions)
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0))
    assert "holds on" not in LanceDataModule(train=LanceSource(uri)).explain()


def test_a_fit_failing_after_a_checkpoint_keeps_its_tag_and_explain_says_how_to_release_it(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    lines = _fit_failing_at(tmp_path, uri, 5)
    (tag,) = list_holds(lance.dataset(uri))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    words = f"holds {uri} --release {tag}"
    kept = [line for line in lines if line.startswith("version hold: kept ")]
    assert len(kept) == 1 and tag in kept[0] and kept[0].endswith(words), kept
    command = kept[0][kept[0].rindex(": ") + 2 :]
    assert not [line for line in lines if line.startswith("version hold: removed ")]

    text = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=BATCH).explain()
    assert f"holds on {uri}: 1 Lance tag(s) of lance-lightning" in text, text
    listed = next(line for line in text.splitlines() if line.strip().startswith(tag))
    assert listed.strip() == f"{tag}  version 1: {command}", listed
    ran = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert ran.returncode == 0 and f"released {tag}" in ran.stdout, f"{command}: {ran.stdout}{ran.stderr}"
    assert list_holds(lance.dataset(uri)) == {}  # the hint ran as printed
