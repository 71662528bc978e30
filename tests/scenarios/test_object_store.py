"""Sources on an S3-compatible store (a real moto server on loopback), fit → checkpoint → resume."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lance
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource, RowShuffle
from tests.harness import ckpt_file, fit
from tests.helpers import flat, make_table
from tests.s3_server import S3Server, environment_credentials

ROWS, BATCH = 240, 16


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server.serving("data") as server:
        yield server


@pytest.fixture(scope="module")
def s3_uri(s3: S3Server) -> str:
    uri = "s3://data/train.lance"
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options(), max_rows_per_file=100)
    return uri


def _module(uri: str, options: dict[str, str] | None) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], storage_options=options),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=5),
    )


def test_fit_checkpoint_resume_against_s3(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    full = flat(fit(tmp_path, _module(s3_uri, s3.storage_options()), name="full", max_steps=100).seen)
    assert sorted(full) == list(range(ROWS // BATCH * BATCH)) or len(set(full)) == len(full) == ROWS // BATCH * BATCH

    first = fit(tmp_path, _module(s3_uri, s3.storage_options()), name="a", max_steps=6, ckpt_every=6)
    checkpoint = ckpt_file(tmp_path, "a", 6)
    raw = checkpoint.read_bytes()
    assert s3.secret_key.encode() not in raw, "credentials must never be written into checkpoints"
    state = torch.load(checkpoint, weights_only=True)
    assert state["LanceDataModule"]["train_cursor"]["plan"]["uri"] == s3_uri

    resumed = fit(tmp_path, _module(s3_uri, s3.storage_options()), name="b", max_steps=100, ckpt_path=checkpoint)
    assert flat(first.seen) + flat(resumed.seen) == full


def test_credentials_from_environment(
    tmp_path: Path, s3: S3Server, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment_credentials(s3).items():
        monkeypatch.setenv(name, value)
    dm = _module(s3_uri, None)
    dm.setup("fit")
    assert s3.secret_key not in repr(dm.plans["train"]) and s3.secret_key not in dm.explain("train")
    ids = [i for batch in dm.train_dataloader() for i in batch["id"].tolist()]
    assert len(ids) == ROWS // BATCH * BATCH and len(set(ids)) == len(ids)


def test_wrong_credentials_fail_early_with_the_uri(s3: S3Server, s3_uri: str) -> None:
    dm = _module(s3_uri, s3.storage_options(secret="wrong-secret"))
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    message = str(error.value)
    assert "train.uri" in message or "storage_options" in message
    assert s3_uri in message and "wrong-secret" not in message


def test_missing_dataset_on_s3_names_the_uri(s3: S3Server) -> None:
    dm = _module("s3://data/missing.lance", s3.storage_options())
    with pytest.raises(ConfigError, match="missing.lance"):
        dm.setup("fit")
