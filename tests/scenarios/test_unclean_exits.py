"""How runs end, as a user meets it: ``lance-lightning`` in a subprocess, ``Trainer.fit`` in-process.

- SIGTERM during the replay probe (``DataLoadingMonitor(replay_batches=...)`` in a fit config, and
  ``lance-lightning profile --replay``) stops it at the next step, exit status 143.
- Without the ``ray`` extra (simulated: a ``ray`` package on ``PYTHONPATH`` whose import fails), a
  ``RayCheckpointReport`` in YAML says to install ``lance-lightning[ray]``, and
  ``examples/gpt_mixture.py --ray`` says so before writing anything, so the command without
  ``--ray`` then runs.
- A checkpoint whose ``pytorch-lightning_version`` was edited to an older version is named with
  the field under ``Trainer.fit``'s traceback (the CLI's one-screen case is in
  ``tests/reliability/test_one_screen.py``).
- The printed ``resume with:`` line of a fit started with ``uv run`` runs as printed from the same
  directory; resuming the finished run says it is complete, trains nothing and leaves no new
  ``version_N`` folder; no fit ends with Lightning's "`weights_only` was not set" line.
- ``lance-lightning profile`` ends on a `ConfigError` with status 1, as ``fit`` does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from lance_lightning import LanceDataModule, LanceSource
from tests import zygote
from tests.helpers import RecordingModel, run_cli, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Environment variable naming the file `ReplayMarkerModel` writes when the replay begins.
MARKER_ENV = "LANCE_LIGHTNING_TEST_REPLAY_MARKER"
#: Replayed steps: hours on any machine, so a run that ignores SIGTERM cannot pass the bound below.
REPLAY_STEPS = 10_000_000
#: Seconds from SIGTERM to the exit: generous for a loaded machine, far below the replay's length.
SIGTERM_EXIT_BOUND_S = 120
WEIGHTS_ONLY_LINE = "`weights_only` was not set"


class ReplayMarkerModel(pl.LightningModule):
    """A tiny regression on ``x`` that writes its process id to the file
    ``$LANCE_LIGHTNING_TEST_REPLAY_MARKER`` at its first training step beyond ``max_steps``: the
    replay probe's first step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.calls = 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.trainer.max_steps + 1:
            marker = Path(os.environ[MARKER_ENV])
            marker.with_suffix(".tmp").write_text(str(os.getpid()))
            marker.with_suffix(".tmp").rename(marker)  # whole when it appears
        x = batch["x"].float().reshape(-1, 1)
        return (self.layer(x) - x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "ds.lance", 320, fragment_rows=80)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "LANCE_LIGHTNING_TRACEBACK"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*extra.pop("PREPEND", "").split(os.pathsep), str(REPO_ROOT)) if p)
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _without_ray(tmp_path: Path) -> str:
    """A folder to put first on ``PYTHONPATH``: its ``ray`` package fails to import, as without the extra."""
    shim = tmp_path / "no_ray" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'ray\' (test: no ray extra)", name="ray")\n')
    return str(shim.parent)


# -- SIGTERM during the replay probe ---------------------------------------------------------------
def _replay_config(tmp_path: Path, uri: str) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(f"""\
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 6
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
  callbacks:
    - class_path: lance_lightning.DataLoadingMonitor
      init_args: {{replay_batches: 2, replay_steps: {REPLAY_STEPS}}}
model:
  class_path: tests.scenarios.test_unclean_exits.ReplayMarkerModel
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: 16
  reader_threads: 1
""")
    return path


@pytest.mark.parametrize("command", ["fit", "profile"])
def test_sigterm_during_the_replay_probe_stops_it_with_status_143(tmp_path: Path, uri: str, command: str) -> None:
    """The command runs in its own session, forked from the test zygote (`tests.zygote`: the process
    a fresh start gives, its own pid and signal dispositions, less the imports); the SIGTERM goes to
    the pid its replay wrote."""
    config = _replay_config(tmp_path, uri)
    marker = tmp_path / "replaying"
    args = ["fit", "--config", str(config)]
    if command == "profile":
        args = ["profile", "--config", str(config), "--replay", "2", "--replay_steps", str(REPLAY_STEPS)]
        args += ["--batches", "6", "--progress", "false"]
    ended: list[zygote.Grouped] = []
    launch = threading.Thread(
        target=lambda: ended.append(
            zygote.run_in_session(
                [sys.executable, "-m", "lance_lightning.cli", *args],
                cwd=tmp_path,
                env=_env(**{MARKER_ENV: str(marker)}),
                timeout=400 + SIGTERM_EXIT_BOUND_S,
                spare=False,
            )
        ),
        daemon=True,
    )
    launch.start()
    pid = None
    try:
        deadline = time.monotonic() + 400
        while not marker.exists() and launch.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not marker.exists():
            launch.join(timeout=30)
            output = ended[0].output[-3000:] if ended else ""
            pytest.fail(f"the replay never began ({ended[0].returncode if ended else 'still running'}):\n{output}")
        pid = int(marker.read_text())
        os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        launch.join(timeout=SIGTERM_EXIT_BOUND_S)
        if launch.is_alive():
            pytest.fail(
                f"still replaying {SIGTERM_EXIT_BOUND_S} s after SIGTERM ({REPLAY_STEPS} steps would take hours)"
            )
        elapsed = time.monotonic() - sent
    finally:
        if launch.is_alive() and pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # its session: run_in_session then returns
        launch.join(timeout=60)
    done = ended[0]
    assert done.returncode == 143, f"exit {done.returncode} after {elapsed:.1f} s:\n{done.output[-3000:]}"
    assert "compute floor" not in done.output, "a stopped replay reports no floor"


