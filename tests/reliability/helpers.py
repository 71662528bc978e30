"""What the reliability cases share: a YAML config writer, the command in a subprocess, and the
callback that breaks a run mid-fit.

Other reliability modules import these; keep the signatures stable.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from tests import zygote

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Lines a one-screen error may take (what, parameter, value, fix, the traceback hint, a seed line).
ONE_SCREEN_LINES = 12


def write_config(root: Path, data: str, *, trainer: str = "", name: str = "config.yaml") -> Path:
    """A fit config of `tests.helpers.RecordingModel` on the ``data:`` section ``data`` (indented)."""
    path = root / name
    path.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 3
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root / "root"}
{trainer}model:
  class_path: tests.helpers.RecordingModel
data:
{data}""")
    return path


def run_command(args: list[str], *, cwd: Path = REPO_ROOT, timeout: float = 240) -> tuple[int, str]:
    """``lance-lightning ARGS`` in a subprocess of its own: (exit status, stdout + stderr). The
    process is forked from the test zygote where it can be (`tests.zygote`: the same process a
    fresh start gives, less the imports)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("LANCE_LIGHTNING_TRACEBACK", None)
    command = [str(Path(sys.executable).with_name("lance-lightning")), *args]
    proc = zygote.run(command, cwd=cwd, env=env, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def error_screen(output: str) -> list[str]:
    """The lines of the error the command printed (from its ``error:`` line on)."""
    lines = output.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if "lance-lightning" in line and "error:" in line), None)
    return lines[start:] if start is not None else lines


class DeleteDataAt(pl.Callback):
    """Deletes the data files of the dataset at ``uri`` before training batch ``batch``: the pinned
    version's files gone mid-run."""

    def __init__(self, uri: str, batch: int) -> None:
        self.uri, self.batch = uri, batch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.batch:
            shutil.rmtree(Path(self.uri) / "data")
