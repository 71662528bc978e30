"""The prediction writer through the command line (``lance-lightning predict --config`` in a
subprocess), as issue #50's testers ran it: a run SIGKILLed after some batches, then the dataset
written again or the model changed, then the same command; a twin run of the same command that
commits first; bad names and empty outputs ending on one screen; and, through ``Trainer.predict``,
a dataset on an S3-compatible server (moto on loopback) without ``run_dir``. The oracle is the
model's function of each row's ``id`` (`embedding_of`), what an uninterrupted run writes.

The two reruns after a SIGKILL start from the same killed command (`killed_run`: one run for the
module; each test reruns on what it left, put back at the path it ran at)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import boto3
import lance
import lightning.pytorch as pl
import numpy as np
import pytest

from lance_lightning import LanceDataModule, LancePredictionWriter, LanceSource
from tests.helpers import restorer
from tests.predict_writer_model import IdModel, embedding_of, write_rows
from tests.reliability.helpers import ONE_SCREEN_LINES, REPO_ROOT, error_screen, run_command
from tests.s3_server import S3Server

pytestmark = pytest.mark.slow

KILLED = -9


def _config(
    root: Path,
    uri: str,
    run_dir: Path | None,
    *,
    kill_after: int = 0,
    twin: str = "",
    columns: str = "[emb, score, name]",
) -> Path:
    """A predict config of `IdModel` writing ``columns``; with ``kill_after``, SIGKILLed after that
    many batches; with ``twin``, the config a twin run is launched with before the writer commits."""
    callbacks = []
    if twin:
        callbacks.append(
            f"    - class_path: tests.predict_writer_model.TwinAtEnd\n      init_args: {{config: {twin}}}\n"
        )
    run = f", run_dir: {run_dir}" if run_dir else ""
    callbacks.append(
        "    - class_path: lance_lightning.LancePredictionWriter\n"
        f"      init_args: {{columns: {columns}, flush_rows: 40{run}}}\n"
    )
    if kill_after:
        callbacks.append(
            f"    - class_path: tests.predict_writer_model.KillAfter\n      init_args: {{batches: {kill_after}}}\n"
        )
    path = root / f"predict{kill_after or ''}{'-twin' if twin else ''}.yaml"
    path.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 1\n  logger: false\n  enable_progress_bar: false\n"
        "  enable_model_summary: false\n  enable_checkpointing: false\n  callbacks:\n"
        + "".join(callbacks)
        + "model:\n  class_path: tests.predict_writer_model.IdModel\ndata:\n"
        f"  predict: {{uri: {uri}, columns: [id]}}\n  batch_size: 16\n"
    )
    return path


def _emb_is_the_oracle(uri: str, rows: int = 300) -> None:
    table = lance.dataset(uri).to_table()
    assert table["id"].to_pylist() == list(range(rows))
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """One ``lance-lightning predict`` on a new dataset of 300 rows (fragments of 50), SIGKILLed after
    6 batches, checked to have finished a fragment and committed nothing. Gives a function that puts
    the folder it ran in (``rows.lance``, the run folder ``run``) back as the kill left it and returns
    it: at the same path, since a run is named by its dataset's location."""
    root = tmp_path_factory.mktemp("killed_predict")
    uri, run_dir = str(root / "rows.lance"), root / "run"
    write_rows(uri, rows=300, per_fragment=50)
    config = _config(tmp_path_factory.mktemp("killed_config"), uri, run_dir, kill_after=6)
    code, output = run_command(["predict", "--config", str(config)])
    assert code == KILLED, output[-3000:]
    assert list((run_dir / "records").glob("*.json")), "the killed run had finished a fragment"
    assert lance.dataset(uri).version == 1, "a killed run commits nothing"
    return restorer(root, tmp_path_factory.mktemp("killed_predict_pristine"))


def test_a_killed_run_rerun_on_a_dataset_written_again_starts_over_and_reads(
    tmp_path: Path, killed_run: Callable[[], Path]
) -> None:
    """Issue #50 (2): the rerun committed the deleted dataset's fragments (every read then failed
    with 'Not found: .../data/<a file of the deleted dataset>.lance')."""
    root = killed_run()  # SIGKILLed after 6 batches (`killed_run`), a fragment finished
    uri, run_dir = str(root / "rows.lance"), root / "run"
    assert list((run_dir / "records").glob("*.json")), "the killed run had finished a fragment"
    shutil.rmtree(uri)
    write_rows(uri, rows=300, per_fragment=60)
    code, output = run_command(["predict", "--config", str(_config(tmp_path, uri, run_dir))])
    assert code == 0, output[-3000:]
    assert "is not the one run" in output and "starting the run over" in output
    assert "committed as version 2" in output
    assert lance.dataset(uri).to_table(columns=["id"]).num_rows == 300  # reading only `id` works
    _emb_is_the_oracle(uri)


def test_a_killed_run_rerun_with_another_model_is_refused_then_finishes_with_the_first(
    tmp_path: Path, killed_run: Callable[[], Path]
) -> None:
    """Issue #50 (3): ids 1-1999 held the first model's outputs and 2000-3999 the second's."""
    root = killed_run()  # SIGKILLed after 6 batches (`killed_run`)
    uri, run_dir = str(root / "rows.lance"), root / "run"
    config = str(_config(tmp_path, uri, run_dir))
    code, output = run_command(["predict", "--config", config, "--model.init_args.scale=2.0"])
    screen = error_screen(output)
    assert code == 1 and len(screen) <= ONE_SCREEN_LINES and "Traceback" not in output, output[-3000:]
    assert "would mix two models' outputs" in output and "hyperparameters" in output and '"scale": 2.0' in output
    assert f"delete the run folder {run_dir}" in output
    assert lance.dataset(uri).version == 1
    code, output = run_command(["predict", "--config", config])
    assert code == 0 and "committed as version 2" in output, output[-3000:]
    _emb_is_the_oracle(uri)


