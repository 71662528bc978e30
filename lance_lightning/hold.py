"""Holding the versions a fit trains on: a Lance tag per run, so a cleanup cannot delete them.

Guarantees:
- While `Trainer.fit` trains, global rank zero holds every pinned version the train split reads
  (each source of a mixture) with a Lance tag named ``lance-lightning-<run>-v<version>``
  (`VersionHold.acquire`). Lance's ``cleanup_old_versions`` never deletes a tagged version's
  files: with its default ``error_if_tagged_old_versions=True`` it refuses to run and names the
  tag; with ``False`` it cleans everything else.
- With ``hold_versions="fit"`` (the default) the tags are removed when the fit ends normally
  (`VersionHold.finish_fit`, from the data module's ``teardown``). A fit stopped by an error or
  SIGTERM (`VersionHold.stopped`, from the data module's ``on_exception``) keeps them only when a
  checkpoint can need them: one of its checkpoints recorded the run's name (`VersionHold.record`,
  from the data module's ``state_dict``; ``OnExceptionCheckpoint``'s counts, and so does a
  script's own call of ``state_dict`` while the tags are held: a state that may be saved), or it
  resumed from one (`VersionHold.adopt`). A fit that failed before any checkpoint removes them. A kill keeps
  them, so its checkpoints stay resumable; the run's name is in its checkpoints, so a resumed fit
  takes the same tags over and removes them when it ends. With ``"keep"`` a fit that ends normally
  keeps them too (time-boxed jobs that resume later); with ``"off"`` nothing is tagged.
  ``lance-lightning holds URI`` lists a dataset's tags of this package and ``--release`` removes
  them (`list_holds`, `release_holds`).
- Every tag a fit places is said in one line on rank zero's output, with the command that
  releases it (`release_command`), and so is what a stopped fit did with it (kept or removed);
  `describe_holds` lists the tags of this package on a dataset, each with that command (the data
  module's ``explain()`` shows it, so a tag a killed run left is seen at the next fit).
- A store that refuses a tag (read-only, no permission, an old format) never stops training:
  one warning names the URI, the version and what a cleanup could then do.
- Tags are written through a dataset handle of their own (never the one reader threads share),
  with the source's own storage options; nothing here prints credentials (the
  URI shown is the redacted one).
"""

from __future__ import annotations

import re
import secrets
import time
import warnings
from collections.abc import Iterable
from typing import Any

import lance

from lance_lightning.errors import ConfigError
from lance_lightning.launch import tool_command
from lance_lightning.redaction import redact_text, secret_values
from lance_lightning.source import PinnedSource

#: Every tag this package writes starts with this.
TAG_PREFIX = "lance-lightning-"
#: ``hold_versions`` settings: tag while fitting and release at a normal end, keep after it, never tag.
HOLD_MODES = ("fit", "keep", "off")
_RUN_NAME = re.compile(r"^lance-lightning-[A-Za-z0-9_.-]{1,100}$")


def new_run_name() -> str:
    """``lance-lightning-<UTC time>-<random>``: unique among runs, valid as a Lance tag name."""
    return f"{TAG_PREFIX}{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def check_run_name(value: Any) -> str:
    """``value`` as a run name from a checkpoint; a `ConfigError` naming the field otherwise."""
    if not isinstance(value, str) or not _RUN_NAME.match(value):
        raise ConfigError(
            "checkpoint version_hold",
            value,
            f"is not a run name written by lance-lightning ({TAG_PREFIX}<letters, digits, '.', '-', '_'>)",
            "resume from an unedited checkpoint, or remove the `version_hold` entry to hold the version under a "
            "new name",
        )
    return value


class VersionHold:
    """The tags one run holds: ``(location, version) -> tag name``; ``mode`` is one of `HOLD_MODES`."""

    def __init__(self, mode: str = "fit") -> None:
        if mode not in HOLD_MODES:
            raise ConfigError(
                "hold_versions",
                mode,
                f"must be one of {list(HOLD_MODES)}",
                'use "fit" (hold while fitting), "keep" (hold until `lance-lightning holds URI --release`) or '
                '"off" (never tag the dataset)',
            )
        self.mode = mode
        self.run = new_run_name()
        self._held: dict[tuple[str, int], tuple[PinnedSource, str]] = {}
        self._refused: set[tuple[str, int]] = set()
        #: Whether a checkpoint may name this run: one recorded it, or the run was resumed from one.
        self._needed = False

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def adopt(self, run: str) -> None:
        """Continue the run ``run`` (from a checkpoint): its tags become this hold's."""
        run = check_run_name(run)
        if run != self.run:
            self.release()
            self.run = run
        self._needed = True  # the checkpoint resumed from needs them

    def record(self) -> str:
        """The run's name, for a checkpoint being written: from now on a checkpoint may need the tags."""
        self._needed = True
        return self.run

    def acquire(self, sources: Iterable[PinnedSource]) -> None:
        """Hold exactly the versions of ``sources``: tag the new ones, release those no longer read."""
        if self.mode == "off":
            return
        wanted = {(source.location, source.version): source for source in sources}
        for key in [key for key in self._held if key not in wanted]:
            source, tag = self._held.pop(key)
            _delete_tag(source, tag)
        for key, source in wanted.items():
            if key in self._held or key in self._refused:
                continue
            tag = f"{self.run}-v{source.version}"
            try:
                _put_tag(source, tag)
            except Exception as error:  # noqa: BLE001 - any refusal of the store degrades to a warning
                self._refused.add(key)
                warnings.warn(
                    f"could not hold version {source.version} of {source.uri} with the Lance tag {tag!r} "
                    f"({_first_line(error, source)}): training goes on, but a `cleanup_old_versions` on this dataset "
                    "could now delete this version's files, and checkpoints of this run could not resume. "
                    "Give the run write access to the dataset, or do not clean it up while training",
                    stacklevel=2,
                )
                continue
            self._held[key] = (source, tag)
            ends = (
                "kept after the fit ends (hold_versions='keep')"
                if self.mode == "keep"
                else "removed when the fit ends normally or fails before its first checkpoint"
            )
            _say(
                f"version hold: the Lance tag {tag} holds version {source.version} of {source.uri} while this fit "
                f"trains ({ends}); release it by hand with: {release_command(source, tag)}"
            )

    def finish_fit(self) -> None:
        """The fit ended normally: release the tags unless the mode keeps them."""
        if self.mode == "fit":
            self.release()

    def stopped(self) -> None:
        """The fit was stopped by an error or SIGTERM: release the tags no checkpoint can need (none
        was written and none was resumed from); otherwise keep them, saying how to release them."""
        if not self._held:
            return
        if not self._needed:
            tags = ", ".join(tag for _, tag in self._held.values())
            self.release()
            _say(f"version hold: removed {tags}: the fit stopped before writing any checkpoint that could need it")
            return
        for source, tag in self._held.values():
            _say(
                f"version hold: kept {tag} (version {source.version} of {source.uri}) so that this run's checkpoints "
                f"can resume; once they are no longer needed: {release_command(source, tag)}"
            )

    def release(self) -> None:
        """Remove every tag this run holds (one the store refuses to delete is left, with a warning)."""
        for source, tag in self._held.values():
            _delete_tag(source, tag)
        self._held.clear()
        self._refused.clear()


