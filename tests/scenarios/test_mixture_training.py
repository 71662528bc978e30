"""Mixtures through the user's path: ``Trainer.fit`` on a `LanceMixture` (epoch proportions, the
``source`` column, determinism, the monitor's per-source figures in the CSV logs), exact elastic
resume through ``fit(ckpt_path=...)`` (2 ranks -> 1, batch size changed), YAML by ``class_path``
in the CLI, and a checkpoint of another mixture refused naming the field."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lance_lightning import (
    ConfigError,
    CursorMismatchError,
    DataLoadingMonitor,
    LanceDataModule,
    LanceMixture,
    LanceSource,
    RowShuffle,
)
from tests import zygote
from tests.harness import REPO_ROOT, Job, Setup, run_and_check_resume
from tests.helpers import RecordingModel, make_table, mixture_cli_config

OFFSET = 100_000  # ids of source "b" start here, so an id names its source and row
WEIGHTS = [0.6, 0.4]
BLOCK = 100  # 60 + 40 per block


def _write(root: Path, rows_a: int = 600, rows_b: int = 500) -> tuple[str, str]:
    a, b = str(root / "a.lance"), str(root / "b.lance")
    lance.write_dataset(make_table(rows_a), a)
    lance.write_dataset(make_table(rows_b, start=OFFSET), b)
    return a, b


def _mixture(a: str, b: str, **kwargs: Any) -> LanceMixture:
    args = {"weights": WEIGHTS, "names": ["a", "b"], "block": BLOCK, **kwargs}
    return LanceMixture([LanceSource(a, columns=["id", "x"]), LanceSource(b, columns=["id", "x"])], **args)


class SourceRecordingModel(RecordingModel):
    """Also records each batch's ``source`` column."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[list[int]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        assert batch["source"].dtype == torch.int64 and batch["source"].shape == batch["id"].shape
        self.sources.append(batch["source"].tolist())
        return super().training_step(batch, batch_idx)


def _fit(root: Path, dm: LanceDataModule, epochs: int, **trainer: Any) -> SourceRecordingModel:
    model = SourceRecordingModel()
    pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=str(root),
        **{"logger": False, **trainer},
    ).fit(model, datamodule=dm)
    return model


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_fit_epoch_proportions_source_column_and_monitor(tmp_path):
    a, b = _write(tmp_path)
    dm = LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5))
    logger = CSVLogger(str(tmp_path), name="logs")
    model = _fit(tmp_path, dm, 2, logger=logger, callbacks=[DataLoadingMonitor(log_every_n_steps=5, report=False)])

    positions = 1000  # first_exhausted: a has 600 rows = 10 blocks of 60, b 500 > 10 x 40
    steps = positions // 20
    assert len(model.seen) == 2 * steps
    for epoch in (0, 1):
        ids = [i for step in model.seen[epoch * steps : (epoch + 1) * steps] for i in step]
        src = [s for step in model.sources[epoch * steps : (epoch + 1) * steps] for s in step]
        assert [i >= OFFSET for i in ids] == [s == 1 for s in src]  # the source column names the row's source
        assert len(set(ids)) == positions  # no row twice in an epoch
        assert sorted(i for i in ids if i < OFFSET) == list(range(600))  # a read through, b 400 of 500
        share = src.count(0) / positions
        assert abs(share - WEIGHTS[0]) < 0.01
    assert model.seen[:steps] != model.seen[steps:]  # a new order each epoch

    # The monitor's per-source figures, read back from the CSV logs, agree with what was trained.
    rows = [r for r in _read_csv(Path(logger.log_dir) / "metrics.csv") if r.get("data/mixture/a/rows")]
    assert rows, "no mixture figures logged"
    logged = {int(r["step"]): (float(r["data/mixture/a/rows"]), float(r["data/mixture/b/share"])) for r in rows}
    for step, (a_rows, b_share) in logged.items():
        if step >= steps:  # the epoch-end log of epoch 0 lands on its last step; later ones count epoch 1
            continue
        trained = [s for batch in model.sources[: step + 1] for s in batch]
        assert a_rows == trained.count(0), step
        assert b_share == pytest.approx(trained.count(1) / len(trained))
    assert logged[steps - 1][1] == pytest.approx(WEIGHTS[1], abs=0.01)


