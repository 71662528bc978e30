"""No orphans: a ``lance-lightning fit`` with 2 workers leaves no process behind, however it ends.

Each run is its own session (``start_new_session``): the trainer, the forkserver, the workers and
multiprocessing's resource tracker. After SIGKILL (what the out-of-memory killer sends) or Ctrl-C
mid-epoch, a normal exit or an exception, the session must be empty within 10 s (a bound on how
long a leftover may linger, not a speed target).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers import RecordingModel, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 10.0
START_TIMEOUT_S = 240.0


class SlowModel(RecordingModel):
    """Sleeps per step, so a fit is mid-epoch for long; raises at step ``fail_at`` if given."""

    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.fail_at = fail_at

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("a deliberate failure in training_step")
        time.sleep(0.1)
        return super().training_step(batch, batch_idx)


def _session(sid: int) -> list[psutil.Process]:
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def _forkserver_family(sid: int) -> int:
    """Processes of the session running the forkserver's code: the server and its workers."""
    count = 0
    for process in _session(sid):
        try:
            count += "multiprocessing.forkserver" in " ".join(process.cmdline())
        except psutil.Error:
            continue
    return count


def _wait_gone(sid: int) -> list[str]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        left = _session(sid)
        if not left:
            return []
        time.sleep(0.2)
    left = _session(sid)
    described = []
    for process in left:
        try:
            described.append(f"{process.pid}: {' '.join(process.cmdline())[:120]}")
            process.kill()
        except psutil.Error:
            continue
    return described


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["sigkill", "ctrl-c", "normal exit", "exception"])
def test_no_process_outlives_the_trainer(tmp_path: Path, ending: str) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 400, fragment_rows=100)
    fail_at = 6 if ending == "exception" else -1
    max_steps = 6 if ending == "normal exit" else 1000
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: {max_steps}
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.unit.load.test_lifetime.SlowModel
  init_args: {{fail_at: {fail_at}}}
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: 4
  num_workers: 2
""")
    log = tmp_path / "stderr.txt"  # a file, not a pipe: a leftover child would hold a pipe open
    with log.open("w") as stderr_file:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)],
            cwd=REPO_ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
    sid = trainer.pid  # the session leader's pid is the session id
    try:
        if ending in ("sigkill", "ctrl-c"):
            deadline = time.monotonic() + START_TIMEOUT_S
            while _forkserver_family(sid) < 3 and trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert trainer.poll() is None and _forkserver_family(sid) >= 3, "the workers never started"
            time.sleep(1.0)  # a few steps into the epoch
            trainer.send_signal(signal.SIGKILL if ending == "sigkill" else signal.SIGINT)
        trainer.wait(timeout=START_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            trainer.wait()
    stderr = log.read_text()
    if ending == "normal exit":
        assert trainer.returncode == 0, stderr[-3000:]
    elif ending == "exception":
        assert trainer.returncode != 0 and "a deliberate failure" in stderr, stderr[-3000:]
    left = _wait_gone(sid)
    assert not left, f"still running {GONE_WITHIN_S} s after the trainer ended ({ending}): {left}"
