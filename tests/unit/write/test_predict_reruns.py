"""The prediction writer's reruns, in one process with a real `Trainer`: a rerun continues only the
run its pieces belong to (the same dataset, the same model), with the uninterrupted run's row
positions (so seeded per-row randomness draws the same); a replaced bad row gets nulls and is
counted bad; a second ``predict`` of one trainer; stored records are never unpickled; bad names,
empty outputs and unwritable folders are one-line `ConfigError`s before any batch is predicted.
The oracle is always an uninterrupted run (or `embedding_of`, the model's function of ``id``)."""

from __future__ import annotations

import base64
import json
import pickle
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource
from lance_lightning.produce.badrows import ReplaceBadRow
from lance_lightning.write.predictions import LancePredictionWriter
from tests.predict_writer_model import AddDraw, AugmentDraw, IdModel, RejectIds, embedding_of, write_rows

COLUMNS = ["emb", "score", "name"]


class _StopAfter(pl.Callback):
    """Stops the run (a ``KeyboardInterrupt``, as a Ctrl-C) after ``batches`` batches."""

    def __init__(self, batches: int) -> None:
        self.batches, self.seen = batches, 0

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.batches:
            raise KeyboardInterrupt


def _trainer(*callbacks: pl.Callback) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=list(callbacks),
    )


def _predict(
    uri: str, writer: LancePredictionWriter, model: pl.LightningModule | None = None, *, stop: int = 0, **settings: Any
) -> pl.LightningModule:
    trainer = _trainer(writer, *([_StopAfter(stop)] if stop else []))
    ckpt = settings.pop("ckpt_path", None)
    source = LanceSource(uri, columns=["id"], filter=settings.pop("filter", None))
    dm = LanceDataModule(predict=source, batch_size=16, **settings)
    model = model or IdModel()
    if stop:
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            trainer.predict(model, datamodule=dm, return_predictions=False, ckpt_path=ckpt)
    else:
        trainer.predict(model, datamodule=dm, return_predictions=False, ckpt_path=ckpt)
    return model


def _emb_is_the_oracle(uri: str) -> None:
    table = lance.dataset(uri).to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))


@pytest.fixture
def uri(tmp_path: Path) -> str:
    path = str(tmp_path / "rows.lance")
    write_rows(path, rows=300, per_fragment=50)
    return path


def test_a_dataset_written_again_at_the_path_starts_the_run_over(
    tmp_path: Path, uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #50 (2): pieces of a deleted dataset are never committed into the one written again there."""
    run_dir = str(tmp_path / "run")  # outside the dataset: it survives the dataset's deletion
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), stop=8)
    assert list((tmp_path / "run" / "records").glob("*.json")), "the stopped run finished fragments"
    shutil.rmtree(uri)
    write_rows(uri, rows=300, per_fragment=60)  # written again: version 1 again, other data files
    with caplog.at_level("INFO"):
        model = _predict(uri, writer := LancePredictionWriter(columns=COLUMNS, run_dir=run_dir))
    assert "is not the one run" in caplog.text and "starting the run over" in caplog.text
    assert model.predicted == list(range(300)), "nothing of the deleted dataset's pieces is kept"
    latest = lance.dataset(uri)
    assert latest.version == 2 == writer.report["version"] and writer.report["rows"] == 300
    assert latest.to_table(columns=["id"])["id"].to_pylist() == list(range(300))  # every read works
    _emb_is_the_oracle(uri)
    assert latest.to_table()["name"].to_pylist() == [f"row{i}" for i in range(300)]


