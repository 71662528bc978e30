"""Making one materialized view: its key, the copy under ``<key>.partial-<pid>/``, bound to its
files and committed by its manifest (`lance_lightning.materialize.view` decides when to make one).

Guarantees:
- The key (`view_key`) is a hash of (source URI, storage endpoint, pinned version and its
  timestamp, columns, filter, shuffle seed): never of credentials. Storage options are used to
  read and are never written, logged or hashed.
- Atomic: rows are written under ``<key>.partial-<pid>/``; the finished dataset is renamed to
  ``<key>.lance`` in one ``rename``, and only then is ``<key>.json`` written (atomically, via a
  temporary file): an interrupted copy never looks complete.
- Bound to its files: the manifest records every file of the view with its size and SHA-256,
  taken right after the copy (`lance_lightning.materialize.copy.bind_files`; it adds about 0.6 s
  per GB to a copy, whose files are still in the page cache).
- Resumable: rows are appended in commits of ``chunk_rows`` rows. A rerun after an interruption
  (crash, SIGKILL, Ctrl-C, network failure) adopts the partial copy and continues after its last
  committed chunk; the result is the same as an uninterrupted copy (``resumed_from_rows`` in the
  manifest says how many rows were adopted).
- Disk full: if the estimated size does not fit in the free space, or a write runs out of space
  (ENOSPC, EDQUOT or the file size limit), `MaterializeError` says ``no space left while
  materializing <uri> (version V) into <dir>: <what to do> (<the system's message>); no view was
  left behind``, and the partial copy is deleted: no view, manifest or partial directory is left.
- Copying a damaged view again: when that copy fails, a `ConfigError` names the view, the cause
  and the option (``cache_param``), without Lance's traceback (`cannot_copy_again`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance

from lance_lightning.errors import ConfigError
from lance_lightning.materialize.copy import ViewCopier, adopt_partial, bind_files, tree_bytes
from lance_lightning.materialize.integrity import FORMAT, cannot_copy_again, write_manifest
from lance_lightning.materialize.space import (
    MaterializeError,
    check_space,
    estimate_view_bytes,
    out_of_space_errno,
    space_error,
)
from lance_lightning.plan.rowset import RowSet
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import PinnedSource

#: The views' log, named as it was before this module left `lance_lightning.materialize.view`
#: (logging configurations and log filters name it).
log = logging.getLogger("lance_lightning.materialize.view")

#: The format hashed into a view's key: unchanged, so a view keeps its path (a checkpoint names it).
_KEY_FORMAT = 1


def cache_root(cache_dir: str, param: str) -> Path:
    """The resolved cache directory, created if missing; ``param`` names it in the error."""
    local = cache_dir[len("file://") :] if cache_dir.startswith("file://") else cache_dir
    root = Path(local).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            param,
            str(root),
            f"the directory cannot be created ({error.strerror or error})",
            "choose a writable local directory",
        ) from None
    return root


def view_identity(pinned: PinnedSource, dataset: lance.LanceDataset, shuffle_seed: int | None) -> dict[str, Any]:
    """Everything that determines a view's content. No credentials: only endpoint-like options."""
    stamp: str | None
    try:
        timestamp = dataset.get_version()["timestamp"]
        stamp = timestamp.isoformat() if isinstance(timestamp, dt.datetime) else str(timestamp)
    except Exception:  # noqa: BLE001 - older Lance: the version number alone
        stamp = None
    options = pinned.storage_options or {}
    endpoint = next((str(v) for k, v in sorted(options.items()) if "endpoint" in k.lower()), None)
    if endpoint is None and "://" in pinned.uri:
        endpoint = os.environ.get("AWS_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    return {
        "format": _KEY_FORMAT,
        "uri": pinned.uri,
        "endpoint": endpoint,
        "version": pinned.version,
        "version_timestamp": stamp,
        "columns": list(pinned.columns),
        "filter": pinned.filter,
        "shuffle_seed": shuffle_seed,
    }


