"""``LanceDataModule.load_from_checkpoint`` restores the data module a fit trained with (issue #52): its
arguments are saved as plain, redacted hyperparameters, from Python and from the CLI; checkpoints
still load with ``weights_only=True``; a credential is never written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lance_lightning import (
    ConfigError,
    DataCursorCheckpoint,
    FilterRead,
    LanceDataModule,
    LanceMixture,
    LanceSource,
    ReplaceBadRow,
    RetryPolicy,
    RowShuffle,
)
from lance_lightning.hparams import describe
from lance_lightning.transforms import RandomFlip
from tests.helpers import RecordingModel, run_cli, write_dataset

SECRET = "s3cr3t-value-never-written"


def _train(uri: str) -> LanceSource:
    options = {"aws_secret_access_key": SECRET}
    return LanceSource(uri, columns=["id", "x", "vec"], filter="label < 7", storage_options=options)


def _dm(uri: str, **overrides: Any) -> LanceDataModule:
    arguments: dict[str, Any] = dict(
        train=LanceSource(
            uri, columns=["id", "x", "vec"], filter="label < 7", storage_options={"aws_secret_access_key": SECRET}
        ),
        val=LanceSource(uri, columns=["id", "x", "vec"], filter="label >= 7"),
        batch_size=8,
        shuffle=RowShuffle(seed=4, clump_rows=2),
        filter_read=FilterRead(method="take"),
        transform=RandomFlip(column="vec", p=0.5, seed=9),
        bad_rows=ReplaceBadRow(seed=5, max_attempts=8),
        retry=RetryPolicy(attempts=3),
        drop_last=False,
        row_identity=True,
    )
    return LanceDataModule(**{**arguments, **overrides})


def _fit(root: Path, dm: LanceDataModule, **kwargs: Any) -> RecordingModel:
    model = RecordingModel()
    pl.Trainer(
        accelerator="cpu",
        logger=CSVLogger(str(root), name="csv"),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[DataCursorCheckpoint(), ModelCheckpoint(dirpath=root / "ckpt", filename="last")],
        **kwargs,
    ).fit(model, datamodule=dm)
    return model


def test_load_from_checkpoint_rebuilds_the_data_module(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", 120, fragment_rows=40)
    original = _dm(uri)
    _fit(tmp_path, original, max_epochs=1)
    checkpoint = tmp_path / "ckpt" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["datamodule_hyper_parameters"]  # plain types only
    assert SECRET not in str(saved) and SECRET not in (tmp_path / "csv" / "version_0" / "hparams.yaml").read_text()
    assert saved["shuffle"] == {
        "class_path": "lance_lightning.plan.strategies.RowShuffle",
        "init_args": {"seed": 4, "clump_rows": 2},
    }

    with pytest.raises(ConfigError, match="placeholder"):  # a credential must be given again
        LanceDataModule.load_from_checkpoint(checkpoint).setup("fit")
    rebuilt = LanceDataModule.load_from_checkpoint(checkpoint, train=_train(uri))
    assert describe(dict(rebuilt.hparams)) == describe(dict(original.hparams))
    again = _fit(tmp_path / "again", rebuilt, max_epochs=2)
    fresh = _fit(tmp_path / "fresh", _dm(uri), max_epochs=2)
    assert again.seen == fresh.seen and again.val_seen == fresh.val_seen  # the same data module


def test_a_scheduled_mixture_is_saved_and_rebuilt(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """Every constructor argument of `LanceMixture` is kept as an attribute of that name (the
    schedule as given, not as parsed), so the data module's hyperparameters hold the whole mixture
    (before, `interpolate` was missing: a warning, and `load_from_checkpoint` needed ``train=``)."""
    a = write_dataset(tmp_path / "a.lance", 60, fragment_rows=30)
    b = write_dataset(tmp_path / "b.lance", 50, fragment_rows=25)
    mixture = LanceMixture(
        [LanceSource(a, columns=["id", "x"]), LanceSource(b, columns=["id", "x"])],
        names=["a", "b"],
        epoch="samples",
        samples=40,
        block=10,
        schedule=[{"until_sample": 40, "weights": [0.8, 0.2]}, {"weights": [0.2, 0.8]}],
        interpolate="linear",
    )
    original = LanceDataModule(train=mixture, batch_size=8, shuffle=RowShuffle(seed=3))
    assert not [w for w in recwarn if "hyperparameters" in str(w.message)], [str(w.message) for w in recwarn]
    _fit(tmp_path, original, max_epochs=1)
    checkpoint = tmp_path / "ckpt" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["datamodule_hyper_parameters"]["train"]
    assert saved["init_args"]["interpolate"] == "linear" and saved["init_args"]["schedule"][0]["until_sample"] == 40
    rebuilt = LanceDataModule.load_from_checkpoint(checkpoint)
    assert describe(dict(rebuilt.hparams)) == describe(dict(original.hparams))
    again = _fit(tmp_path / "again", rebuilt, max_epochs=2)
    fresh = _fit(
        tmp_path / "fresh", LanceDataModule(train=mixture, batch_size=8, shuffle=RowShuffle(seed=3)), max_epochs=2
    )
    assert again.seen == fresh.seen


def test_a_cli_fit_saves_what_load_from_checkpoint_rebuilds(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", 80, fragment_rows=40)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""\
trainer:
  accelerator: cpu
  max_steps: 2
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x], version: 1}}
  batch_size: 8
  shuffle: {{class_path: lance_lightning.BufferShuffle, init_args: {{buffer_rows: 32, seed: 2}}}}
"""
    )
    code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err
    (checkpoint,) = (tmp_path / "root" / "checkpoints").glob("*.ckpt")
    rebuilt = LanceDataModule.load_from_checkpoint(checkpoint)
    assert rebuilt.batch_size == 8 and rebuilt.sources["train"].version == 1
    assert (rebuilt.shuffle.buffer_rows, rebuilt.shuffle.seed) == (32, 2)
    assert yaml.safe_load(yaml.safe_dump(dict(rebuilt.hparams)))  # plain


class _Opaque:
    """A user transform that keeps none of its constructor's arguments."""

    def __init__(self, scale: float) -> None:
        self.factor = scale

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch


def test_an_argument_that_cannot_be_described_is_named_not_saved_wrong(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", 40, fragment_rows=40)
    with pytest.warns(UserWarning, match=r"`transform` \(_Opaque\) is not saved"):
        dm = _dm(uri, transform=_Opaque(2.0))
    assert "transform" not in dm.hparams and dm.hparams["batch_size"] == 8
