"""What a train loader must know of the Trainer that consumes it, read from Lightning 2.6's fit loop.

Guarantees:
- Every read of Lightning's loop state in the package is here: the epoch being trained, the batches
  the trainer takes of it, the batch index its next batch gets, how many fetched batches have not
  finished their step, and the batch index a restarted fit begins its epoch at. Nothing here
  imports Lightning before a fit it trains is stopped: loaders stay free of it in worker processes.
- A train loader's ``len`` is the batch index Lightning gives the first batch it fetches of an
  epoch plus the batches the loader yields, so that Lightning stops exactly at the loader's last
  batch. That index is a restored mid-epoch cursor's steps, 0 for a fresh epoch, and
  `TrainerProgress.carried_index` when a restart moves on to a new epoch: Lightning 2.6
  (``_TrainingEpochLoop.reset``) carries the restored epoch's count over as the new epoch's first
  index (after a checkpoint written at an epoch's last batch, or at a stop it counted as the
  epoch's end, with ``max_steps`` set), unless the new epoch is no longer than that count.
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

    def carried_index(self) -> int:
        """The first batch index of an epoch that a restarted fit moved on to: the restored epoch's
        count, which Lightning carries over (read once it set its restart stage, at the epoch's
        start); 0 when the fit is not restarting."""
        loop = self.trainer.fit_loop.epoch_loop
        if not loop.restarting:
            return 0
        done = self._batches().completed
        return done + 1 if loop.restarted_on_train_batch_end else done

    def sigterm_stop(self) -> BaseException | None:
        """Lightning's ``SIGTERMException`` if the trainer has received SIGTERM (it then stops the fit
        at the end of the running step), else None."""
        if not getattr(self.trainer, "received_sigterm", False):
            return None
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        return SIGTERMException()

    def _batches(self) -> Any:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current