@pytest.mark.slow
def test_fits_are_deterministic_and_follow_the_seed(tmp_path):
    a, b = _write(tmp_path)

    def ids(seed: int, workers: int = 0) -> list[list[int]]:
        dm = LanceDataModule(train=_mixture(a, b), batch_size=50, shuffle=RowShuffle(seed=seed), num_workers=workers)
        return _fit(tmp_path, dm, 1).seen

    first = ids(1)
    assert ids(1, workers=2) == first  # worker processes read the same batches, in the same order
    assert ids(2) != first


def test_samples_epoch_repeats_the_smaller_source(tmp_path):
    a, b = _write(tmp_path, rows_a=600, rows_b=50)
    dm = LanceDataModule(train=_mixture(a, b, epoch="samples", samples=1000), batch_size=50, shuffle=RowShuffle())
    model = _fit(tmp_path, dm, 1)
    ids = [i for step in model.seen for i in step]
    assert len(ids) == 1000
    small = [i - OFFSET for i in ids if i >= OFFSET]
    assert len(small) == 400 and sorted(set(small)) == list(range(50))  # 8 passes through b's 50 rows
    assert np.bincount(small).tolist() == [8] * 50


def test_checkpoint_of_another_mixture_is_refused_naming_the_field(tmp_path):
    a, b = _write(tmp_path)
    dm = LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5))
    loader = dm.train_dataloader()
    for _, _ in zip(range(3), loader):
        pass
    state = dm.state_dict()
    assert state["train_cursor"]["rows_consumed"] == 60
    for change, field in (
        ({"weights": [0.5, 0.5]}, "plan.weights"),
        ({"block": 50}, "plan.block"),
        ({"names": ["x", "b"]}, "plan.names"),
    ):
        other = LanceDataModule(train=_mixture(a, b, **change), batch_size=20, shuffle=RowShuffle(seed=5))
        with pytest.raises(CursorMismatchError) as info:
            other.load_state_dict(state)
        assert info.value.field == field
    pinned = dm.plans["train"].sources[1].version
    appended = lance.write_dataset(make_table(10, start=OFFSET + 500), b, mode="append").version
    moved = LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5))
    moved.load_state_dict(state)  # rows appended since: the source is re-pinned to the checkpoint's version
    assert [s.version for s in moved.plans["train"].sources] == [s.version for s in dm.plans["train"].sources]
    fixed = _mixture(a, b)
    fixed.sources[1].version = appended  # a version named in the config is never re-pinned
    named = LanceDataModule(train=fixed, batch_size=20, shuffle=RowShuffle(seed=5))
    with pytest.raises(CursorMismatchError) as info:
        named.load_state_dict(state)
    assert info.value.field == "plan.sources[1].version" and appended != pinned
    plain = LanceDataModule(train=LanceSource(a, columns=["id", "x"]), batch_size=20, shuffle=RowShuffle(seed=5))
    with pytest.raises(CursorMismatchError) as info:
        plain.load_state_dict(state)
    assert info.value.field == "plan.uri"


@pytest.mark.slow
def test_elastic_resume_two_ranks_to_one_with_another_batch_size(tmp_path):
    a, b = _write(tmp_path, rows_a=300, rows_b=250)  # 5 blocks of 60 + 40: 500 samples per epoch
    mixture = {"uris": [a, b], "weights": WEIGHTS, "names": ["a", "b"], "block": BLOCK}
    setup_a, setup_b, k, epochs = Setup(batch_size=16, devices=2), Setup(batch_size=12), 4, 2

    def job(name: str, setup: Setup, **kwargs: Any) -> Job:
        return Job(name, a, "row:3", setup, epochs, mixture=mixture, **kwargs)

    done = run_and_check_resume(tmp_path, job, rows=500, k=k, setup_a=setup_a, setup_b=setup_b, max_epochs=epochs)
    ids = done["whole_b"].rows(0)
    assert abs(sum(i < OFFSET for i in ids) / len(ids) - WEIGHTS[0]) < 0.01