# -- without the ray extra ---------------------------------------------------------------------
def test_a_ray_callback_in_yaml_without_the_extra_says_to_install_it(tmp_path: Path, uri: str) -> None:
    config = tmp_path / "ray.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 2
  logger: false
  callbacks:
    - class_path: lance_lightning.integrations.ray.RayCheckpointReport
      init_args: {{every_n_train_steps: 1}}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x]}}
""")
    env = _env(PREPEND=_without_ray(tmp_path))
    command = [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    code, output = done.returncode, done.stdout + done.stderr
    assert code == 2, output[-3000:]
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 6, output[-3000:]
    assert "trainer.callbacks" in output and "RayCheckpointReport" in output, output
    assert "install `lance-lightning[ray]`" in output, output


def test_gpt_example_with_ray_but_without_the_extra_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpt"
    script = [sys.executable, str(REPO_ROOT / "examples" / "gpt_mixture.py"), str(out), "--max-bytes", "20000"]
    script += ["--vocab-size", "300"]
    env = _env(PREPEND=_without_ray(tmp_path))
    failed = subprocess.run([*script, "--ray"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert "install `lance-lightning[ray]`" in failed.stderr and "Nothing was written" in failed.stderr
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    done = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (out / "tokenizer.json").is_file() and all((out / f"{n}.lance").is_dir() for n in ("code", "prose", "val"))


# -- an edited Lightning version under Trainer.fit ---------------------------------------------------
def test_an_edited_lightning_version_is_named_under_the_fit_traceback(tmp_path: Path, uri: str) -> None:
    def trainer(**kwargs: Any) -> pl.Trainer:
        return pl.Trainer(
            accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, **kwargs
        )

    def module() -> LanceDataModule:
        return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=16)

    first = trainer(max_steps=2, enable_checkpointing=False)
    first.fit(RecordingModel(), datamodule=module())
    path = tmp_path / "edited.ckpt"
    first.save_checkpoint(path, weights_only=False)
    state = torch.load(path, weights_only=True)
    state["pytorch-lightning_version"] = "0.0.1"
    torch.save(state, path)

    with pytest.raises(KeyError) as raised:
        trainer(max_steps=4, enable_checkpointing=False).fit(RecordingModel(), datamodule=module(), ckpt_path=path)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert str(path) in notes and "`pytorch-lightning_version` says '0.0.1'" in notes, notes
    assert "Fix: set `pytorch-lightning_version` back" in notes, notes


# -- the resume line, a finished run, the weights_only line ------------------------------------------
def _uv() -> str | None:
    return shutil.which("uv") or os.environ.get("UV")


@pytest.mark.skipif(_uv() is None, reason="uv is not installed")
def test_the_resume_line_runs_as_printed_and_a_finished_run_trains_nothing(tmp_path: Path, uri: str) -> None:
    (tmp_path / "fit.yaml").write_text(f"""\
trainer:
  accelerator: cpu
  max_epochs: 1
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{save_last: true}}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: 16
""")
    env = _env()
    env.pop("VIRTUAL_ENV", None)

    def run(command: list[str]) -> str:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        assert WEIGHTS_ONLY_LINE not in output, output[-3000:]
        return output

    launch = [_uv(), "run", "--no-sync", "--project", str(REPO_ROOT), "lance-lightning", "fit", "--config", "fit.yaml"]
    output = run(launch)
    line = next(line for line in output.splitlines() if line.startswith("resume with: "))
    printed = shlex.split(line[len("resume with: ") :])
    last = Path("lightning_logs", "version_0", "checkpoints", "last.ckpt")
    assert printed == ["uv", *launch[1:], "--ckpt_path", str(last)] or printed == [*launch, "--ckpt_path", str(last)]
    assert (tmp_path / last).is_file()

    output = run(printed)  # as printed, from the directory the fit was started in
    assert f"nothing to train: the run in {last} is complete: it trained 20 step(s) in 1 epoch(s)" in output, output
    assert "max_epochs=1 is reached" in output and "No checkpoint or log was written" in output, output
    assert "resume with: " not in output
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], "no new version folder"
    line = next(line for line in output.splitlines() if line.startswith("to train on, raise the limit, e.g.: "))
    more = shlex.split(line.split(": ", 1)[1])
    assert more[-3:] == ["--trainer.max_epochs=2", "--ckpt_path", str(last)], more

    output = run(more)
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0", "version_1"]
    resumed = torch.load(tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 40 and resumed["LanceDataModule"]["train_cursor"]["epoch"] == 1


# -- profile's exit status on a ConfigError ---------------------------------------------------------------
def test_profile_ends_a_config_error_with_status_1_as_fit_does(tmp_path: Path, uri: str) -> None:
    config = _replay_config(tmp_path, uri)
    for args, parameter in (
        (["--batches", "0"], "batches"),
        (["--split", "val"], "val"),
        (["--replay", "0"], "replay"),
        (["--replay", "9", "--batches", "4"], "replay"),
    ):
        code, _, err = run_cli(["profile", "--config", str(config), *args])
        assert code == 1, (args, err[-2000:])
        assert err.startswith("lance-lightning profile: error: ") and f"parameter: {parameter}\n" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 6, err
