"""Restoring the train cursor from a checkpoint, at the data version it was read at.

Guarantees:
- `TrainCursorRestore._restore_cursor` (the data module's ``load_state_dict``) plans the train split
  at the version (a plain source), the versions (a mixture's sources) or the materialized view the
  saved cursor was read at, where no version was configured: a resume reads the rows the cursor
  counts, after the dataset moved on. Under a trainer the split is planned here for the first
  time (``setup`` leaves it to the restore), so a resume surveys the data once.
- A version that no longer exists is a `ConfigError` naming ``train.version`` (or the mixture
  source's), saying to restore it or resume with ``resume_data=False``.
- With ``resume_data=False`` the cursor is not compared: its epoch restarts at row 0.
- The cursor is then restored strictly (`lance_lightning.plan.cursor.CursorTracker.restore`), and
  the checkpoint's loop state normalized so that the trainer resumes where the data stopped, also
  after a stop that Lightning counted as an epoch's end (`lance_lightning.load.loop_state`).
- Each new trainer's fit starts a new cursor (`_start_fit`): a second ``fit`` of one data module
  trains what a fresh data module would, and its loader reads the new trainer's loop.
- The resume line printed before the first step says where the data resumes and never promises
  steps that ``max_steps`` or ``max_epochs`` will not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lance_lightning.errors import ConfigError
from lance_lightning.load.loop_state import loaded_checkpoint, normalize_loop_state
from lance_lightning.plan.cursor import CursorTracker, repin_target, repin_versions
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.redaction import redact_userinfo
from lance_lightning.source import LanceSource

if TYPE_CHECKING:
    from lance_lightning.load.loader import LanceDataLoader


class TrainCursorRestore:
    """The data module's restore of a saved train cursor and the start of each fit's cursor (mixed
    into `LanceDataModule`, whose ``trainer``, ``sources``, ``plans``, ``materialize``,
    ``resume_data``, ``train_cursor``, ``_plan``, ``_ensure_planned``, ``_check_plans`` and
    ``_drop_loader`` it uses)."""

    def _restore_cursor(self, cursor: dict[str, Any]) -> None:
        """Resume the train split from a saved cursor, planned at the version it was read at, and
        have the trainer's loops resume where the data stopped (`normalize_loop_state`)."""
        if self.trainer is not None:
            self._loop_note = normalize_loop_state(loaded_checkpoint(self.trainer), cursor)
        if not cursor:
            return
        if self.resume_data and isinstance(cursor, dict):
            if isinstance(self.sources["train"], LanceMixture):
                self._repin_mixture(cursor)
            else:
                self._repin_source(cursor)
        self._ensure_planned("train")
        self.train_cursor.restore(cursor)

    def _repin_source(self, cursor: dict[str, Any]) -> None:
        """Plan the train split at the version (or view) the cursor was read at, where that differs."""
        plan, configured = self.plans.get("train"), self.sources["train"]
        identity = plan.source.identity() if plan is not None else {"uri": redact_userinfo(configured.uri)}
        current = (identity["uri"], identity.get("version"))
        target = repin_target(cursor, *current, configured.version, self.materialize is not None)
        if target is not None and target[0] == "view":
            view = self.materialize.reopen(target[1])
            if view is not None:
                self._plan_restored(view)
        elif target is not None:
            source = self.sources["train"]
            try:
                self._plan_restored(
                    LanceSource(source.uri, source.columns, source.filter, target[1], source.storage_options)
                )
            except ConfigError as error:
                raise ConfigError(
                    "train.version",
                    target[1],
                    "the checkpoint's data cursor was read at this version, which no longer exists",
                    "restore that version, or resume with `resume_data=False` to start the data epoch fresh",
                ) from error

    def _repin_mixture(self, cursor: dict[str, Any]) -> None:
        """Re-pin each mixture source to the version the cursor was read at (as a plain source is)."""
        mixture = self.sources["train"]
        plan = self.plans.get("train")
        current = (
            [source.identity() for source in plan.sources]
            if plan is not None
            else [{"uri": redact_userinfo(source.uri), "version": None} for source in mixture.sources]
        )
        versions = repin_versions(cursor, current, [source.version for source in mixture.sources])
        if versions is None:
            return
        try:
            self._plan_restored(mixture.at_versions(versions))
        except ConfigError as error:
            if not error.param.endswith(".version"):
                raise
            raise ConfigError(
                error.param,
                error.value,
                "the checkpoint's data cursor was read at this version, which no longer exists",
                "restore that version, or resume with `resume_data=False` to start the data epoch fresh",
            ) from error

    def _start_fit(self) -> None:
        """A new trainer's fit: its cursor starts empty (a checkpoint, if any, is restored into it),
        whatever an earlier fit of this data module read, and its loader reads this trainer's loop."""
        self._fit_trainer = self.trainer
        self._user_reload_every = None
        self._loop_note = None
        if "train" in self.plans:
            self.train_cursor = CursorTracker(self.plans["train"], resume=self.resume_data)
            self._drop_loader("train")

    def _resume_lines(self, loader: LanceDataLoader) -> list[str]:
        """Where a restored fit resumes and what it will train: never steps that will not run."""
        lines = [self._loop_note] if self._loop_note else []
        resume = self.train_cursor.describe_resume(self.world_size, loader.progress.batches_left())
        if resume is None and not lines:
            return []
        stop = loader.progress.stop_reason()
        if stop is not None:
            return [*lines, f"  resume: nothing more is trained: {stop}"]
        return [*lines, resume] if resume else lines

    def _reread_length_next_epoch(self) -> None:
        """Make the trainer read the train loader's length again at the next epoch start.

        Lightning reads ``len(train loader)`` once per fit and caps every epoch with it, and reads
        it before deciding which epoch a checkpoint resumes (the saved one, or the next when the
        saved one had ended). While a restored cursor is pending, or the epoch read began from
        one, the trainer's ``reload_dataloaders_every_n_epochs`` is 1: Lightning reads the length
        again at the next epoch start (the epoch it actually runs, whole); the user's setting is
        put back at the reload after that.
        """
        trainer = self.trainer
        if self.train_cursor is not None and self.train_cursor.restoring(trainer.current_epoch):
            if self._user_reload_every is None:
                self._user_reload_every = trainer.reload_dataloaders_every_n_epochs
            trainer.reload_dataloaders_every_n_epochs = 1
        elif self._user_reload_every is not None:
            trainer.reload_dataloaders_every_n_epochs = self._user_reload_every
            self._user_reload_every = None

    def _plan_restored(self, source: Any) -> None:
        self._plan("train", source)
        self._check_plans()