def view_key(identity: dict[str, Any]) -> str:
    """The view's key: a hash of its identity (`view_identity`)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def make_view(
    pinned: PinnedSource,
    dataset: lance.LanceDataset,
    identity: dict[str, Any],
    root: Path,
    key: str,
    *,
    started: float,
    damaged: str | None,
    cache_param: str,
    param: str,
    shuffle_seed: int | None,
    chunk_rows: int,
    retry: RetryPolicy,
    on_chunk: Callable[[int, int], None] | None,
    matched_rows: int | None,
    matches: RowSet | None,
) -> tuple[dict[str, Any], int, ViewCopier]:
    """Copy the view of ``identity`` (its `view_key`: ``key``) into ``root``, under the caller's
    writer lock: what was there for the key goes first (``damaged``: why it is copied again, or
    None); return its manifest, the rows adopted from a partial copy and the copier. ``started``
    is when the caller began."""
    view, manifest_path = root / f"{key}.lance", root / f"{key}.json"
    remove_stale(view, manifest_path, root, key, quiet=damaged is not None)
    try:
        copier = ViewCopier(
            pinned,
            dataset,
            shuffle_seed=shuffle_seed,
            chunk_rows=chunk_rows,
            retry=retry,
            on_chunk=on_chunk,
            filter_param=f"{param}.filter",
            matched_rows=matched_rows,
            matches=matches,
        )
        needed = estimate_view_bytes(pinned, dataset, copier.rows, staged=shuffle_seed is not None)
        work = adopt_partial(root, key, owner=str(os.getpid()))
    except ConfigError:
        raise
    except Exception as error:
        if damaged is None:
            raise
        raise cannot_copy_again(view, pinned, damaged, error, cache_param, root) from None
    try:
        check_space(pinned, root, needed - tree_bytes(work))
        view_rows, resumed = copier.run(work)
        os.rename(work / "view.lance", view)  # complete, but not a view until its manifest exists
        files, stamps = bind_files(view)
        manifest = {
            "format": FORMAT,
            "key": key,
            "view": str(view),
            "source": {
                "uri": pinned.uri,
                "version": pinned.version,
                "version_timestamp": identity["version_timestamp"],
                "columns": list(pinned.columns),
                "filter": pinned.filter,
            },
            "columns": list(pinned.columns),
            "filter": pinned.filter,
            "shuffle_seed": shuffle_seed,
            "rows": view_rows,
            "bytes": tree_bytes(view),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
            "copy_seconds": round(time.perf_counter() - started, 3),
            "resumed_from_rows": resumed,
            "files": files,
            "checked": {"at": time.time(), "full": True, "stamps": stamps},
        }
        write_manifest(manifest_path, manifest)  # the commit point of the view
    except MaterializeError as error:
        shutil.rmtree(work, ignore_errors=True)
        if damaged is None:
            raise
        raise cannot_copy_again(view, pinned, damaged, error, cache_param, root) from None
    except BaseException as error:  # noqa: BLE001 - out of space is turned into a clear error
        code = out_of_space_errno(error)
        if code is None:
            if damaged is None or not isinstance(error, Exception):
                raise  # anything else keeps the partial copy: a rerun resumes it
            raise cannot_copy_again(view, pinned, damaged, error, cache_param, root) from None
        shutil.rmtree(work, ignore_errors=True)
        remove_stale(view, manifest_path, root, key)
        failure = space_error(pinned, root, needed, error, code)
        if damaged is None:
            raise failure from error
        raise cannot_copy_again(view, pinned, damaged, failure, cache_param, root) from None
    shutil.rmtree(work, ignore_errors=True)
    return manifest, resumed, copier


def remove_stale(view: Path, manifest_path: Path, root: Path, key: str, quiet: bool = False) -> None:
    """Remove a view without a valid manifest (a crash between rename and manifest), or a damaged
    one (``quiet``: the caller said why), and temp files. The manifest goes first: without it a
    view is never read."""
    if manifest_path.exists():
        manifest_path.unlink()
    if view.exists():
        if not quiet:
            log.warning("removing the incomplete view %s (no valid manifest)", view)
        shutil.rmtree(view, ignore_errors=True)
    for tmp in root.glob(f"{key}.json.tmp-*"):
        tmp.unlink(missing_ok=True)