def _tags(source: PinnedSource) -> Any:
    """The dataset's tags through a handle of their own: the process's shared handle may be in use
    by reader threads, and a tag change through it can fail with PyO3's "Already borrowed"."""
    return lance.dataset(source.location, storage_options=source.storage_options).tags


def _put_tag(source: PinnedSource, tag: str) -> None:
    tags = _tags(source)
    if tag in tags.list():
        tags.update(tag, source.version)
    else:
        tags.create(tag, source.version)


def _delete_tag(source: PinnedSource, tag: str) -> None:
    try:
        tags = _tags(source)
        if tag in tags.list():
            tags.delete(tag)
    except Exception as error:  # noqa: BLE001 - leaving a tag behind must not fail a finished fit
        warnings.warn(
            f"could not remove the Lance tag {tag!r} from {source.uri} ({_first_line(error, source)}): version "
            f"{source.version} stays held; remove it with `{release_command(source, tag)}`",
            stacklevel=2,
        )


def release_command(source: PinnedSource, tag: str | None = None) -> str:
    """The command that removes ``tag`` (all of this package's tags without one) from ``source``'s dataset."""
    command = tool_command(["holds", source.uri, "--release", *([tag] if tag else [])])
    if source.storage_options:
        command += " --storage-option KEY=VALUE ..."  # the store's options, never printed
    return command


def describe_holds(sources: Iterable[PinnedSource], run: str | None = None) -> str:
    """Lines naming this package's tags on each of ``sources``' datasets, each with the version it
    holds and the command that releases it (``run``'s own tags marked); empty when there are none.
    A dataset whose tags cannot be listed is said to be so, in one line."""
    lines: list[str] = []
    seen: set[str] = set()
    for source in sources:
        if source.location in seen:
            continue
        seen.add(source.location)
        try:
            held = list_holds(lance.dataset(source.location, storage_options=source.storage_options))
        except Exception as error:  # noqa: BLE001 - a listing never fails the caller
            lines.append(f"  holds on {source.uri}: could not be listed ({_first_line(error, source)})")
            continue
        if not held:
            continue
        lines.append(
            f"  holds on {source.uri}: {len(held)} Lance tag(s) of lance-lightning keep these versions from "
            "cleanup_old_versions; release one that no checkpoint needs:"
        )
        for name, version in held.items():
            mine = " (this run's)" if run is not None and name.startswith(f"{run}-v") else ""
            lines.append(f"    {name}  version {version}{mine}: {release_command(source, name)}")
    return "\n".join(lines)


def _say(text: str) -> None:
    """One line on the fit's output (Lightning's info log, which ``lance-lightning`` and scripts show)."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(text)


def list_holds(dataset: Any) -> dict[str, int]:
    """This package's tags on ``dataset`` (a `lance.LanceDataset`): tag name -> version."""
    return {
        name: int(tag["version"]) for name, tag in sorted(dataset.tags.list().items()) if name.startswith(TAG_PREFIX)
    }


def release_holds(dataset: Any, names: Iterable[str] | None = None) -> list[str]:
    """Delete this package's tags ``names`` (all of them when None) from ``dataset``; the names deleted."""
    held = list_holds(dataset)
    chosen = list(held) if names is None else list(names)
    unknown = [name for name in chosen if name not in held]
    if unknown:
        raise ConfigError(
            "--release",
            unknown,
            f"no such tag of lance-lightning on this dataset (it has {sorted(held) or 'none'})",
            "name tags listed by `lance-lightning holds URI`, or give --release without names to remove all",
        )
    for name in chosen:
        dataset.tags.delete(name)
    return chosen


def _first_line(error: BaseException, source: PinnedSource) -> str:
    text = str(error).strip().splitlines()
    line = text[0][:300] if text else type(error).__name__
    return redact_text(line, secret_values({"storage_options": source.storage_options or {}}))
