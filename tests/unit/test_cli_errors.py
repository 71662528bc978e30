"""Errors on one screen, with the fix for their cause; the CLI's end-of-run duties.

- A lance_lightning error in a CLI run is a few lines (what, parameter, value, fix), exit status 1;
  ``LANCE_LIGHTNING_TRACEBACK=1`` gives the traceback instead.
- Opening a source: a Parquet file, a missing bucket, refused credentials and a local permission
  error each get their own fix.
- Schema problems (struct/map columns, a fill value of the wrong type, `DecodeImage` on a
  non-binary column) are `ConfigError`s at ``setup()``, before any batch is read.
- A 2-rank DDP fit from the CLI exits 0; a fit without a val split does not warn about
  zero-length loaders; a fit refuses to overwrite an earlier run's checkpoints.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import lance
import lightning.pytorch as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource
from lance_lightning.open_errors import open_error
from lance_lightning.transforms import Compose, DecodeImage
from tests import zygote
from tests.helpers import RecordingModel, make_table, run_cli, write_dataset
from tests.s3_server import S3Server

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, data: str, trainer: str = "") -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 2
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
{trainer}model:
  class_path: tests.helpers.RecordingModel
data:
{data}""")
    return str(path)


def test_config_error_is_a_few_lines_and_the_traceback_is_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path, f"  train: {{uri: {tmp_path / 'missing.lance'}}}\n")
    code, _, err = run_cli(["fit", "--config", cfg])
    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 6, err
    assert "parameter: train.uri" in err and "missing.lance" in err and "fix:" in err
    assert "LANCE_LIGHTNING_TRACEBACK=1" in err

    monkeypatch.setenv("LANCE_LIGHTNING_TRACEBACK", "1")
    with pytest.raises(ConfigError, match="no Lance dataset exists there"):
        run_cli(["fit", "--config", cfg])


def test_profile_with_a_bad_transform_argument_is_a_few_lines(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 64)
    cfg = _config(
        tmp_path,
        f"""  train: {{uri: {uri}}}
  transform:
    class_path: lance_lightning.transforms.DecodeImage
    init_args: {{column: image, device: not-a-device}}
""",
    )
    code, _, err = run_cli(["profile", "--config", cfg, "--batches", "2"])
    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 6, err
    assert "parameter: DecodeImage.device" in err and "value:     'not-a-device'" in err and "fix:" in err, err


@pytest.mark.parametrize("command", [["holds", "{uri}"], ["materialize", "--uri", "{uri}", "--out-dir", "{out}"]])
def test_a_malformed_storage_option_is_one_line_with_status_2(tmp_path: Path, command: list[str]) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 8)
    args = [part.format(uri=uri, out=tmp_path / "views") for part in command]
    code, out, err = run_cli([*args, "--storage-option", "region"])
    assert code == 2 and not out, out
    assert err.strip() == f"lance-lightning {command[0]}: error: --storage-option 'region' must be KEY=VALUE", err


@pytest.mark.parametrize("command", ["fit", "profile"])
def test_a_mistyped_key_is_named_without_the_usage_dump(tmp_path: Path, command: str) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 64)
    cfg = _config(tmp_path, f"  train: {{uri: {uri}}}\n  batch_sise: 16\n")
    code, out, err = run_cli([command, "--config", cfg])
    assert code == 2
    assert "batch_sise" in err and "usage:" not in out + err and len(err.strip().splitlines()) <= 4, err


def test_a_parquet_file_as_uri_says_to_convert_it(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    pq.write_table(make_table(10), path)
    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=LanceSource(str(path))).setup("fit")
    message = str(error.value)
    assert "not a Lance dataset" in message and "lance.write_dataset" in message and "storage_options" not in message


def test_a_relative_path_hint_only_for_relative_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=LanceSource(str(tmp_path / "nothing.lance"))).setup("fit")
    assert "relative paths" not in str(error.value)


def test_local_permission_error_says_to_fix_permissions() -> None:
    """The classifier, on Lance's message for an unreadable directory (root, which runs CI, bypasses
    file permissions, so the real case runs only for other users below)."""
    error = open_error(
        "/data/x.lance",
        "train",
        "LanceError(IO): Generic LocalFileSystem error: Unable to open "
        "file /data/x.lance/_versions: Permission denied (os error 13)",
    )
    assert "permission denied" in error.problem and "read access" in error.fix
    assert "storage_options" not in str(error)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads unreadable directories")
def test_unreadable_dataset_directory_says_to_fix_permissions(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 10)
    os.chmod(uri, 0)
    try:
        with pytest.raises(ConfigError, match="read access"):
            LanceDataModule(train=LanceSource(uri)).setup("fit")
    finally:
        os.chmod(uri, 0o755)


def test_missing_bucket_names_the_bucket(s3: S3Server) -> None:
    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=LanceSource("s3://nobucket/x.lance", storage_options=s3.storage_options())).setup("fit")
    message = str(error.value)
    assert "bucket 'nobucket' does not exist" in message and "relative" not in message


def test_missing_dataset_in_a_bucket_names_the_key(s3: S3Server) -> None:
    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=LanceSource("s3://data/none.lance", storage_options=s3.storage_options())).setup("fit")
    message = str(error.value)
    assert "at that path in the bucket" in message and "relative" not in message


