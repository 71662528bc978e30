"""What a train loader and the cursor read of the Trainer that consumes them, from Lightning 2.6's fit loop.

Guarantees:
- Every read of Lightning's loop progress that a loader or a resume line needs is here: the epoch
  being trained, the batches the trainer takes of it, the batch index its next batch gets, how
  many fetched batches have not finished their step, and the batch index a restarted fit begins
  its epoch at. Nothing here imports Lightning before a fit it trains is stopped: loaders stay
  free of it in worker processes.
- A train loader's ``len`` is the batch index Lightning gives the first batch it fetches of an
  epoch plus the batches the loader yields, so that Lightning stops exactly at the loader's last
  batch and ``limit_train_batches`` scales a whole epoch's count. That index is a restored
  mid-epoch cursor's steps, else 0: Lightning carries no count over into a new epoch once the data
  module normalized the checkpoint's loop state (`lance_lightning.cursor.loop`).
- `TrainerProgress.stop_reason` and `TrainerProgress.batches_left` say, before the first step,
  whether the trainer will train at all and how many batches ``max_steps`` still allows, so a
  resume line never promises steps that will not run.
- `TrainerProgress.sigterm_stop` is what Lightning raises when it stops a fit on SIGTERM, once the
  trainer has received one; a train loader raises it instead of `WorkerDiedError` for workers
  that died with the trainer's SIGTERM (see `lance_lightning.load.loader`).
"""

from __future__ import annotations

import math
from typing import Any


class TrainerProgress:
    """The trainer side of a train loader: its epoch, plan and batch indices (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def epoch(self) -> int:
        """The trainer's current epoch: the epoch the next ``iter`` reads."""
        return self.trainer.current_epoch

    def planned_steps(self) -> int | None:
        """The batches the trainer takes of the epoch it starts (its length, limit applied)."""
        steps = self.trainer.num_training_batches
        return int(steps) if math.isfinite(steps) else None

    def next_batch_index(self) -> int:
        """The batch index Lightning gives the next batch it fetches of the current epoch."""
        return self._batches().ready

    def in_flight(self) -> int:
        """Train batches fetched whose step has not ended (0 outside a fit): an exception raised in
        a step leaves one, which a checkpoint must not count as trained."""
        if not self.trainer.training:
            return 0
        batches = self._batches()
        return max(0, batches.ready - batches.processed)

    def stop_reason(self) -> str | None:
        """Why the fit will train nothing more (``max_steps`` or ``max_epochs`` reached), else None.
        Read after the checkpoint's loops were restored, before the first step."""
        trainer = self.trainer
        if 0 <= trainer.max_steps <= trainer.global_step:
            return f"max_steps={trainer.max_steps} reached (global step {trainer.global_step:,})"
        max_epochs = trainer.max_epochs
        finished = trainer.fit_loop.epoch_progress.current.processed
        if max_epochs is not None and 0 <= max_epochs <= finished:
            return f"max_epochs={max_epochs} reached ({finished} epoch(s) done)"
        return None

    def batches_left(self) -> int | None:
        """The batches ``max_steps`` still allows (optimizer steps times ``accumulate_grad_batches``),
        None when it is not set."""
        trainer = self.trainer
        if trainer.max_steps < 0:
            return None
        return max(0, trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches

    def sigterm_stop(self) -> BaseException | None:
        """Lightning's ``SIGTERMException`` if the trainer has received SIGTERM (it then stops the fit
        at the end of the running step), else None."""
        if not getattr(self.trainer, "received_sigterm", False):
            return None
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        return SIGTERMException()

    def _batches(self) -> Any:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current