def test_after_the_commit_a_cleanup_keeps_the_run_done_and_a_rewrite_starts_it_over(
    tmp_path: Path, uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A committed run whose version was cleaned up (its transaction gone) is still done; once the
    dataset is written again at the path, the same command predicts it again."""
    run_dir = str(tmp_path / "run")
    _predict(uri, LancePredictionWriter(columns="emb", run_dir=run_dir), IdModel("tensor"))
    lance.dataset(uri).delete("id = 299")  # version 3: version 2 (the commit) is then cleaned up
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    model = _predict(uri, writer := LancePredictionWriter(columns="emb", run_dir=run_dir), IdModel("tensor"))
    assert model.predicted == [] and writer.report["version"] == 2 and lance.dataset(uri).version == 3
    shutil.rmtree(uri)
    write_rows(uri, rows=300, per_fragment=60)
    with caplog.at_level("INFO"):
        model = _predict(uri, writer := LancePredictionWriter(columns="emb", run_dir=run_dir), IdModel("tensor"))
    assert "starting the run over" in caplog.text and "it has no version 2" in caplog.text
    assert model.predicted == list(range(300)) and writer.report["version"] == 2
    _emb_is_the_oracle(uri)


@pytest.mark.parametrize("change", ["hparams", "weights", "class"])
def test_a_rerun_with_another_model_is_refused_naming_the_change(tmp_path: Path, uri: str, change: str) -> None:
    """Issue #50 (3): two models' outputs are never mixed; the error names what changed, both
    values and the fix; the first model then finishes the run as an uninterrupted run would."""
    run_dir = str(tmp_path / "run")
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), stop=8)
    other: pl.LightningModule = IdModel(scale=2.0) if change == "hparams" else IdModel()
    if change == "weights":
        with torch.no_grad():
            other.layer.weight.add_(1.0)
    if change == "class":
        other = _OtherModel()
    named = {"hparams": "hyperparameters", "weights": "weights", "class": "class"}[change]
    with pytest.raises(ConfigError, match=rf"would mix two models' outputs: .*{named}.* was .*, now ") as info:
        _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), other)
    assert "rerun with the first model" in info.value.fix and "delete the run folder" in info.value.fix
    assert other.predicted == [] if hasattr(other, "predicted") else True
    assert lance.dataset(uri).version == 1
    resumed = _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir))
    assert resumed.predicted == list(range(100, 300))
    _emb_is_the_oracle(uri)


class _OtherModel(IdModel):
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        outputs = super().predict_step(batch, batch_idx)
        return {**outputs, "emb": outputs["emb"] + 1}


class _Thing:  # a hyperparameter whose repr names its address, another in every process
    pass


class _ThingModel(IdModel):
    def __init__(self, thing: _Thing) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_the_same_model_with_an_object_hyperparameter_resumes(tmp_path: Path, uri: str) -> None:
    run_dir = str(tmp_path / "run")
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), _ThingModel(_Thing()), stop=8)
    resumed = _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), _ThingModel(_Thing()))
    assert resumed.predicted == list(range(100, 300))
    _emb_is_the_oracle(uri)


def test_another_checkpoint_is_refused_and_the_same_one_resumes(tmp_path: Path, uri: str) -> None:
    """The weights compared are the loaded ones: a rerun with ``ckpt_path`` of other weights is
    refused, naming both checkpoints; the first checkpoint resumes."""
    first, second = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    for path, shift in ((first, 0.0), (second, 1.0)):
        model = IdModel()
        with torch.no_grad():
            model.layer.weight.add_(shift)
        saver = _trainer()
        saver.strategy.connect(model)
        saver.save_checkpoint(path)
    run_dir = str(tmp_path / "run")
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), stop=8, ckpt_path=first)
    with pytest.raises(ConfigError, match=rf"weights .* from {first}, now .* from {second}"):
        _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), ckpt_path=second)
    resumed = _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), ckpt_path=first)
    assert resumed.predicted == list(range(100, 300))
    _emb_is_the_oracle(uri)


def test_after_the_commit_another_model_is_refused_unless_it_overwrites(uri: str) -> None:
    _predict(uri, LancePredictionWriter(columns="emb"), IdModel("tensor"))
    with pytest.raises(ConfigError, match="committed these column.* in version 2 with another model") as info:
        _predict(uri, LancePredictionWriter(columns="emb"), IdModel("tensor", scale=2.0))
    assert "overwrite: true" in info.value.fix
    _predict(uri, LancePredictionWriter(columns="emb", overwrite=True), IdModel("tensor", scale=2.0))
    table = lance.dataset(uri).to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), 2 * embedding_of(np.arange(300)))


@pytest.mark.parametrize(
    ("where", "transform"),
    [(None, AddDraw), ("id % 3 != 1", AddDraw), ("id % 3 != 1", AugmentDraw)],
    ids=["every_row", "filtered", "device_augment"],
)
def test_a_resumed_run_draws_what_an_uninterrupted_run_draws(
    tmp_path: Path, uri: str, where: str | None, transform: type
) -> None:
    """Issue #50 (4): seeded per-row randomness (`RowRandom`; `DeviceAugment(seed=...)`, seeded
    test-time augmentation) keyed by ``_position``: a resumed run reads only unfinished fragments,
    with the positions of the uninterrupted run."""
    whole = str(tmp_path / "whole.lance")
    write_rows(whole, rows=300, per_fragment=50)
    columns = [*COLUMNS, "draw"]
    _predict(whole, LancePredictionWriter(columns=columns), IdModel("draws"), transform=transform(), filter=where)
    run_dir = str(tmp_path / "run")
    settings = {"transform": transform(), "filter": where}
    _predict(uri, LancePredictionWriter(columns=columns, run_dir=run_dir), IdModel("draws"), stop=5, **settings)
    resumed = _predict(uri, LancePredictionWriter(columns=columns, run_dir=run_dir), IdModel("draws"), **settings)
    assert resumed.predicted and resumed.predicted[0] > 0, "the finished fragments were not read again"
    expected = lance.dataset(whole).to_table().select(columns)
    assert lance.dataset(uri).to_table().select(columns) == expected
    draws = expected["draw"].to_pylist()
    if transform is AugmentDraw:  # the first pixel: id * 8 unflipped, id * 8 + 3 flipped
        ids = lance.dataset(whole).to_table()["id"].to_pylist()
        flipped = {d - 8 * i for d, i in zip(draws, ids, strict=True) if d is not None}
        assert flipped == {0.0, 3.0}, "some rows are flipped, some not"
    else:
        assert len(set(draws)) > 150, "the draws are per row"


def test_a_replaced_bad_row_gets_nulls_and_is_counted_bad(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #50: ``ReplaceBadRow`` whose replacement lies in another fragment: the first run commits;
    the bad row's columns are null (not its replacement's values); the report counts it bad."""
    policy = ReplaceBadRow(seed=3)
    assert policy.candidate(7, 0, 300) // 50 != 0, "the replacement lies in another fragment than row 7"
    writer = LancePredictionWriter(columns=COLUMNS)
    with caplog.at_level("INFO"):
        _predict(uri, writer, transform=RejectIds([7]), bad_rows=policy)
    assert writer.report["version"] == 2 and writer.report["rows"] == 299 and writer.report["bad_rows"] == 1
    assert "1 bad rows (replaced by the bad-row policy) have no value (null)" in caplog.text
    table = lance.dataset(uri).to_table()
    names = table["name"].to_pylist()
    assert names[7] is None and table["emb"][7].as_py() is None and table["score"][7].as_py() is None
    assert [n for i, n in enumerate(names) if i != 7] == [f"row{i}" for i in range(300) if i != 7]


