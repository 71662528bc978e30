"""The compute floor end to end: a fit with a slowed decode, and ``lance-lightning profile --replay``.

Real Lance datasets, a real Trainer with a TensorBoard logger read back, the CLI in a subprocess.
Attribution and structure are asserted, never a timing margin.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lance_lightning import DataLoadingMonitor, LanceDataModule, LanceSource, NoShuffle
from lance_lightning.metrics.figures import REPLAY_PARTS
from tests.helpers import RecordingModel, run_cli, run_cli_process, write_dataset

STEPS = 15


class SlowTransform:
    """Sleeps ``seconds`` per batch: a deliberately slow decode."""

    def __init__(self, seconds: float = 0.02) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("replay_probe") / "ds.lance", 400, fragment_rows=100)


def test_a_slow_decode_is_the_attributed_wait_in_the_report_and_the_scalars(uri, tmp_path, capsys):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]),
        batch_size=16,
        shuffle=NoShuffle(),
        reader_threads=1,
        transform=SlowTransform(0.02),
    )
    monitor = DataLoadingMonitor(replay_batches=4, replay_steps=8)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=TensorBoardLogger(str(tmp_path), name="tb"),
        log_every_n_steps=5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
    )
    trainer.fit(RecordingModel(), datamodule=dm)

    floor = monitor.replay
    shares = {part: floor[f"wait_share/{part}"] for part in REPLAY_PARTS}
    assert monitor.diagnosis.bottleneck == "decode"
    assert max(shares, key=shares.__getitem__) == "decode", shares
    # The report printed at the end of fit carries the floor and the same attribution.
    out = capsys.readouterr().out
    report = out[out.index("Data loading report: ") :]
    assert "decode-bound: " in report and "(SlowTransform)" in report
    lines = {line.split("   ")[0].strip(): line for line in report.splitlines() if line.startswith("  ")}
    assert "8 steps on 4 cached batch(es), data for free" in lines["compute floor (replay)"]
    assert f"wait for data {floor['wait_share']:.1%}" in lines["real step cycle"]
    by_part = lines["wait for data by part"]
    assert f"decode/transform {shares['decode']:.1%}" in by_part and f"storage {shares['storage']:.1%}" in by_part
    assert f"{floor['speedup']:.2f}x" in lines["speed-up from the data"]
    # TensorBoard holds the same figures, once, at the last training step.
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("step_s", "real_step_s", "speedup", *(f"wait_share/{part}" for part in REPLAY_PARTS)):
        assert f"data/replay/{name}" in tags, name
        (scalar,) = events.Scalars(f"data/replay/{name}")
        assert scalar.step == STEPS - 1 and scalar.value == pytest.approx(floor[name], rel=1e-5), name
    assert {f"data/{name}" for name in ("wait_fraction", "decode_s")} <= tags  # the monitor's own figures


def _config(tmp_path: Path, uri: str) -> str:
    # A fit config with a logger and a checkpoint callback: profile --replay must write neither.
    text = f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 3
  default_root_dir: {tmp_path / "runs"}
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: {tmp_path / "runs"}, name: tb}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{every_n_train_steps: 2, save_last: true}}
    - class_path: lance_lightning.DataCursorCheckpoint
    - class_path: lance_lightning.DataLoadingMonitor
model:
  class_path: tests.helpers.RecordingModel
ckpt_path: null
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: 16
"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_profile_replay_fits_the_model_and_prints_the_compute_floor(uri, tmp_path):
    cfg = _config(tmp_path, uri)
    args = ["profile", "--config", cfg, "--replay", "3", "--batches", "12", "--replay_steps", "5", "--progress=false"]
    code, output = run_cli_process(args, cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert "Fit profile of the train split with the model: 12 training steps, then the replay probe" in output
    assert "Data loading report: 12 batches, 192 rows in " in output
    assert "compute floor (replay)" in output and "5 steps on 3 cached batch(es), data for free" in output
    assert "wait for data by part" in output and "speed-up from the data   " in output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "lightning_logs").exists()  # nothing written


def test_profile_replay_refuses_bad_input_before_building_anything(uri, tmp_path):
    cfg = Path(_config(tmp_path, uri))
    cfg.write_text(cfg.read_text().replace("tests.helpers.RecordingModel", "no_such_package.NoSuchModel"))
    cases = {  # a ConfigError: exit status 1 and its few lines, as for `fit`
        ("--replay", "0"): "must be an integer >= 1\n  parameter: replay\n  value:     0\n  fix:       pass the number",
        ("--replay", "two"): "must be an integer >= 1\n  parameter: replay\n  value:     'two'",
        ("--replay", "2.5"): "must be an integer >= 1\n  parameter: replay\n  value:     2.5",
        ("--replay", "2", "--replay_steps", "0"): "must be an integer >= 1\n  parameter: replay_steps",
        ("--replay", "20", "--batches", "10"): "caches more batches than the fit trains (`--batches` 10)",
        ("--replay", "2", "--split", "val"): "`--replay` replays training steps: it profiles the train split",
    }
    for extra, message in cases.items():
        code, _, err = run_cli(["profile", "--config", str(cfg), *extra])
        assert code == 1 and f"lance-lightning profile: error: {message}" in err, (extra, err[-2000:])
    assert not (tmp_path / "runs").exists()