def test_refused_credentials_say_to_check_credentials(s3: S3Server) -> None:
    lance.write_dataset(make_table(10), "s3://data/c.lance", storage_options=s3.storage_options(), mode="overwrite")
    source = LanceSource("s3://data/c.lance", storage_options=s3.storage_options(secret="wrong-secret"))
    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=source).setup("fit")
    message = str(error.value)
    assert "refused access" in message and "AWS_SECRET_ACCESS_KEY" in message and "wrong-secret" not in message


@pytest.fixture
def typed_uri(tmp_path: Path) -> str:
    rows = 8
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "score": pa.array([None if i % 2 else float(i) for i in range(rows)], pa.float64()),
            "meta": pa.array([{"a": i, "b": "x"} for i in range(rows)]),
            "tags": pa.array([[("k", i)] for i in range(rows)], pa.map_(pa.string(), pa.int64())),
            "image": pa.array([b"not an image"] * rows, pa.binary()),
        }
    )
    uri = str(tmp_path / "typed.lance")
    lance.write_dataset(table, uri)
    return uri


@pytest.mark.parametrize("column", ["meta", "tags"])
def test_struct_and_map_columns_are_refused_at_setup(typed_uri: str, column: str) -> None:
    dm = LanceDataModule(train=LanceSource(typed_uri, columns=["id", column]), batch_size=4)
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == "train.columns" and column in str(error.value) and "drop" in error.value.fix


def test_fill_value_of_the_wrong_type_is_refused_at_setup(typed_uri: str) -> None:
    dm = LanceDataModule(
        train=LanceSource(typed_uri, columns=["id", "score"]), fill_nulls={"score": "zero"}, batch_size=4
    )
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == "fill_nulls.score" and "double" in str(error.value) and "score: 0" in error.value.fix
    ok = LanceDataModule(train=LanceSource(typed_uri, columns=["id", "score"]), fill_nulls={"score": 0}, batch_size=4)
    ok.setup("fit")
    assert [b["score"].tolist() for b in ok.train_dataloader()][0] == [0.0, 0.0, 2.0, 0.0]


@pytest.mark.parametrize("wrap", [False, True])
def test_decode_image_on_an_integer_column_is_refused_at_setup(typed_uri: str, wrap: bool) -> None:
    transform = DecodeImage(column="id")
    dm = LanceDataModule(
        train=LanceSource(typed_uri, columns=["id", "image"]),
        transform=Compose([transform]) if wrap else transform,
        batch_size=4,
    )
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == "transform.column" and "int64" in str(error.value) and "['image']" in error.value.fix


def test_a_null_hint_for_a_column_named_tokens_shows_the_column(tmp_path: Path) -> None:
    """Credential redaction applies to storage_options only: a column whose name looks secret is shown."""
    values = pa.array([1.0, None, 3.0, 4.0] * 8, pa.float32())
    uri = write_dataset(tmp_path / "ds.lance", 32, extra={"tokens": values})
    cfg = _config(tmp_path, f"  train: {{uri: {uri}, columns: [id, x, tokens]}}\n  batch_size: 8\n")
    code, _, err = run_cli(["fit", "--config", cfg])
    assert code == 1 and "fill_nulls={'tokens': <value>}" in err and "<redacted>" not in err, err


def test_a_stage_without_its_split_is_named_as_on_the_command_line(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 32)
    code, _, err = run_cli(["validate", "--config", _config(tmp_path, f"  train: {{uri: {uri}}}\n")])
    assert code == 1 and "trainer stage 'validate' reads the val split" in err and "TrainerFn" not in err, err


def test_fit_without_val_split_does_not_warn_about_empty_loaders(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 64)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=16)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(RecordingModel(), datamodule=dm)
    assert trainer.global_step == 4
    assert not [w for w in caught if "across ranks is zero" in str(w.message)]


def test_a_fit_does_not_overwrite_an_earlier_runs_checkpoints(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 64)
    ckpts = tmp_path / "ckpts"
    cfg = _config(
        tmp_path,
        f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 16\n",
        trainer=f"""\
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {ckpts}, save_last: true, enable_version_counter: false}}
""",
    )
    code, out, err = run_cli(["fit", "--config", cfg])
    assert code == 0, err
    first = (ckpts / "last.ckpt").read_bytes()
    code, _, err = run_cli(["fit", "--config", cfg])
    assert code == 1 and "ModelCheckpoint.dirpath" in err and "--ckpt_path" in err, err
    assert (ckpts / "last.ckpt").read_bytes() == first
    code, _, err = run_cli(["fit", "--config", cfg, "--trainer.max_steps=3", "--ckpt_path", str(ckpts / "last.ckpt")])
    assert code == 0, err


@pytest.mark.slow
def test_ddp_fit_from_the_cli_exits_zero(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 256, fragment_rows=64)
    cfg = _config(
        tmp_path,
        f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 16\n",
        trainer="""\
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {every_n_train_steps: 3, save_last: true}
""",
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("LOCAL_RANK", None)
    # subprocess.run's process, forked from the test zygote (rank 0's imports done; Lightning starts rank 1 fresh).
    result = zygote.run(
        [
            sys.executable,
            "-m",
            "lance_lightning.cli",
            "fit",
            "--config",
            cfg,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=1",
            "--trainer.max_steps=-1",
        ],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        timeout=480,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("resume with: ") == 1  # rank 0 only
    last = next((tmp_path / "root").rglob("last.ckpt"))
    assert torch.load(last, weights_only=True)["global_step"] == 256 // 2 // 16  # the final step, not step 6
