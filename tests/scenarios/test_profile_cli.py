"""``lance-lightning profile``: the data pipeline of a training config alone, with the report."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
READERS = min(4, os.cpu_count() or 1)  # the data module's default reader_threads
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"


class SlowTransform:
    """Sleeps ``seconds`` per batch: a deliberately slow decode."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


def _config(tmp_path: Path, uri: str, data: str = "") -> str:
    # A full fit config: the model class does not exist, so building it (or the trainer) would fail.
    text = f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 3
  callbacks:
    - class_path: lance_lightning.DataLoadingMonitor
model:
  class_path: no_such_package.NoSuchModel
  init_args: {{lr: 0.1}}
optimizer: null
ckpt_path: null
data:
  train: {{uri: {uri}, columns: [id, x, vec]}}
  batch_size: 16
{data}"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "profile.lance", 400, fragment_rows=100)


def test_profile_runs_only_the_data_pipeline_for_n_batches(tmp_path, uri):
    cfg = _config(tmp_path, uri)
    code, out, err = run_cli(["profile", "--config", cfg, "--batches", "60"])  # 25 batches per epoch
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0] == (
        f"Loader-only profile of the train split (0 workers, {READERS} reader threads, batch_size 16): "
        f"60 batches, {60 * 16:,} rows in " + lines[0].rsplit(" in ", 1)[1]
    )
    assert "-bound: " in lines[1] and "no model" in lines[1]
    assert lines[2].startswith("  first thing to change: ")
    assert "loader ceiling" in out and "storage (I/O wait)" in out and "MB read in" in out
    assert "profiling train" in err and "60/60" in err  # the progress bar
    assert not (tmp_path / "lightning_logs").exists()  # no trainer ran


def test_profile_names_decoding_for_a_slow_transform(tmp_path, uri):
    # 50 ms a batch: many times a 16-row take even on a loaded machine (at 10 ms a loaded run was
    # once found storage-bound).
    cfg = _config(
        tmp_path,
        uri,
        data=(
            "  shuffle: {class_path: lance_lightning.RowShuffle, init_args: {seed: 1}}\n"
            "  transform: {class_path: tests.scenarios.test_profile_cli.SlowTransform, init_args: {seconds: 0.05}}\n"
        ),
    )
    code, out, err = run_cli(["profile", "--config", cfg, "--batches", "30", "--progress", "false"])
    assert code == 0, err[-3000:]
    assert "decode-bound: " in out and "(SlowTransform)" in out, out
    assert f"raise `reader_threads` ({READERS} now" in out
    assert "profiling" not in err


def test_profile_names_storage_for_single_row_takes(tmp_path, uri):
    cfg = _config(tmp_path, uri, data="  shuffle: {class_path: lance_lightning.RowShuffle, init_args: {seed: 1}}\n")
    code, out, err = run_cli(["profile", "--config", cfg, "--batches", "50", "--progress", "false"])
    assert code == 0, err[-3000:]
    assert "storage-bound: " in out, out
    assert "set `shuffle.clump_rows` to 64 or more" in out


def test_profile_command_line_overrides_and_workers(tmp_path, uri, monkeypatch):
    # The workers read every batch (no hand-over: 20 batches are read in process before a cold fork
    # server is ready, and a report of workers that never started shows no worker figures, #51).
    monkeypatch.setenv("LANCE_LIGHTNING_WORKER_HANDOFF", "off")
    cfg = _config(tmp_path, uri)
    code, out, err = run_cli(
        [
            "profile",
            "--config",
            cfg,
            "--data.num_workers=1",
            "--data.batch_size=8",
            "--batches",
            "20",
            "--progress",
            "false",
        ]
    )
    assert code == 0, err[-3000:]
    assert out.startswith(
        f"Loader-only profile of the train split (1 workers, {READERS} reader threads, batch_size 8): "
        "20 batches, 160 rows"
    )
    assert "worker output" in out and "workers (transfer)" in out and "(per worker)" in out


def test_profile_errors_name_the_problem(tmp_path, uri):
    cfg = _config(tmp_path, uri)
    code, _, err = run_cli(["profile", "--config", cfg, "--split", "val"])
    assert code == 1  # a ConfigError, as for `fit` (a parser error is 2)
    assert "lance-lightning profile: error: the config has no val split to profile\n  parameter: val" in err
    code, _, err = run_cli(["profile", "--config", cfg, "--batches", "0"])
    assert code == 1 and "error: must be an integer >= 1\n  parameter: batches\n  value:     0" in err
    code, _, err = run_cli(["profile", "--config", cfg, "--data.batch_sise=3"])
    assert code != 0 and "batch_sise" in err


def test_profile_the_quickstart_config(tmp_path, monkeypatch):
    from examples.digits import prepare

    digits = prepare(str(tmp_path / "digits.lance"))
    monkeypatch.chdir(REPO_ROOT)  # examples.digits resolves from the working directory
    code, out, err = run_cli(
        [
            "profile",
            "--config",
            str(QUICKSTART),
            f"--data.train.uri={digits}",
            f"--data.val.uri={digits}",
            "--batches",
            "30",
            "--progress",
            "false",
        ]
    )
    assert code == 0, err[-3000:]
    assert out.startswith(
        f"Loader-only profile of the train split (0 workers, {READERS} reader threads, batch_size 64): "
        "30 batches, 1,920 rows"
    )
    assert "decode/transform" in out and "batches ready when asked" in out  # DecodeImage runs per batch


@pytest.mark.slow
def test_console_script_profile(tmp_path, uri):
    script = Path(sys.executable).parent / "lance-lightning"
    cfg = _config(tmp_path, uri)
    result = subprocess.run(
        [str(script), "profile", "--config", cfg, "--batches", "10"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Loader-only profile of the train split" in result.stdout and "10 batches" in result.stdout
    assert "10/10" in result.stderr


def test_profile_help_lists_its_options_without_importing_lightning():
    code = (
        "import sys\n"
        "from lance_lightning.cli import main\n"
        "try:\n"
        "    main(['profile', '--help'])\n"
        "except SystemExit as stop:\n"
        "    assert stop.code in (0, None), stop.code\n"
        "print('LOADED', sorted(m for m in ('lightning', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "--batches" in result.stdout and "--split" in result.stdout and "fit --help" in result.stdout
    assert "--replay REPLAY" in result.stdout and "--replay_steps REPLAY_STEPS" in result.stdout
    assert "LOADED []" in result.stdout