@pytest.mark.slow
def test_cli_yaml_mixture_by_class_path_and_plain_mapping(tmp_path):
    a, b = _write(tmp_path)
    mixture = f"""\
  train:
    class_path: lance_lightning.LanceMixture
    init_args:
      sources: [{{uri: {a}, columns: [id, x]}}, {{uri: {b}, columns: [id, x]}}]
      weights: [0.6, 0.4]
      names: [a, b]
      block: 100"""
    plain = f"  train: {{uri: {a}, columns: [id, x]}}"
    for train, expect in ((mixture, "mixture of 2 sources"), (plain, f"split 'train': {a}")):
        config = mixture_cli_config(tmp_path, train, a)
        proc = zygote.run(  # forked from the test zygote: the process a fresh start gives, less the imports
            [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)],
            cwd=REPO_ROOT,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert expect in proc.stdout + proc.stderr


def test_a_bad_row_is_named_in_its_own_source(tmp_path):
    from lance_lightning.errors import BadRowError
    from lance_lightning.transforms import DecodeImage
    from tests.images import write_image_dataset

    good = write_image_dataset(tmp_path / "good.lance", 100)
    bad = write_image_dataset(tmp_path / "bad.lance", 100, bad=(7,))
    columns = ["id", "x", "image"]
    dm = LanceDataModule(
        train=LanceMixture([LanceSource(good, columns), LanceSource(bad, columns)], [0.5, 0.5], block=10),
        batch_size=10,
        transform=DecodeImage(size=8, normalize=False),
    )
    with pytest.raises(BadRowError) as info:
        list(dm.train_dataloader())
    assert info.value.position == 7 and f"of {bad} (version 1)" in str(info.value)


def _token_table(start: int, rows: int, item: str, value: pa.DataType = pa.int32()) -> pa.Table:
    """Row ``id`` holds the tokens ``0 .. id % 5``, in a list whose item field is named ``item``."""
    ids = np.arange(start, start + rows)
    tokens = pa.array([list(range(i % 5 + 1)) for i in ids], pa.list_(pa.field(item, value)))
    x = pa.array(ids / 1e6, pa.float32())  # the recording model's input
    return pa.table({"id": pa.array(ids, pa.int64()), "x": x, "tokens": tokens})


class TokenCheckingModel(SourceRecordingModel):
    """Checks that every row's tokens are the ones its id was written with."""

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        tokens = batch["tokens"]
        for i, row_id in enumerate(batch["id"].tolist()):
            assert tokens.row(i).tolist() == list(range(row_id % 5 + 1)), row_id
        return super().training_step(batch, batch_idx)


def test_sources_whose_lists_name_their_items_differently_mix(tmp_path):
    """Soak seed 1511: a source written with Parquet's list naming (``list<element: int32>``, as
    `prepare` and other tools write it) and one with Arrow's (``list<item: int32>``) hold the same
    type: the mixture trains on both, every row's tokens intact. A real difference of type is
    still refused, naming both."""
    a, b, c = (str(tmp_path / f"{name}.lance") for name in "abc")
    lance.write_dataset(_token_table(0, 60, "item"), a)
    lance.write_dataset(_token_table(OFFSET, 50, "element"), b)
    lance.write_dataset(_token_table(2 * OFFSET, 50, "item", pa.int64()), c)

    def mixture(second: str) -> LanceMixture:
        sources = [LanceSource(uri, columns=["id", "x", "tokens"]) for uri in (a, second)]
        return LanceMixture(sources, weights=[0.5, 0.5], names=["a", "b"], block=10)

    dm = LanceDataModule(train=mixture(b), batch_size=8, shuffle=RowShuffle(seed=2))
    model = TokenCheckingModel()
    pl.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
    ).fit(model, datamodule=dm)  # fmt: skip
    trained = [i for step in model.seen for i in step]
    assert any(i >= OFFSET for i in trained) and any(i < OFFSET for i in trained), "both sources trained"

    with pytest.raises(ConfigError) as refused:
        LanceDataModule(train=mixture(c), batch_size=8).setup("fit")
    assert "list<item: int64>" in str(refused.value) and "list<item: int32>" in str(refused.value)
