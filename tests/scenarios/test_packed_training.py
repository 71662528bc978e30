"""Token packing through the paths users take: ``Trainer.fit`` (one rank and 2-rank DDP), exact
elastic resume through ``fit(ckpt_path=...)`` at a window in mid-epoch (batch size changed, 2 ranks
-> 1), val/test/predict packed too, and the ``lance-lightning`` CLI with a YAML config.

With `write_token_dataset`, token ``t`` of the stream has id ``t``, so the trained ``input_ids``
say exactly which stream tokens (and windows: first token // seq_len) were trained.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest

from lance_lightning import LanceDataModule, LanceSource, RowShuffle, TokenPacking
from tests.harness import Job, Setup, run_and_check_resume
from tests.helpers import PackedRecordingModel, run_cli, write_token_dataset

SEQ_LEN = 16
PACKING = {"column": "tokens", "seq_len": SEQ_LEN, "lengths_column": "n_tokens"}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    return write_token_dataset(tmp_path_factory.mktemp("packed") / "docs.lance", 200, fragment_rows=60)


def _fit(uri: str, seed: int, epochs: int = 2, **data) -> PackedRecordingModel:
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["tokens", "n_tokens"]),
        packing=TokenPacking(**PACKING),
        shuffle=RowShuffle(seed=seed),
        batch_size=4,
        **data,
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    model = PackedRecordingModel()
    trainer.fit(model, datamodule=dm)
    return model


def _epoch_tokens(model: PackedRecordingModel, epoch: int) -> list[int]:
    return [t for step, e in zip(model.tokens, model.seen_epochs) if e == epoch for row in step for t in row]


@pytest.mark.slow
def test_fit_trains_every_token_once_but_the_tail_deterministically_per_seed_and_epoch(docs) -> None:
    uri, counts = docs
    total = int(counts.sum())
    windows = (total - 1) // SEQ_LEN  # labels need one token past the window
    model = _fit(uri, seed=3, drop_last=False)
    for epoch in (0, 1):
        trained = _epoch_tokens(model, epoch)
        assert len(trained) == len(set(trained)), "a token was trained twice in one epoch"
        assert sorted(trained) == list(range(windows * SEQ_LEN))  # all but the tail
        assert total - len(trained) <= SEQ_LEN  # the tail: less than one window (+ the last target)
    assert model.seen_epochs.count(0) == -(-windows // 4)
    first, second = (
        [w for ids, e in zip(model.seen, model.seen_epochs) if e == epoch for w in ids] for epoch in (0, 1)
    )
    assert first != second and sorted(first) == sorted(second), "RowShuffle must reorder windows per epoch"
    again = _fit(uri, seed=3, drop_last=False)
    assert again.seen == model.seen, "the same (seed, epoch) must give the same windows"
    other = _fit(uri, seed=4, epochs=1, drop_last=False)
    assert other.seen != model.seen[: len(other.seen)]


@pytest.mark.slow
def test_worker_processes_read_the_same_windows_as_reader_threads(docs) -> None:
    uri, _ = docs
    threads = _fit(uri, seed=1, epochs=1)
    workers = _fit(uri, seed=1, epochs=1, num_workers=2)
    assert workers.tokens == threads.tokens


def test_eval_splits_and_predict_are_packed_without_padding(docs) -> None:
    uri, counts = docs
    source = LanceSource(uri, columns=["tokens", "n_tokens"])
    dm = LanceDataModule(
        train=source, val=source, test=source, predict=source, packing=TokenPacking(**PACKING), batch_size=5
    )
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    model = PackedRecordingModel()
    trainer.validate(model, datamodule=dm)
    trainer.test(model, datamodule=dm)
    predictions = trainer.predict(model, datamodule=dm)
    windows = (int(counts.sum()) - 1) // SEQ_LEN
    every = list(range(0, windows * SEQ_LEN, SEQ_LEN))
    for seen in (model.val_seen, model.test_seen, predictions):
        assert [w for ids in seen for w in ids] == every  # storage order, every window once


@pytest.mark.slow
def test_resume_at_a_window_mid_epoch_with_batch_size_and_world_size_changed(tmp_path: Path) -> None:
    uri, counts = write_token_dataset(tmp_path / "docs.lance", 160, fragment_rows=50)
    windows = (int(counts.sum()) - 1) // SEQ_LEN
    ddp, single = Setup(batch_size=4, devices=2), Setup(batch_size=6)
    k, epochs = 5, 2

    def job(name: str, setup: Setup, **kwargs) -> Job:
        return Job(name, uri, "row:7", setup, epochs, packing=PACKING, **kwargs)

    fits = run_and_check_resume(tmp_path, job, rows=windows, k=k, setup_a=ddp, setup_b=single, max_epochs=epochs)
    assert all(w % SEQ_LEN == 0 for ids in fits["resume"].steps for w in ids)


def test_cli_config_packs_the_train_split(docs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri, _ = docs
    config = tmp_path / "packed.yaml"
    config.write_text(
        f"""
trainer:
  {{max_steps: 2, default_root_dir: {tmp_path}, logger: false, enable_checkpointing: false, enable_progress_bar: false}}
model: {{class_path: tests.helpers.PackedRecordingModel}}
data:
  train: {{uri: {uri}, columns: [tokens, n_tokens]}}
  batch_size: 4
  packing:
    class_path: lance_lightning.TokenPacking
    init_args: {{column: tokens, seq_len: {SEQ_LEN}, lengths_column: n_tokens, labels: stream}}
"""
    )
    code, out, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err[-3000:]
    assert "window(s) of 16 (labels 'stream'" in caplog.text  # the plan printed at the start
