"""The prediction writer on real Lance datasets, in one process: every row's value, one commit,
nulls where nothing was predicted, a rerun that writes nothing, a run stopped midway that resumes
with only its unfinished fragments, and bad input refused before any commit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource
from lance_lightning.write.predict_commit import RUN_PROPERTY
from lance_lightning.write.predictions import LancePredictionWriter
from tests.predict_writer_model import IdModel, embedding_of, write_rows

COLUMNS = ["emb", "score", "name"]


def _predict(uri: str, writer: LancePredictionWriter, model: pl.LightningModule | None = None, **source: Any) -> Any:
    trainer = source.pop("trainer", None) or pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[writer, *source.pop("callbacks", [])],
    )
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"], **source), batch_size=16)
    model = model or IdModel()
    trainer.predict(model, datamodule=dm, return_predictions=False)
    return model


def _files(dataset: lance.LanceDataset) -> dict[int, list[str]]:
    return {f.fragment_id: [d.path for d in f.metadata.files] for f in dataset.get_fragments()}


@pytest.fixture
def uri(tmp_path: Path) -> str:
    path = str(tmp_path / "rows.lance")
    write_rows(path, rows=300, per_fragment=50)
    return path


def test_every_row_gets_its_value_in_one_new_version(uri: str) -> None:
    lance.dataset(uri).delete("id = 7")  # a deleted row: no value, no error
    before = lance.dataset(uri)
    writer = LancePredictionWriter(columns=COLUMNS, flush_rows=20)
    _predict(uri, writer, filter="id < 280")
    after = lance.dataset(uri)
    assert after.version == before.version + 1 == writer.report["version"]
    table = after.to_table()
    ids = table["id"].to_numpy()
    inside = ids < 280
    emb = table["emb"].to_pylist()
    assert np.allclose(np.array([e for e, i in zip(emb, inside, strict=True) if i]), embedding_of(ids[inside]))
    assert all(e is None for e, i in zip(emb, inside, strict=True) if not i), "rows outside the filter get nulls"
    assert table["score"].to_pylist() == [i / 2 if i < 280 else None for i in ids]
    assert table["name"].to_pylist() == [f"row{i}" if i < 280 else None for i in ids]
    assert 7 not in ids and writer.report["rows"] == 279
    assert after.schema.field("emb").type.list_size == 4
    # the existing columns' data files are untouched: each fragment gained one file
    for fragment, files in _files(after).items():
        assert files[:-1] == _files(before)[fragment] and len(files) == len(_files(before)[fragment]) + 1
    assert 0 < writer.report["bytes"] < 30_000
    assert after.read_transaction(after.version).transaction_properties[RUN_PROPERTY] == writer.report["run"]
    assert not [t for t in after.tags.list() if "predict" in t], "the read version's hold is released"


def test_a_rerun_after_the_commit_writes_nothing(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    _predict(uri, LancePredictionWriter(columns="emb"), IdModel("tensor"))
    version = lance.dataset(uri).version
    model = _predict(uri, writer := LancePredictionWriter(columns="emb"), IdModel("tensor"))
    assert lance.dataset(uri).version == version and model.predicted == []
    assert writer.report["version"] == version


def test_a_commit_whose_marker_was_lost_is_found_again(uri: str) -> None:
    writer = LancePredictionWriter(columns="emb", run_dir=str(Path(uri).parent / "run"))
    _predict(uri, writer, IdModel("tensor"))
    (Path(uri).parent / "run" / "marker.json").unlink()  # killed between the commit and the marker
    version = lance.dataset(uri).version
    model = _predict(
        uri, LancePredictionWriter(columns="emb", run_dir=str(Path(uri).parent / "run")), IdModel("tensor")
    )
    assert lance.dataset(uri).version == version and model.predicted == []
    assert json.loads((Path(uri).parent / "run" / "marker.json").read_text())["version"] == version


class _StopAfter(pl.Callback):
    def __init__(self, batches: int) -> None:
        self.batches, self.seen = batches, 0

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.batches:
            raise KeyboardInterrupt


def test_a_stopped_run_resumes_with_its_unfinished_fragments_only(tmp_path: Path, uri: str) -> None:
    whole = str(tmp_path / "whole.lance")
    write_rows(whole, rows=300, per_fragment=50)
    _predict(whole, LancePredictionWriter(columns=COLUMNS, run_dir=str(tmp_path / "w")))
    run_dir = str(tmp_path / "run")
    stopped = IdModel()
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), stopped, callbacks=[_StopAfter(8)])
    assert lance.dataset(uri).version == 1, "nothing is committed before the end"
    assert stopped.predicted == list(range(128))
    resumed = _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir))
    # fragments 0 and 1 (rows 0-99) were finished: they are not predicted again
    assert resumed.predicted == list(range(100, 300))
    assert lance.dataset(uri).version == 2
    assert lance.dataset(uri).to_table().select(COLUMNS) == lance.dataset(whole).to_table().select(COLUMNS)


def test_an_existing_column_is_refused_unless_overwrite_replaces_it(uri: str) -> None:
    with pytest.raises(ConfigError, match="already has that column.*overwrite: true"):
        _predict(uri, LancePredictionWriter(columns="x"), IdModel("tensor"))
    with pytest.raises(ConfigError, match=r"overwrite replaces existing columns, and only \['x'\] exist"):
        _predict(uri, LancePredictionWriter(columns=["x", "new"], overwrite=True), IdModel())
    with pytest.raises(ConfigError, match="overwrite keeps a column's type, and 'x' is float"):
        _predict(uri, LancePredictionWriter(columns="x", overwrite=True), _BadModel("float64"))
    assert lance.dataset(uri).version == 1
    before = lance.dataset(uri).to_table()
    writer = LancePredictionWriter(columns="x", overwrite=True)
    _predict(uri, writer, _BadModel("tenfold"))
    after = lance.dataset(uri)
    assert after.version == 2 and writer.report["version"] == 2
    table = after.to_table()
    assert table["x"].to_pylist() == [10.0 * i for i in range(300)] and table["id"] == before["id"]
    assert table.schema == before.schema


class _BadModel(pl.LightningModule):
    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(1, 1)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        rows = len(batch["id"])
        if self.bad == "rows":
            return torch.zeros(rows - 1, 3)
        if self.bad == "size":
            return torch.zeros(rows, 3 + batch_idx)
        if self.bad == "dtype":
            return torch.zeros(rows, 3, dtype=torch.float16 if batch_idx else torch.float32)
        if self.bad == "number":
            return 3.5
        if self.bad == "float64":
            return batch["id"].double()
        if self.bad == "tenfold":
            return batch["id"].float() * 10
        return torch.zeros(rows, 3, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("rows", "has 16 rows but its output for column 'p' has 15"),
        ("size", r"the type fixed_size_list<item: float>\[4\], earlier batches fixed_size_list<item: float>\[3\]"),
        ("dtype", "the type fixed_size_list<item: halffloat>"),
        ("number", "returned a float"),
        ("bf16", "bfloat16"),
    ],
)
def test_bad_outputs_are_refused_before_any_commit(uri: str, bad: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _predict(uri, LancePredictionWriter(columns="p"), _BadModel(bad))
    assert lance.dataset(uri).version == 1


class _Meanwhile(pl.Callback):
    """After batch 3, another writer changes the dataset: an append of 10 rows, or a compaction."""

    def __init__(self, uri: str, change: str) -> None:
        self.uri, self.change, self.seen = uri, change, 0

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen != 3:
            return
        if self.change == "append":
            rows = np.arange(300, 310)
            lance.write_dataset(pa.table({"id": rows, "x": rows.astype(np.float32)}), self.uri, mode="append")
        else:
            lance.dataset(self.uri).optimize.compact_files(target_rows_per_fragment=1000)
        self.version = lance.dataset(self.uri).version


def test_rows_appended_meanwhile_get_nulls_and_are_counted(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    writer = LancePredictionWriter(columns="emb")
    with caplog.at_level("INFO"):
        _predict(uri, writer, IdModel("tensor"), callbacks=[_Meanwhile(uri, "append")])
    assert "10 rows appended meanwhile have no value (null)" in caplog.text
    result = lance.dataset(uri)
    assert result.version == 3 == writer.report["version"] and writer.report["appended_rows"] == 10
    emb = result.to_table()["emb"].to_pylist()
    assert len(emb) == 310 and emb[300:] == [None] * 10 and None not in emb[:300]


def test_a_compaction_meanwhile_is_refused_before_any_commit(uri: str) -> None:
    meanwhile = _Meanwhile(uri, "compact")
    with pytest.raises(
        ConfigError, match=r"version 2 of the dataset \(a compaction, or another rewrite\) changed rows"
    ):
        _predict(uri, LancePredictionWriter(columns="emb"), IdModel("tensor"), callbacks=[meanwhile])
    assert lance.dataset(uri).version == meanwhile.version and "emb" not in lance.dataset(uri).schema.names


def test_a_separate_table_keyed_by_stable_row_ids(tmp_path: Path) -> None:
    uri, table = str(tmp_path / "stable.lance"), str(tmp_path / "outputs.lance")
    rows = np.arange(120)
    data = pa.table({"id": rows, "x": rows.astype(np.float32)})
    lance.write_dataset(data, uri, max_rows_per_file=40, enable_stable_row_ids=True)
    lance.dataset(uri).delete("id < 40")  # stable ids now differ from addresses
    lance.write_dataset(data.slice(0, 40), uri, mode="append")
    writer = LancePredictionWriter(columns=["emb", "score", "name"], table=table)
    _predict(uri, writer)
    dataset = lance.dataset(uri)
    assert dataset.version == 3 and "emb" not in dataset.schema.names, "the predicted dataset is unchanged"
    outputs = lance.dataset(table).to_table()
    assert outputs.num_rows == 120 == writer.report["rows"] and lance.dataset(table).version == 1
    by_id = dict(zip(outputs["row_id"].to_pylist(), outputs["name"].to_pylist(), strict=True))
    truth = dataset.to_table(columns=["id"], with_row_id=True)
    assert by_id == {r: f"row{i}" for r, i in zip(truth["_rowid"].to_pylist(), truth["id"].to_pylist(), strict=True)}
    model = _predict(uri, LancePredictionWriter(columns=["emb", "score", "name"], table=table))
    assert model.predicted == [] and lance.dataset(table).version == 1
    with pytest.raises(ConfigError, match="a dataset already exists there"):
        _predict(uri, LancePredictionWriter(columns="emb", table=table), IdModel("tensor"))


def _drop_identity(batch: dict[str, Any]) -> dict[str, Any]:
    return {"id": batch["id"]}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"row_identity": False}, "with row identity on"),
        ({"transform": _drop_identity}, "has no '_rowaddr' key"),
    ],
)
def test_batches_without_row_addresses_are_refused(uri: str, settings: dict[str, Any], message: str) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[LancePredictionWriter(columns="emb")],
    )
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"]), batch_size=16, **settings)
    with pytest.raises(ConfigError, match=message):
        trainer.predict(IdModel("tensor"), datamodule=dm, return_predictions=False)
    assert lance.dataset(uri).version == 1


def test_a_run_stopped_at_its_commit_commits_on_rerun_without_predicting(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lance_lightning.write import predict_commit

    def killed(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("stopped")  # as if killed after every fragment's record, before the commit

    with monkeypatch.context() as patched:
        patched.setattr(predict_commit, "commit", killed)
        with pytest.raises(RuntimeError, match="stopped"):
            _predict(uri, LancePredictionWriter(columns="emb"), IdModel("tensor"))
    assert lance.dataset(uri).version == 1
    model = _predict(uri, writer := LancePredictionWriter(columns="emb"), IdModel("tensor"))
    assert model.predicted == [] and writer.report["version"] == 2 and writer.report["rows"] == 300
    table = lance.dataset(uri).to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))


def test_fewer_rows_left_than_ranks_reads_finished_fragments_again_and_drops_them() -> None:
    from lance_lightning.write.predict_run import fragments_to_read

    order, expected = [0, 1, 2, 3], {0: 50, 1: 1, 2: 0, 3: 30}
    assert fragments_to_read(order, expected, [], 2) == []
    assert fragments_to_read(order, expected, [3], 2) == [3]
    assert fragments_to_read(order, expected, [1], 2) == [0, 1]  # 1 row for 2 ranks: add the largest
    assert fragments_to_read(order, expected, [1, 2], 4) == [0, 1, 2]


def test_a_finished_fragment_read_again_is_not_written_again(
    tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lance_lightning.write import predict_run

    run_dir = str(tmp_path / "run")
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        _predict(
            uri, LancePredictionWriter(columns="emb", run_dir=run_dir), IdModel("tensor"), callbacks=[_StopAfter(8)]
        )
    monkeypatch.setattr(predict_run, "fragments_to_read", lambda order, *args: list(order))
    again = _predict(uri, writer := LancePredictionWriter(columns="emb", run_dir=run_dir), IdModel("tensor"))
    assert again.predicted == list(range(300)) and writer.report["rows"] == 300
    table = lance.dataset(uri).to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))


@pytest.mark.parametrize("limit", [0.5, 1], ids=["fraction", "one_batch"])
def test_a_predict_batch_limit_is_refused_before_anything_is_written(uri: str, limit: float) -> None:
    """``limit_predict_batches`` would leave rows without a value: refused before the run, naming it
    (also ``1``, an int: one batch, not the whole split)."""
    writer = LancePredictionWriter(columns="emb")
    limited = pl.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[writer], limit_predict_batches=limit
    )
    with pytest.raises(ConfigError, match="limit_predict_batches") as info:
        _predict(uri, writer, IdModel("tensor"), trainer=limited)
    assert info.value.param == "trainer.limit_predict_batches"
    assert lance.dataset(uri).version == 1 and "emb" not in lance.dataset(uri).schema.names
