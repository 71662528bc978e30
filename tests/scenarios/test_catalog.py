"""A source named through a Lance namespace (catalog) and a table id, from Python and YAML (issue #52):
the same pinning, checks, cursor and exact resume as the table's URI; each mistake a `ConfigError`
naming the parameter before anything is trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import lance.namespace
import lightning.pytorch as pl
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource, Prepare, RowShuffle
from tests.helpers import RecordingModel, fit_recording, make_table, run_cli

ROWS, BATCH, K = 90, 10, 3


@pytest.fixture
def catalog(tmp_path: Path) -> dict[str, Any]:
    """A directory namespace holding the table ``images`` (90 rows: ids 0..89)."""
    root = tmp_path / "catalog"
    client = lance.namespace.DirectoryNamespace(root=str(root))
    lance.write_dataset(make_table(ROWS), namespace_client=client, table_id=["images"], max_rows_per_file=30)
    return {"impl": "dir", "properties": {"root": str(root)}}


def _dm(namespace: dict[str, Any], **source: Any) -> LanceDataModule:
    train = LanceSource(namespace=namespace, table_id=["images"], columns=["id", "x"], **source)
    return LanceDataModule(train=train, batch_size=BATCH, shuffle=RowShuffle(seed=3))


def test_a_catalog_table_trains_and_resumes_like_its_uri(tmp_path: Path, catalog: dict[str, Any]) -> None:
    location = str(tmp_path / "catalog" / "images.lance")
    by_uri = fit_recording(
        tmp_path / "uri",
        LanceDataModule(train=LanceSource(location, columns=["id", "x"]), batch_size=BATCH, shuffle=RowShuffle(3)),
        max_epochs=2,
    )
    dm = _dm(catalog)
    fit_recording(tmp_path / "a", dm, ckpt_every=K, max_steps=K)
    assert f"split 'train': {location} @ version 1" in dm.explain(), dm.explain()
    checkpoint = tmp_path / "a" / "ckpt" / f"step={K}.ckpt"
    assert torch.load(checkpoint, weights_only=True)["LanceDataModule"]["train_cursor"]["plan"]["uri"] == location
    lance.write_dataset(make_table(30, start=ROWS), location, mode="append")  # the table moves on: version 2
    resumed = fit_recording(tmp_path / "b", _dm(catalog), max_epochs=2, ckpt=checkpoint)
    assert resumed.seen == by_uri.seen[K:], "the resume from a catalog table lost or repeated rows"


def test_a_catalog_table_from_yaml(tmp_path: Path, catalog: dict[str, Any]) -> None:
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
  callbacks:
    - class_path: lance_lightning.DataCursorCheckpoint
model:
  class_path: tests.helpers.RecordingModel
data:
  train:
    namespace: {{impl: dir, properties: {{root: {tmp_path / "catalog"}}}}}
    table_id: [images]
    columns: [id, x]
  batch_size: {BATCH}
"""
    )
    code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err
    (checkpoint,) = (tmp_path / "root" / "checkpoints").glob("*.ckpt")
    plan = torch.load(checkpoint, weights_only=True)["LanceDataModule"]["train_cursor"]["plan"]
    assert plan["uri"] == str(tmp_path / "catalog" / "images.lance") and plan["rows"] == ROWS


def test_a_table_the_catalog_lacks_is_named_with_the_tables_it_has(tmp_path: Path, catalog: dict[str, Any]) -> None:
    model = RecordingModel()
    dm = LanceDataModule(train=LanceSource(namespace=catalog, table_id=["imgs"]), batch_size=BATCH)
    with pytest.raises(ConfigError) as error:
        pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).fit(model, datamodule=dm)
    assert error.value.param == "train.table_id" and "['images']" in str(error.value), str(error.value)
    assert model.seen == []


@pytest.mark.parametrize(
    ("source", "param", "says"),
    [
        ({"uri": "x.lance", "table_id": ["images"]}, "LanceSource.uri", "given together with a namespace"),
        ({"table_id": None}, "LanceSource.table_id", "a namespace needs the table's id"),
        ({"namespace": None}, "LanceSource.namespace", "a table id needs a namespace"),
        ({"table_id": "images"}, "LanceSource.table_id", "is not a list of names"),
        ({"namespace": {"properties": {}}}, "LanceSource.namespace", "needs `impl`"),
        ({"prepare": Prepare(format="parquet", input="raw")}, "LanceSource.prepare", "not to a catalog table"),
    ],
    ids=["uri-too", "no-table", "no-namespace", "table-not-a-list", "no-impl", "prepare"],
)
def test_a_catalog_reference_that_names_no_table_is_refused_when_made(
    catalog: dict[str, Any], source: dict[str, Any], param: str, says: str
) -> None:
    arguments = {"namespace": catalog, "table_id": ["images"], **source}
    with pytest.raises(ConfigError) as error:
        LanceSource(**arguments)
    assert error.value.param == param and says in str(error.value), str(error.value)


def test_a_namespace_that_does_not_connect(tmp_path: Path) -> None:
    dm = LanceDataModule(
        train=LanceSource(namespace={"impl": "no.such.Namespace", "properties": {}}, table_id=["t"]), batch_size=4
    )
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == "train.namespace" and "could not connect" in str(error.value), str(error.value)
