"""The ``lance-lightning`` LightningCLI: YAML configs, --print_config round trip, the real
quickstart config, typo errors and the console script."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import assert_one_saved_cursor, run_cli, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"


def _config(tmp_path: Path, uri: str, *, shuffle: str = "lance_lightning.RowShuffle", max_steps: int = 3) -> str:
    text = f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: {max_steps}
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  default_root_dir: {tmp_path / "root"}
  callbacks:
    - class_path: lance_lightning.DataCursorCheckpoint
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x], filter: "label < 5"}}
  val: {{uri: {uri}, columns: [id, x], filter: "label >= 5"}}
  batch_size: 16
  shuffle:
    class_path: {shuffle}
    init_args: {{seed: 3}}
  filter_read:
    class_path: lance_lightning.FilterRead
    init_args: {{method: take}}
"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def cli_uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "cli.lance", 400, fragment_rows=100)


def test_fit_from_yaml_in_process(tmp_path, cli_uri):
    cfg = _config(tmp_path, cli_uri, max_steps=3)
    code, out, _ = run_cli(["fit", "--config", cfg])
    assert code == 0
    assert f"checkpoints: {tmp_path / 'root' / 'checkpoints'}" in out
    ckpts = list((tmp_path / "root" / "checkpoints").glob("*.ckpt"))
    assert len(ckpts) == 1, ckpts
    ckpt = torch.load(ckpts[0], weights_only=True)  # cursor and hparams are plain types
    assert ckpt["global_step"] == 3
    cursor = ckpt["LanceDataModule"]["train_cursor"]
    assert cursor["steps"] == 3 and cursor["rows_consumed"] == 3 * 16
    assert cursor["plan"]["filter"] == "label < 5" and cursor["plan"]["rows"] == 200
    assert cursor["plan"]["shuffle"] == {"strategy": "RowShuffle", "seed": 3, "clump_rows": 1}
    assert_one_saved_cursor(ckpt)
    saved = yaml.safe_load((tmp_path / "root" / "config.yaml").read_text())  # SaveConfigCallback
    assert saved["data"]["shuffle"]["class_path"] == "lance_lightning.RowShuffle"
    assert saved["data"]["filter_read"]["init_args"]["method"] == "take"


def test_print_config_round_trips(tmp_path, cli_uri):
    cfg = _config(tmp_path, cli_uri)
    code, printed, _ = run_cli(["fit", "--config", cfg, "--print_config"])
    assert code == 0, printed
    parsed = yaml.safe_load(printed)
    data = parsed["data"]
    assert data["shuffle"] == {"class_path": "lance_lightning.RowShuffle", "init_args": {"seed": 3, "clump_rows": 1}}
    assert data["filter_read"] == {
        "class_path": "lance_lightning.FilterRead",
        "init_args": {"method": "take", "take_below": 0.05},
    }
    assert data["batch_size"] == 16
    assert data["train"] == {
        "uri": cli_uri,
        "columns": ["id", "x"],
        "filter": "label < 5",
        "version": None,
        "storage_options": None,
        "prepare": None,
        "asof": None,
        "allow_incomplete": False,
        "namespace": None,
        "table_id": None,
    }
    for key in ("num_workers", "multiprocessing_context", "fill_nulls", "drop_last", "resume_data", "transform"):
        assert key in data
    assert parsed["model"]["class_path"] == "tests.helpers.RecordingModel"

    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    code, reprinted, _ = run_cli(["fit", "--config", str(again), "--print_config"])
    assert code == 0
    assert reprinted == printed


def test_print_config_shows_effective_defaults(tmp_path, cli_uri):
    """With no `shuffle` / `filter_read` in the YAML, the printed config should say what runs."""
    path = tmp_path / "minimal.yaml"
    path.write_text(f"model:\n  class_path: tests.helpers.RecordingModel\ndata:\n  train: {{uri: {cli_uri}}}\n")
    code, printed, _ = run_cli(["fit", "--config", str(path), "--print_config"])
    assert code == 0
    data = yaml.safe_load(printed)["data"]
    assert data["shuffle"] is not None and data["shuffle"]["class_path"].endswith("NoShuffle"), data["shuffle"]
    assert data["filter_read"] is not None and data["filter_read"]["init_args"]["method"] == "auto"


def test_strategy_class_typo_names_bad_value(tmp_path, cli_uri):
    cfg = _config(tmp_path, cli_uri, shuffle="lance_lightning.RowShufle")
    code, out, err = run_cli(["fit", "--config", cfg])
    assert code != 0
    message = out + err
    assert "data.shuffle" in message
    assert "lance_lightning.RowShufle" in message
    assert not (tmp_path / "root").exists()  # nothing ran


def test_short_strategy_name_override(tmp_path, cli_uri):
    cfg = _config(tmp_path, cli_uri)
    code, printed, _ = run_cli(
        ["fit", "--config", cfg, "--data.shuffle=ShardShuffle", "--data.shuffle.shard_rows=32", "--print_config"]
    )
    assert code == 0
    shuffle = yaml.safe_load(printed)["data"]["shuffle"]
    assert shuffle["class_path"] == "lance_lightning.ShardShuffle"
    assert shuffle["init_args"]["shard_rows"] == 32


@pytest.mark.slow
def test_quickstart_config_runs_and_resumes(tmp_path, monkeypatch):
    """The shipped configs/quickstart.yaml, on the real digits data, redirected into tmp_path: the last
    checkpoint holds the final step, every run writes its own checkpoints, the printed command resumes."""
    from examples.digits import prepare

    uri = prepare(str(tmp_path / "digits.lance"))
    monkeypatch.chdir(tmp_path)  # the config's relative runs/ paths land here
    root = tmp_path / "runs" / "quickstart"
    common = [
        "--config",
        str(QUICKSTART),
        f"--data.train.uri={uri}",
        f"--data.val.uri={uri}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    code, out, _ = run_cli(["fit", *common, "--trainer.max_epochs=1"])
    assert code == 0
    last = root / "tensorboard" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file(), out
    ckpt = torch.load(last, weights_only=True)
    steps = 1437 // 64  # 22: every_n_train_steps=20 alone would leave last.ckpt at step 20
    assert ckpt["global_step"] == steps
    assert ckpt["LanceDataModule"]["train_cursor"]["plan"]["filter"] == "split = 'train'"
    assert (root / "tensorboard" / "version_0" / "config.yaml").is_file()
    resume = next(line for line in out.splitlines() if line.startswith("resume with: "))
    command = shlex.split(resume[len("resume with: ") :])
    # in-process, the program is `lance-lightning`; the checkpoint is relative to the directory the fit ran in
    assert command[:2] == ["lance-lightning", "fit"] and command[-2:] == [
        "--ckpt_path",
        str(last.relative_to(tmp_path)),
    ]
    assert command[2:-2] == common + ["--trainer.max_epochs=1"]

    # The printed command (one more epoch) continues the run; its checkpoints go to version_1.
    code, out, _ = run_cli([*command[1:-2], "--trainer.max_epochs=2", "--ckpt_path", str(last)])
    assert code == 0
    assert torch.load(last, weights_only=True)["global_step"] == steps  # the first run's checkpoint is kept
    resumed = torch.load(root / "tensorboard" / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 2 * steps
    assert resumed["LanceDataModule"]["train_cursor"]["epoch"] == 1


@pytest.mark.slow
def test_console_script_help():
    script = Path(sys.executable).parent / "lance-lightning"
    assert script.is_file(), script
    result = subprocess.run(
        [str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr
    assert "fit" in result.stdout and "validate" in result.stdout and "--config" in result.stdout
