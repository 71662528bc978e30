"""Restoring the train cursor from a checkpoint: the data at the version it was read at, and the loop.

Guarantees:
- `plan_at_cursor` plans the train split at the version (a plain source), the versions (a
  mixture's sources) or the materialized view the saved cursor was read at, where no version was
  configured as a number (a version named by a tag or ``asof`` is re-pinned to the number the
  cursor holds, though the tag has moved since): a resume reads the rows the cursor counts, after
  the dataset moved on. A re-pinned plain source is shown (``explain()``, the resume line) with the
  name and the number: ``version 1 (tag release-1 when the checkpoint was saved; it now names
  version 2)``. Under a
  trainer the split is planned here for the first time (``setup`` leaves it to the restore), so a
  resume surveys the data once. The data module then restores the cursor strictly
  (`lance_lightning.cursor.tracker.CursorTracker.restore`); with ``resume_data=False`` it is not
  re-pinned nor compared: its epoch restarts at row 0.
- A version that no longer exists is a `ConfigError` naming ``train.version`` (or the mixture
  source's), saying to restore it or resume with ``resume_data=False``.
- `FitLoop` (one per data module) is the loop side of each fit: a new trainer's fit starts a new
  cursor (`FitLoop.starts`), so a second ``fit`` of one data module trains what a fresh data module
  would; the checkpoint's loop state is normalized so that the trainer resumes where the data
  stopped, also after a stop that Lightning counted as an epoch's end
  (`lance_lightning.cursor.loop.normalize_loop_state`); the trainer reads the train loader's length
  again while a restored cursor makes it differ from a whole epoch's; and the resume line printed
  before the first step says where the data resumes and never promises steps that ``max_steps`` or
  ``max_epochs`` will not run.
- Imports no Lightning; the I/O (planning) is the caller's (``plan``), the trainer is read by duck typing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lance_lightning.cursor.loop import loaded_checkpoint, normalize_loop_state
from lance_lightning.cursor.progress import TrainerProgress
from lance_lightning.cursor.tracker import CursorTracker
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.view import MaterializedView
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.redaction import redact_userinfo
from lance_lightning.source import LanceSource, PinnedSource, pin_source
from lance_lightning.version_ref import names_a_number, resolve_version

_GONE = "the checkpoint's data cursor was read at this version, which no longer exists"
_FIX = "restore that version, or resume with `resume_data=False` to start the data epoch fresh"


def plan_at_cursor(
    cursor: dict[str, Any],
    configured: LanceSource | LanceMixture,
    current: Plan | None,
    materialize: MaterializedView | None,
    plan: Callable[[Any], None],
) -> None:
    """Call ``plan(source)`` with the train source ``cursor`` was read at, where it differs from the
    ``current`` plan's (``None``: not planned yet) and ``configured`` names no version."""
    if isinstance(configured, LanceMixture):
        _repin_mixture(cursor, configured, current, plan)
    else:
        _repin_source(cursor, configured, current, materialize, plan)


def _repin_source(
    cursor: dict[str, Any],
    configured: LanceSource,
    current: Plan | None,
    materialize: MaterializedView | None,
    plan: Callable[[Any], None],
) -> None:
    """Plan the train split at the version (or view) the cursor was read at, where that differs."""
    located: dict[str, Any] = {"uri": redact_userinfo(configured.located("train").uri)}
    identity = current.source.identity() if current is not None else located
    by_number = _by_number(configured.version)
    target = repin_target(cursor, identity["uri"], identity.get("version"), by_number, materialize is not None)
    if target is not None and target[0] == "view":
        if materialize is None:  # repin_target names a view only when materialized
            raise RuntimeError("a materialized view to re-pin without a materialized train split")
        view = materialize.reopen(target[1])
        if view is not None:
            plan(view)
    elif target is not None:
        try:
            plan(_repinned(configured, target[1]))
        except ConfigError as error:
            if not error.param.endswith(".version"):
                raise  # another mistake (a redacted credential, a bad filter): its own message
            raise ConfigError("train.version", target[1], _GONE, _FIX) from error


def _repinned(configured: LanceSource, number: int) -> LanceSource | PinnedSource:
    """``configured`` pinned at ``number``, the checkpoint's version; where the config names its
    version by a tag or ``asof``, shown with that name and the number it names now."""
    pinned_here = replace(configured, version=number, asof=None)
    if configured.version is None and configured.asof is None:
        return pinned_here  # the latest version: no name to show
    pinned = pin_source(pinned_here, "train")
    return replace(pinned, pinned_by=_named_now(configured, pinned, number, "train"))


def _named_now(configured: LanceSource, pinned: PinnedSource, number: int, param: str) -> str:
    """How a source the config names by a tag or ``asof``, re-pinned at ``number``, is shown: the
    name, and where it points now when that is not ``number``."""
    try:  # tags and versions are the dataset's, whichever version is checked out
        now, named = resolve_version(pinned.open(), configured.version, configured.asof, param, pinned.uri)
    except ConfigError as error:  # the tag was deleted since, or the moment names no version now
        named = f"tag {configured.version}" if configured.asof is None else f"asof {configured.asof}"
        return f"{named} when the checkpoint was saved; now {error.problem}"
    if now == number:
        return named
    return f"{named} when the checkpoint was saved; it now names version {now}"


