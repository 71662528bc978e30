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
- The cursor is then restored strictly (`lance_lightning.plan.cursor.CursorTracker.restore`).
"""

from __future__ import annotations

from typing import Any

from lance_lightning.errors import ConfigError
from lance_lightning.plan.cursor import repin_target, repin_versions
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.redaction import redact_userinfo
from lance_lightning.source import LanceSource


class TrainCursorRestore:
    """The data module's restore of a saved train cursor (mixed into `LanceDataModule`, whose
    ``sources``, ``plans``, ``materialize``, ``resume_data``, ``train_cursor``, ``_plan``,
    ``_ensure_planned`` and ``_check_plans`` it uses)."""

    def _restore_cursor(self, cursor: dict[str, Any]) -> None:
        """Resume the train split from a saved cursor, planned at the version it was read at."""
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

    def _plan_restored(self, source: Any) -> None:
        self._plan("train", source)
        self._check_plans()
