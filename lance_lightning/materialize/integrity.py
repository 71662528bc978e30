"""Whether a reused local copy is the copy that was made: its files, sizes, checksums and rows.

Guarantees:
- `check_view` returns a complete view's manifest only when its file set, every file's size, the
  SHA-256 of every file changed on disk since its checksum was last confirmed (inode, mtime or
  ctime differ), and the row count Lance reads all match what was recorded when it was copied;
  ``verify="checksum"`` also re-reads every file once per process. Otherwise it says what is
  wrong in one phrase (the file and the check), so the caller copies the view again.
- A manifest is written atomically (`write_manifest`: a temporary file, then one rename).
- `cannot_copy_again` is the one-screen error for a damaged view that could not be copied again:
  the view, the cause without Lance's traceback, and the option to change.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance

from lance_lightning.errors import ConfigError
from lance_lightning.materialize.copy import HASH_SECONDS_PER_GB, FileCheck, verify_files
from lance_lightning.read.retry import first_line
from lance_lightning.source import PinnedSource

#: The manifest's format: 2 records the view's files; a view of format 1 cannot be verified.
FORMAT = 2
#: How a reused view is checked (see the module's guarantees).
VERIFY_MODES = ("stat", "checksum")
#: When this process started (imported this module): a full check of unchanged files that ended
#: later, by another rank of the node, counts as this process's own.
_STARTED = time.time()
#: Views this process re-read in full (``verify="checksum"``): path -> the manifest's ``created``.
_FULLY_CHECKED: dict[str, str] = {}


def check_verify(param: str, value: Any) -> None:
    """Raise `ConfigError` unless ``value`` is one of `VERIFY_MODES`."""
    if value not in VERIFY_MODES:
        raise ConfigError(
            param,
            value,
            f"must be one of {list(VERIFY_MODES)}",
            "set verify: stat (size and change time; files changed on disk re-read) or verify: checksum "
            f"(every file re-read once per process, about {HASH_SECONDS_PER_GB[0]}-{HASH_SECONDS_PER_GB[1]} s per GB)",
        )


@dataclass
class Found:
    """What `check_view` found: the manifest of an intact, complete view, or else why not."""

    manifest: dict[str, Any] | None = None
    #: Why an existing view must be copied again (None: no view, or one never completed).
    problem: str | None = None
    #: The manifest of a view that is damaged (what it was a copy of).
    recorded: dict[str, Any] | None = None
    note: str = ""


def check_view(view: Path, manifest_path: Path, pinned: PinnedSource | None, verify: str) -> Found:
    """Whether ``view`` is a complete, intact view (of ``pinned``, when given). Call it holding the
    view's `WriterLock`: a view checked intact is rewritten only under it."""
    if not (view.is_dir() and manifest_path.is_file()):
        return Found()
    try:
        manifest = json.loads(manifest_path.read_text())
        if pinned is not None and (manifest["source"]["version"], manifest["source"]["uri"]) != (
            pinned.version,
            pinned.uri,
        ):
            return Found()
    except (OSError, ValueError, KeyError, TypeError):
        return Found()
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return Found(
            problem="it was made before copies recorded their files' sizes and checksums, so it cannot be verified",
            recorded=manifest,
        )
    checked = manifest.get("checked") or {}
    stamps = checked.get("stamps") or {}
    full = verify == "checksum" and not (
        _FULLY_CHECKED.get(str(view)) == manifest["created"] or (checked.get("full") and checked["at"] >= _STARTED)
    )
    try:
        check = verify_files(view, manifest["files"], stamps, full=full)
    except OSError as error:  # pragma: no cover - the directory itself cannot be listed
        check = FileCheck(f"it cannot be listed ({error.strerror or error})", 0)
    except (KeyError, TypeError, ValueError):  # pragma: no cover - a record edited by hand
        check = FileCheck("the record of its files in its manifest cannot be read", 0)
    if check.problem is not None:
        return Found(problem=check.problem, recorded=manifest)
    try:
        rows = lance.dataset(str(view)).count_rows()
    except Exception as error:  # noqa: BLE001 - any failure to open it is damage
        return Found(problem=f"Lance cannot open it ({first_line(error)})", recorded=manifest)
    if rows != manifest["rows"]:
        return Found(problem=f"it holds {rows:,} rows, {manifest['rows']:,} when copied", recorded=manifest)
    if full:
        _FULLY_CHECKED[str(view)] = manifest["created"]
    if full or check.stamps is not None:  # files re-read and intact: remember them as checked
        manifest["checked"] = {"at": time.time(), "full": full, "stamps": check.stamps or stamps}
        write_manifest(manifest_path, manifest)
    return Found(manifest=manifest, note=check.describe())


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` to ``path`` atomically (a temporary file, then one rename)."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, path)


def cannot_copy_again(
    view: Path, pinned: PinnedSource, damaged: str, error: BaseException, cache_param: str, root: Path
) -> ConfigError:
    """The error for a damaged view that could not be copied again: the view, why, and what to do."""
    if cache_param.startswith("remote_cache"):
        fix = (
            "remove what stopped the copy and rerun (the damaged copy was deleted: the next run copies it again), "
            "set remote_cache.directory to another local disk, or set remote_cache.enabled: false to read the "
            "split from the store"
        )
    else:
        fix = (
            "remove what stopped the copy and rerun (the damaged view was deleted: the next run copies it again), "
            f"set {cache_param} to another local disk, or drop `materialize` to read the source in place"
        )
    cause = re.split(r"\s*(?:Detail: Python exception|Traceback \(most recent call last\))", first_line(error))[0]
    return ConfigError(
        cache_param,
        str(root),
        f"the local copy {view} of {pinned.uri} (version {pinned.version}) was damaged ({damaged}), and copying "
        f"it again failed: {cause}",
        fix,
    )