def test_bad_rows_of_a_filtered_resumed_run_are_those_of_an_uninterrupted_run(tmp_path: Path, uri: str) -> None:
    """Bad rows in fragments finished after a stop, with a filter and a deleted row (the slot of a
    position is then looked up): the resumed run's columns equal the uninterrupted run's."""
    whole = str(tmp_path / "whole.lance")
    write_rows(whole, rows=300, per_fragment=50)
    for path in (whole, uri):
        lance.dataset(path).delete("id = 200")
    settings = {"transform": RejectIds([8, 170, 263]), "bad_rows": ReplaceBadRow(seed=5), "filter": "id % 3 != 1"}
    reference = LancePredictionWriter(columns=COLUMNS)
    _predict(whole, reference, **settings)
    run_dir = str(tmp_path / "run")
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=run_dir), stop=5, **settings)
    resumed = LancePredictionWriter(columns=COLUMNS, run_dir=run_dir)
    _predict(uri, resumed, **settings)
    assert reference.report["bad_rows"] == 3 == resumed.report["bad_rows"] and resumed.report["rows"] == 196
    table = lance.dataset(uri).to_table()
    assert table.select(COLUMNS) == lance.dataset(whole).to_table().select(COLUMNS)
    names = dict(zip(table["id"].to_pylist(), table["name"].to_pylist(), strict=True))
    assert [names[i] for i in (8, 170, 263)] == [None] * 3
    assert all(names[i] == (None if i % 3 == 1 else f"row{i}") for i in names if i not in (8, 170, 263))


