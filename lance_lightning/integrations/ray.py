"""Ray Train with `LanceDataModule`: checkpoints reported to Ray hold the exact data cursor, and a
fit resumes from the checkpoint Ray hands back at the row where it was taken.

Guarantees (checked by ``tests/scenarios/test_ray.py``: 2 local Ray Train workers on CPU, gloo):

- Under Ray Train's Lightning integration (`ray.train.lightning.RayDDPStrategy` with
  `RayLightningEnvironment`, then `prepare_trainer`), the data module reads rank and world size
  from the trainer as under any DDP launch: the workers train disjoint rows, every row of an epoch
  once, and the same number of batches each. Nothing Ray-specific is needed for that.
- `RayCheckpointReport` saves a Lightning checkpoint after every ``every_n_train_steps``-th step
  that ended and (unless ``on_train_epoch_end=False``) at the end of each train epoch (once per
  step: not twice when an epoch ends on a reported step; one of the two must be on), and reports
  it with ``ray.train.report`` as a `ray.train.Checkpoint` holding
  ``checkpoint.ckpt``, the layout of Ray's own `RayTrainReportCallback` (which reports at epoch
  ends only, where the data cursor is trivial). It is a Lightning ``Checkpoint`` callback, so
  Lightning runs it after `DataCursorCheckpoint`: the cursor in the file counts exactly the steps
  that ended.
- `lightning_checkpoint` is a context manager that yields the path of the Lightning checkpoint
  inside ``ray.train.get_checkpoint()`` (the ``resume_from_checkpoint`` of the `TorchTrainer`, or
  the latest one reported before Ray restarted a failed worker group), or ``None`` on a fresh
  start; call ``trainer.fit(..., ckpt_path=path)`` inside its ``with`` block, where the path is
  valid. A Ray checkpoint without ``checkpoint.ckpt`` is a `ConfigError`.

Importing this module imports Ray, which only the ``ray`` extra installs
(``uv sync --extra ray``); elsewhere in the package only ``prepare`` with ``pool="ray"``
(`lance_lightning.write.pools`) imports it, when it runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError

try:
    import ray.train
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        f"lance_lightning.integrations.ray (RayCheckpointReport, lightning_checkpoint) needs Ray, which the "
        f"`ray` extra installs: install `lance-lightning[ray]` (`pip install 'lance-lightning[ray]'`, or "
        f"`uv sync --extra ray` in a checkout of lance-lightning) ({type(error).__name__}: {error})",
        name="ray",
    ) from error

__all__ = ["CHECKPOINT_NAME", "RayCheckpointReport", "lightning_checkpoint"]

#: The Lightning checkpoint's file name inside a reported `ray.train.Checkpoint` (as Ray's callback).
CHECKPOINT_NAME = "checkpoint.ckpt"


class RayCheckpointReport(Checkpoint):
    """Reports a Lightning checkpoint (model, optimizer, data cursor) to Ray Train, mid-epoch too.

    Args:
        every_n_train_steps: Report after every N-th optimizer step that ended (``global_step``
            divisible by N); ``None`` reports at train epoch ends only.
        on_train_epoch_end: Also report at the end of each train epoch.

    It is the trainer's checkpoint callback: leave ``enable_checkpointing`` on (the default;
    Lightning then adds no ``ModelCheckpoint`` of its own, and refuses this one when it is off).
    Every worker saves and reports at the same steps (``trainer.save_checkpoint`` is collective;
    rank zero writes the file), then waits at a barrier before its local copy is removed.
    """

    def __init__(self, every_n_train_steps: int | None = None, *, on_train_epoch_end: bool = True) -> None:
        super().__init__()
        self.every_n_train_steps = check_int(
            "every_n_train_steps",
            every_n_train_steps,
            1,
            "pass a positive number of steps, or None to report at epoch ends only",
            optional=True,
        )
        if every_n_train_steps is None and not on_train_epoch_end:
            raise ConfigError(
                "on_train_epoch_end",
                on_train_epoch_end,
                "with every_n_train_steps=None nothing would ever be reported",
                "pass every_n_train_steps=N or on_train_epoch_end=True",
            )
        self.report_on_epoch_end = on_train_epoch_end
        self._last_reported_step = -1
        self._root: Path | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        context = ray.train.get_context()
        prefix = f"lance_lightning_ray_rank{context.get_world_rank()}_"
        self._root = Path(tempfile.mkdtemp(prefix=prefix))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = self.every_n_train_steps
        if every is not None and trainer.global_step % every == 0:
            self._report(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.report_on_epoch_end:
            self._report(trainer)

    def _report(self, trainer: pl.Trainer) -> None:
        step = trainer.global_step
        if step == self._last_reported_step or trainer.sanity_checking:
            return
        self._last_reported_step = step
        assert self._root is not None, "RayCheckpointReport.setup did not run"
        folder = self._root / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(folder / CHECKPOINT_NAME, weights_only=False)
        metrics = {name: float(value) for name, value in trainer.callback_metrics.items() if value.numel() == 1}
        metrics.update(epoch=trainer.current_epoch, step=step)
        ray.train.report(metrics=metrics, checkpoint=ray.train.Checkpoint.from_directory(os.fspath(folder)))
        trainer.strategy.barrier("ray_checkpoint_reported")  # every worker's copy has been persisted
        shutil.rmtree(folder, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        return {"last_reported_step": self._last_reported_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_reported_step = int(state_dict.get("last_reported_step", -1))


@contextmanager
def lightning_checkpoint(checkpoint: Any = None) -> Iterator[str | None]:
    """The path of the Lightning checkpoint in ``checkpoint`` (default: ``ray.train.get_checkpoint()``).

    Yields ``None`` when there is no checkpoint (a fresh start). The path is valid inside the
    ``with`` block: call ``trainer.fit(model, datamodule=dm, ckpt_path=path)`` there.

    Raises:
        ConfigError: the Ray checkpoint holds no ``checkpoint.ckpt`` (not one of `RayCheckpointReport`
            or `ray.train.lightning.RayTrainReportCallback`).
    """
    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as folder:
        path = Path(folder) / CHECKPOINT_NAME
        if not path.is_file():
            raise ConfigError(
                "resume_from_checkpoint",
                os.fspath(folder),
                f"this Ray checkpoint holds no {CHECKPOINT_NAME} (it holds {sorted(os.listdir(folder))})",
                "resume from a checkpoint reported by RayCheckpointReport or Ray's RayTrainReportCallback",
            )
        yield os.fspath(path)