def test_a_twin_run_that_committed_first_is_reported_not_blamed(tmp_path: Path) -> None:
    """Issue #50: two runs of one command; the second blamed 'version 2 (Merge) changed rows' (its
    twin's commit) and advised deleting the run folder."""
    uri = str(tmp_path / "rows.lance")
    write_rows(uri, rows=300, per_fragment=50)
    twin = _config(tmp_path, uri, None)
    code, output = run_command(["predict", "--config", str(_config(tmp_path, uri, None, twin=str(twin)))])
    assert code == 0, output[-3000:]
    assert "committed as version 2" in twin.with_suffix(".log").read_text()
    assert "are in version 2, committed by another run of the same command" in output
    assert "changed rows" not in output and lance.dataset(uri).version == 2
    _emb_is_the_oracle(uri)


@pytest.mark.parametrize(
    ("columns", "model", "named"),
    [("[emb, a.b]", "", "a.b"), ("p", "--model.init_args.outputs=empty", "size 0")],
    ids=["dotted_name", "empty_vectors"],
)
def test_bad_names_and_empty_outputs_end_on_one_screen(tmp_path: Path, columns: str, model: str, named: str) -> None:
    uri = str(tmp_path / "rows.lance")
    write_rows(uri, rows=300, per_fragment=50)
    config = _config(tmp_path, uri, tmp_path / "run", columns=columns)
    code, output = run_command(["predict", "--config", str(config), *([model] if model else [])])
    screen = error_screen(output)
    assert code == 1 and len(screen) <= ONE_SCREEN_LINES and "Traceback" not in output, output[-4000:]
    assert named in output and lance.dataset(uri).version == 1
    if not model:  # refused when the writer is made: nothing predicted, no run folder
        assert "LancePredictionWriter.columns" in output and not (tmp_path / "run").exists()
    if model:  # refused at the first batch: the kept run folder and hold are said
        assert f"the run folder {tmp_path / 'run'}" in output and "--release lance-lightning-predict-" in output


def test_an_s3_dataset_without_run_dir_keeps_its_run_folder_in_the_store(s3: S3Server) -> None:
    """Issue #50: the run folder ignored ``storage_options`` and went to the public endpoint."""
    uri, options = "s3://data/predict_reruns.lance", s3.storage_options()
    lance.write_dataset(_rows_table(120), uri, max_rows_per_file=40, storage_options=options)
    writer = LancePredictionWriter(columns="emb")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[writer])
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"], storage_options=options), batch_size=16)
    trainer.predict(IdModel("tensor"), datamodule=dm, return_predictions=False)
    assert writer.report["version"] == 2 and writer.report["rows"] == 120
    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name="us-east-1",
    )
    keys = [item["Key"] for item in client.list_objects_v2(Bucket="data", Prefix="predict_reruns.lance/")["Contents"]]
    assert f"predict_reruns.lance/_lance_lightning/predict/{writer.report['run']}/marker.json" in keys
    table = lance.dataset(uri, storage_options=options).to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))
    again = LancePredictionWriter(columns="emb")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[again])
    dm = LanceDataModule(predict=LanceSource(uri, columns=["id"], storage_options=options), batch_size=16)
    trainer.predict(IdModel("tensor"), datamodule=dm, return_predictions=False)
    assert again.report["version"] == 2, "the rerun finds the marker in the store"


def _rows_table(rows: int):  # noqa: ANN202 - a pyarrow table
    import pyarrow as pa

    return pa.table({"id": np.arange(rows, dtype=np.int64), "x": np.arange(rows, dtype=np.float32)})


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root writes anywhere")
def test_a_read_only_dataset_folder_is_refused_before_any_batch() -> None:
    """Issue #50: a read-only dataset folder failed with a long traceback. As root (CI), the command
    runs as ``nobody`` (setpriv), to whom the root-owned dataset folder is read-only."""
    base = Path(tempfile.mkdtemp(prefix="ro-predict-"))
    try:
        base.chmod(0o755)
        uri, run = str(base / "rows.lance"), base / "run"
        write_rows(uri, rows=300, per_fragment=50)
        run.mkdir()
        drop: list[str] = []
        if os.geteuid() == 0:
            os.chown(run, 65534, 65534)
            drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        else:
            for folder in [Path(uri), *Path(uri).rglob("*")]:
                if folder.is_dir():
                    folder.chmod(0o555)
        config = _config(base, uri, run)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": str(run)}
        env.pop("LANCE_LIGHTNING_TRACEBACK", None)
        command = [*drop, str(Path(sys.executable).with_name("lance-lightning")), "predict", "--config", str(config)]
        done = subprocess.run(command, cwd=run, env=env, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        screen = error_screen(output)
        assert done.returncode == 1 and len(screen) <= ONE_SCREEN_LINES and "Traceback" not in output, output[-3000:]
        assert "its data folder cannot be written" in output and uri in output and "table: <uri>" in output
        assert lance.dataset(uri).version == 1 and not list(run.glob("pieces/*/*")), "nothing was predicted"
    finally:
        for folder in [base, *base.rglob("*")]:
            if folder.is_dir():
                folder.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