def test_a_second_predict_of_one_trainer_writes_nothing_and_names_the_version(
    uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #50: the second ``trainer.predict`` ended in a bare ``AssertionError`` in Lightning's loop."""
    writer = LancePredictionWriter(columns="emb")
    trainer = _trainer(writer)
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"]), batch_size=16)
    model = IdModel("tensor")
    trainer.predict(model, datamodule=dm, return_predictions=False)
    assert writer.report["version"] == 2
    with caplog.at_level("INFO"):
        trainer.predict(model, datamodule=dm, return_predictions=False)
        trainer.predict(model, datamodule=dm, return_predictions=False)
    assert caplog.text.count("nothing to write: column(s) emb") == 2 and "are in version 2" in caplog.text
    assert len(model.predicted) == 300 and lance.dataset(uri).version == 2
    assert trainer.limit_predict_batches == 1.0, "the trainer's limit is given back"
    # a new column (a data module pinned at the latest version) predicts again
    other = LancePredictionWriter(columns="emb2")
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"]), batch_size=16)
    _trainer(other).predict(model, datamodule=dm, return_predictions=False)
    assert other.report["version"] == 3 and len(model.predicted) == 600


@pytest.mark.parametrize("case", ["filter leaves fragments empty", "resumed after a stop"])
def test_a_second_predict_after_a_restricted_read_finds_its_own_run(
    uri: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Soak seed 1656: a run that read only some fragments (the filter matched no row of the last
    ones, or a rerun read the unfinished ones) left the data module's predict plan restricted, so
    the next ``predict`` of the same trainer named another run and was refused at its commit
    (its read version's Merge "changed rows")."""
    stopped = case == "resumed after a stop"
    writer = LancePredictionWriter(columns="emb")
    trainer = _trainer(writer, *([_StopAfter(5)] if stopped else []))
    source = LanceSource(uri, columns=["id"], filter=None if stopped else "id < 200")
    dm = LanceDataModule(predict=source, batch_size=16)
    model = IdModel("tensor")
    if stopped:
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            trainer.predict(model, datamodule=dm, return_predictions=False)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    assert writer.report["version"] == 2
    with caplog.at_level("INFO"):
        trainer.predict(model, datamodule=dm, return_predictions=False)
    assert dm.plans["predict"].source.filter == source.filter, "the data module reads its own split again"
    assert "nothing to write: column(s) emb" in caplog.text and "are in version 2" in caplog.text
    assert lance.dataset(uri).version == 2
    if stopped:
        _emb_is_the_oracle(uri)


def test_a_record_is_json_and_a_pickled_one_is_never_loaded(tmp_path: Path, uri: str) -> None:
    """Issue #50: the writer unpickled a schema read from the run folder (anyone who can write there
    ran code in the trainer). Records hold JSON and protobuf bytes; an old pickled record is refused."""
    run_dir = tmp_path / "run"
    _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=str(run_dir)), stop=8)
    record_path = run_dir / "records" / "0.json"
    record = json.loads(record_path.read_text())
    assert "lance_schema" in record and "schema" not in record
    pwned = tmp_path / "pwned"
    record["schema"] = base64.b64encode(pickle.dumps(_Touch(str(pwned)))).decode()
    del record["lance_schema"]
    record_path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="older lance-lightning .* never loaded"):
        _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=str(run_dir)))
    assert not pwned.exists(), "the pickled payload never ran"
    assert lance.dataset(uri).version == 1


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


@pytest.mark.parametrize("name", ["a.b", "_rowaddr", " emb"])
def test_a_column_name_lance_cannot_take_is_refused_when_the_writer_is_made(name: str) -> None:
    with pytest.raises(ConfigError, match="without dots or blanks") as info:
        LancePredictionWriter(columns=["emb", name])
    assert info.value.param == "LancePredictionWriter.columns" and info.value.value == name


class _EmptyModel(IdModel):
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        return torch.zeros(len(batch["id"]), 0)


def test_an_empty_vector_output_is_refused_at_the_first_batch_and_says_what_is_kept(tmp_path: Path, uri: str) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"shape \(16, 0\).*no values") as info:
        _predict(uri, LancePredictionWriter(columns="p", run_dir=str(run_dir)), _EmptyModel())
    tag = f"lance-lightning-predict-{json.loads((run_dir / 'run.json').read_text())['run']}-v1"
    assert f"the run folder {run_dir} and the hold tag {tag} are kept" in info.value.fix
    assert f"--release {tag}" in info.value.fix and tag in lance.dataset(uri).tags.list()
    assert lance.dataset(uri).version == 1


def test_a_run_folder_that_cannot_be_written_is_refused_before_any_batch(tmp_path: Path, uri: str) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    model = IdModel()
    with pytest.raises(ConfigError, match="prediction run folder cannot be written") as info:
        _predict(uri, LancePredictionWriter(columns=COLUMNS, run_dir=str(blocker / "run")), model)
    assert info.value.param == "LancePredictionWriter.run_dir" and model.predicted == []
