"""What a ``lance-lightning`` command checks before the trainer starts: one clear error, not a traceback.

Guarantees:
- `check_checkpoint_file` raises `ConfigError` (parameter ``ckpt_path``, the file named) for a path
  that does not exist, is not a file or cannot be read, for a file torch cannot load with
  ``weights_only=True`` (empty, truncated, random bytes, another format) and for a checkpoint
  without Lightning's fields, whose Lightning version is not a version, or whose contents do not
  match that version (an edited ``pytorch-lightning_version``: Lightning's migration of the
  checkpoint to the running version, tried on a copy of its small entries, fails). The file is
  memory-mapped, so its weights are not read. Lightning's own keywords (``last``, ``best``, ``hpc``,
  ``registry``) are left to Lightning. The data cursor inside is checked when the data module
  restores it (`lance_lightning.cursor.position.check_state`).
- `note_checkpoint_error`: for ``Trainer.fit(ckpt_path=...)`` in a script, where no preflight runs
  (Lightning offers no hook with the path before it loads the file), an error of Lightning's
  checkpoint migration gets the same `ConfigError` text as a note under its traceback (on Python
  3.10, which has no exception notes, on stderr before it; the data module's ``on_exception``
  calls it; the file is read again, memory-mapped, only then).
- `check_writable` raises `ConfigError` naming the parameter for an output directory (logs,
  checkpoints) that cannot be created or written, before a first checkpoint would fail mid-run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from lance_lightning.errors import ConfigError

#: ``ckpt_path`` values Lightning resolves itself.
_LIGHTNING_KEYWORDS = ("last", "best", "hpc", "registry")
#: Keys every checkpoint Lightning writes holds.
_LIGHTNING_FIELDS = ("state_dict", "pytorch-lightning_version")


def check_checkpoint_file(path: Any) -> dict[str, Any] | None:
    """Raise `ConfigError` unless ``path`` is a checkpoint Lightning can resume from (see the module
    docstring); return it, memory-mapped (None for no path or a keyword Lightning resolves)."""
    if path is None or str(path) in _LIGHTNING_KEYWORDS or str(path).startswith("registry:"):
        return None
    where = Path(os.fspath(path))
    if not where.exists():
        raise _bad(path, "no such file", "give the path of a .ckpt a fit wrote (e.g. <log dir>/checkpoints/last.ckpt)")
    if not where.is_file():
        raise _bad(path, "is not a file", "give the path of one .ckpt file, not its directory")
    if not os.access(where, os.R_OK):
        raise _bad(path, "cannot be read (permission denied)", "give this user read access to the file")
    state = _load(path)
    if not isinstance(state, dict) or any(key not in state for key in _LIGHTNING_FIELDS):
        found = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise _bad(path, f"is not a Lightning checkpoint (it holds {found})", "give a .ckpt written by Trainer.fit")
    _check_version(path, state["pytorch-lightning_version"])
    _check_migration(path, state)
    return state


def _load(path: Any) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _bad(
            path,
            f"cannot be loaded as a checkpoint ({type(error).__name__}: {reason[:200]})",
            "the file is empty, truncated (a run killed while writing it?) or not a checkpoint: resume from "
            "an earlier checkpoint",
        ) from None


def _check_version(path: Any, version: Any) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        Version(str(version))
    except InvalidVersion:
        raise _bad(
            path,
            f"its Lightning version field holds {version!r}, not a version: the checkpoint was edited or damaged",
            "resume from another checkpoint",
        ) from None


#: Where Lightning's checkpoint migrations are (in a traceback).
_MIGRATION = os.path.join("lightning", "pytorch", "utilities", "migration")


def _check_migration(path: Any, state: dict[str, Any]) -> None:
    """Lightning migrates a checkpoint written by an older Lightning to the running version's layout
    when it resumes; a checkpoint whose version field says older than its layout is (an edited or
    damaged field) fails there with a bare KeyError. Run the same migration on a copy of what it
    changes (the top-level mapping, the loops' state, the callbacks' mappings; never a tensor) and
    raise `ConfigError` naming the file and the field instead."""
    import copy

    import lightning.pytorch as pl
    from lightning.pytorch.utilities.migration.utils import migrate_checkpoint
    from packaging.version import Version

    version = state["pytorch-lightning_version"]
    if Version(str(version)) >= Version(pl.__version__):
        return  # nothing to migrate (a newer version only warns)
    probe = dict(state)
    if isinstance(probe.get("loops"), dict):
        probe["loops"] = copy.deepcopy(probe["loops"])  # progress counters: small
    if isinstance(probe.get("callbacks"), dict):
        probe["callbacks"] = {key: dict(v) if isinstance(v, dict) else v for key, v in probe["callbacks"].items()}
    try:
        migrate_checkpoint(probe)
    except Exception as error:  # noqa: BLE001 - a migration that cannot apply fails in many ways (KeyError, TypeError)
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:120] if str(error).strip() else ''}"
        raise _bad(
            path,
            f"its Lightning version field `pytorch-lightning_version` says {version!r}, but its contents are not "
            f"those of a checkpoint of Lightning {version}: Lightning's migration of it to {pl.__version__} fails "
            f"({reason.rstrip(': ')}). The field was edited or damaged",
            "set `pytorch-lightning_version` back to the Lightning version that wrote the file (this one runs "
            f"{pl.__version__}), or resume from another checkpoint",
        ) from None


def note_checkpoint_error(error: BaseException, path: Any) -> None:
    """If ``error`` was raised by Lightning's migration of the checkpoint ``path`` (``Trainer.fit(ckpt_path=...)``
    in a script, which no preflight precedes), add the `check_checkpoint_file` error naming the file
    and the field as a note under its traceback. Reads the file again (memory-mapped: not its weights),
    only on that failure."""
    frames, frame = [], error.__traceback__
    while frame is not None:
        frames.append(frame.tb_frame.f_code.co_filename)
        frame = frame.tb_next
    if path is None or not any(_MIGRATION in name for name in frames):
        return
    try:
        check_checkpoint_file(path)
    except ConfigError as found:
        note = f"lance-lightning: {found}"
        if sys.version_info >= (3, 11):
            error.add_note(note)
        else:  # Python 3.10 has no exception notes: the text goes to stderr, before the traceback
            print(note, file=sys.stderr)


def _bad(path: Any, problem: str, fix: str) -> ConfigError:
    return ConfigError("ckpt_path", str(path), problem, fix)


def check_writable(directory: Any, param: str) -> None:
    """Raise `ConfigError` naming ``param`` unless ``directory`` exists (or can be made) and is writable."""
    if directory is None or "://" in str(directory):  # remote outputs: the store decides
        return
    where = Path(os.fspath(directory))
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as error:
        raise ConfigError(
            param,
            str(directory),
            f"this directory cannot be written ({error.strerror or error})",
            "give a directory this user can write, or fix its permissions (e.g. chmod u+w)",
        ) from None