def _repin_mixture(
    cursor: dict[str, Any], mixture: LanceMixture, current: Plan | None, plan: Callable[[Any], None]
) -> None:
    """Re-pin each mixture source to the version the cursor was read at (as a plain source is)."""
    identities = (
        [source.identity() for source in current.sources]
        if current is not None
        else [
            {"uri": redact_userinfo(source.located(f"train.sources[{j}]").uri), "version": None}
            for j, source in enumerate(mixture.sources)
        ]
    )
    by_number = [_by_number(source.version) for source in mixture.sources]
    versions = repin_versions(cursor, identities, by_number)
    if versions is None:
        return
    shown = []  # a source named by a tag or `asof`: that name, and where it points now
    for j, (source, number) in enumerate(zip(mixture.sources, versions, strict=True)):
        named = source.asof is not None or (source.version is not None and by_number[j] is None)
        if number is None or not named:
            shown.append("")
            continue
        param = f"train.sources[{j}]"
        shown.append(_named_now(source, pin_source(replace(source, version=number, asof=None), param), number, param))
    try:
        plan(mixture.at_versions(versions, shown))
    except ConfigError as error:
        if not error.param.endswith(".version"):
            raise
        raise ConfigError(error.param, error.value, _GONE, _FIX) from error


def _by_number(version: int | str | None) -> int | None:
    """The number of a version the config gives as a number (``3`` or ``"3"``), else None (none,
    or a tag: a resume then follows the number the cursor holds)."""
    return int(version) if version is not None and names_a_number(version) else None


def repin_versions(
    state: dict[str, Any], sources: list[dict[str, Any]], configured: list[int | None]
) -> list[int | None] | None:
    """A mixture's `repin_target`: the version each source must be re-pinned to so that the cursor
    ``state`` resumes exactly (its current version where it needs none), or None when none does.
    ``sources`` are the current plans' identities, ``configured`` the versions the config names."""
    saved = state.get("plan")
    saved_sources = saved.get("sources") if isinstance(saved, dict) else None
    if not isinstance(saved_sources, list) or len(saved_sources) != len(sources):
        return None  # `check_state` names what is wrong with it
    versions: list[int | None] = []
    for old, new, version in zip(saved_sources, sources, configured, strict=True):
        moved = (
            isinstance(old, dict) and old.get("uri") == new["uri"] and old.get("version") not in (None, new["version"])
        )
        versions.append(old["version"] if moved and version is None else new["version"])
    return versions if versions != [new["version"] for new in sources] else None


def repin_target(
    state: dict[str, Any],
    current_uri: str | None,
    current_version: int | None,
    configured_version: int | None,
    materialized: bool,
) -> tuple[str, Any] | None:
    """Where the train split must be pinned to resume ``state`` exactly, or None to keep (or pin
    as configured) the current one. ``current_uri``/``current_version`` are those of the split's
    plan, ``None`` when it is not planned yet.

    ``("view", uri)``: the checkpoint read another materialized view (views are kept when the source
    moves on). ``("version", v)``: it read version ``v`` of the same source and no version was
    configured, so the latest version is not necessarily the one the cursor counts rows of.
    """
    saved = state.get("plan")
    if not isinstance(saved, dict):
        return None  # `check_state` names what is wrong with it
    if materialized:
        return ("view", saved["uri"]) if saved.get("uri") not in (None, current_uri) else None
    if (
        saved.get("uri") == current_uri
        and saved.get("version") not in (None, current_version)
        and configured_version is None
    ):
        return ("version", saved["version"])
    return None


class FitLoop:
    """The loop side of the data module's fits (see the module docstring); holds no data module."""

    def __init__(self) -> None:
        #: The trainer whose fit the train cursor counts for: a new trainer's fit starts a new cursor.
        self.trainer: Any = None
        #: What restoring the checkpoint's loop state changed (`normalize_loop_state`), for the resume line.
        self.note: str | None = None
        self._user_reload_every: int | None = None  # the trainer's setting while a re-read is pending

    def starts(self, trainer: Any) -> bool:
        """Whether setting up ``trainer``'s fit starts a new fit: then its cursor starts empty (a
        checkpoint, if any, is restored into it), whatever an earlier fit read, and its loader
        reads this trainer's loop. The caller builds the new cursor and loader."""
        if trainer is None or trainer is self.trainer:
            return False
        self.trainer, self.note, self._user_reload_every = trainer, None, None
        return True

    def restore(self, trainer: Any, cursor: Any) -> None:
        """Have ``trainer``'s loops resume where the saved ``cursor`` stopped (`normalize_loop_state`)."""
        if trainer is not None:
            self.note = normalize_loop_state(loaded_checkpoint(trainer), cursor)

    def resume_lines(self, cursor: CursorTracker, world_size: int, progress: TrainerProgress) -> list[str]:
        """Where a restored fit resumes and what it will train: never steps that will not run."""
        lines = [self.note] if self.note else []
        resume = cursor.describe_resume(world_size, progress.batches_left())
        if resume is None and not lines:
            return []
        stop = progress.stop_reason()
        if stop is not None:
            return [*lines, f"  resume: nothing more is trained: {stop}"]
        return [*lines, resume] if resume else lines

    def reread_length_next_epoch(self, trainer: Any, cursor: CursorTracker | None) -> None:
        """Make ``trainer`` read the train loader's length again at the next epoch start.

        Lightning reads ``len(train loader)`` once per fit and caps every epoch with it, and reads
        it before deciding which epoch a checkpoint resumes (the saved one, or the next when the
        saved one had ended). While a restored cursor is pending, or the epoch read began from
        one, the trainer's ``reload_dataloaders_every_n_epochs`` is 1: Lightning reads the length
        again at the next epoch start (the epoch it actually runs, whole); the user's setting is
        put back at the reload after that.
        """
        if cursor is not None and cursor.restoring(trainer.current_epoch):
            if self._user_reload_every is None:
                self._user_reload_every = trainer.reload_dataloaders_every_n_epochs
            trainer.reload_dataloaders_every_n_epochs = 1
        elif self._user_reload_every is not None:
            trainer.reload_dataloaders_every_n_epochs = self._user_reload_every
            self._user_reload_every = None
