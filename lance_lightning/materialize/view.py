"""Materialized views: a remote (or local) Lance source copied once to local disk.

A view is a local Lance dataset holding exactly the rows a source selects (its filter), only its
columns, optionally pre-shuffled with a seed, at one pinned source version. Training then reads
local files at disk speed, every epoch and every later run, while the source version is unchanged.
The copy itself is `lance_lightning.materialize.copy`, disk space `lance_lightning.materialize.space`
and the command line `lance_lightning.cli.materialize` (``lance-lightning materialize``).

Layout of ``cache_dir``::

    <key>.lance            the finished view (a Lance dataset)
    <key>.json             its manifest: source URI, version, rows, columns, filter, seed, created,
                           and the view's files (name, size, SHA-256) taken when it was copied
    <key>.partial-<pid>/   an unfinished copy (never read as a view)
    <key>.lock             serialises processes materializing the same view

Guarantees:
- The key is a hash of (source URI, storage endpoint, pinned version and its timestamp, columns,
  filter, shuffle seed): never of credentials. Storage options are used to read and are never
  written, logged or hashed.
- Atomic: rows are written under ``<key>.partial-<pid>/``; the finished dataset is renamed to
  ``<key>.lance`` in one ``rename``, and only then is ``<key>.json`` written (atomically, via a
  temporary file). A view counts as complete only when both exist, the manifest's source version
  matches and the row count agrees, so an interrupted copy never looks complete.
- Bound to its files: the manifest records every file of the view with its size and SHA-256,
  taken right after the copy (`lance_lightning.materialize.copy.bind_files`; it adds about 0.6 s
  per GB to a copy, whose files are still in the page cache). Every reuse checks, before any row
  is read, the file set and each size (``stat`` only) and re-reads by SHA-256 each file that
  changed on disk since its checksum was last confirmed (its inode, mtime or ctime differ: any
  write, truncation, replacement or ``touch`` changes the ctime). ``verify="checksum"`` re-reads
  every file once per process (0.6-0.9 s per GB from the page cache, 1.3-1.4 s per GB from disk,
  measured on a 2-core VM; another rank's full check of unchanged files made since this process
  started counts): it also catches damage below the file system (a disk's bit rot), which
  changes no ctime.
- A damaged view is never read: a view that fails these checks, that Lance cannot open, or
  whose row count differs, is deleted and copied again, with one warning line naming the view,
  the file and the check. A view made before views recorded their files cannot be checked and is
  copied again the same way. When the copy again fails, a `ConfigError` names the view, the
  cause and the option (``cache_param``: ``materialize.cache_dir``, ``remote_cache.directory``),
  without Lance's traceback; the damaged view is gone, so a rerun copies it once what stopped
  the copy (an unreachable source, a full disk) is fixed.
- Resumable: rows are appended in commits of ``chunk_rows`` rows. A rerun after an interruption
  (crash, SIGKILL, Ctrl-C, network failure) adopts the partial copy and continues after its last
  committed chunk; the result is the same as an uninterrupted copy (``resumed_from_rows`` in the
  manifest says how many rows were adopted).
- Reuse: with a complete view for the key, ``materialize`` returns it without copying any rows
  (it only opens the source to pin its version). A new source version (or other columns, filter
  or seed) gives a new key and a new view; old views are kept (delete them from ``cache_dir``
  when no run needs them).
- One writer: processes (e.g. DDP ranks on one node) materializing the same view take a file
  lock; the first copies, the others wait and reuse its view.
- Pre-shuffle (``shuffle_seed``): same seed, same order; the rows are a permutation of the
  selected rows.
- Transient read errors are retried per chunk; retries are counted in ``ViewResult.stats``.
- Disk full: if the estimated size does not fit in the free space, or a write runs out of space
  (ENOSPC, EDQUOT or the file size limit), `MaterializeError` says ``no space left while
  materializing <uri> (version V) into <dir>: <what to do> (<the system's message>); no view was
  left behind``, and the partial copy is deleted: no view, manifest or partial directory is left.
- `MaterializedView.reopen` finds a complete view by its path (a checkpoint's cursor names the
  view it was read from), so a run can resume on it after the source moved on; it checks the view
  as a reuse does, and copies a damaged one again from the source version it recorded.
- A filter matching no rows is a `ConfigError` (an empty view would train on nothing).
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import lance

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.copy import (
    ViewCopier,
    WriterLock,
    adopt_partial,
    bind_files,
    tree_bytes,
)
from lance_lightning.materialize.integrity import (
    FORMAT,
    VERIFY_MODES,
    cannot_copy_again,
    check_verify,
    check_view,
    write_manifest,
)
from lance_lightning.materialize.space import (
    MaterializeError,
    check_space,
    estimate_view_bytes,
    out_of_space_errno,
    space_error,
)
from lance_lightning.plan.rowset import RowSet
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.source import LanceSource, PinnedSource, pin_source
from lance_lightning.vocabulary import SPLITS

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "VERIFY_MODES",
    "MaterializeError",
    "MaterializedView",
    "ViewResult",
    "materialize",
    "materialize_view",
]

log = logging.getLogger(__name__)

#: The format hashed into a view's key: unchanged, so a view keeps its path (a checkpoint names it).
_KEY_FORMAT = 1
#: Rows per commit: the unit of resumption.
DEFAULT_CHUNK_ROWS = 131_072


@dataclass
class MaterializedView:
    """Copy each split's source to a local view once, and train from the view.

    Args:
        cache_dir: Local directory holding views (created if missing). Reused across runs.
        shuffle_seed: Pre-shuffle each view's rows with this seed; ``None`` keeps source order.
        splits: Splits to materialize (default: every configured split).
        chunk_rows: Rows per commit: an interrupted copy resumes after its last committed chunk.
        verify: How a reused view is checked against the files recorded when it was copied:
            ``"stat"`` checks the file set and sizes and re-reads by SHA-256 each file changed on
            disk since (about a millisecond when none did); ``"checksum"`` re-reads every file
            once per process, 0.6-1.4 s per GB, and also catches a disk's bit rot. A damaged
            view is copied again (module docstring).
    """

    cache_dir: str
    shuffle_seed: int | None = None
    splits: list[str] | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    verify: Literal["stat", "checksum"] = "stat"

    def __post_init__(self) -> None:
        if not isinstance(self.cache_dir, (str, os.PathLike)) or not str(self.cache_dir):
            raise ConfigError(
                "materialize.cache_dir",
                self.cache_dir,
                "must be a local directory path",
                "set e.g. cache_dir: /local_nvme/lance_views",
            )
        if "://" in str(self.cache_dir) and not str(self.cache_dir).startswith("file://"):
            raise ConfigError(
                "materialize.cache_dir",
                self.cache_dir,
                "views are written to local disk",
                "give a local directory path, not an object-store URI",
            )
        check_int(
            "materialize.shuffle_seed",
            self.shuffle_seed,
            0,
            "set shuffle_seed: 0, or null to keep the source order",
            problem="must be an integer >= 0 or null",
            optional=True,
        )
        check_int("materialize.chunk_rows", self.chunk_rows, 1, f"use e.g. {DEFAULT_CHUNK_ROWS}")
        check_verify("materialize.verify", self.verify)
        known = set(SPLITS)
        if self.splits is not None and (not isinstance(self.splits, (list, tuple)) or set(self.splits) - known):
            raise ConfigError(
                "materialize.splits",
                self.splits,
                f"splits must be among {sorted(known)}",
                "list e.g. [train], or null for every configured split",
            )

    def apply(self, source: LanceSource, split: str) -> LanceSource:
        """The source to read for ``split``: a local view of ``source``, or ``source`` itself."""
        if self.splits is not None and split not in self.splits:
            return source
        result = materialize_view(
            source,
            self.cache_dir,
            shuffle_seed=self.shuffle_seed,
            chunk_rows=self.chunk_rows,
            param=split,
            verify=self.verify,
        )
        how = f"reused, {result.verified}" if result.reused else f"made in {result.seconds:.1f} s"
        log.info(
            "split '%s': reading the materialized view %s of %s @ version %s (%s rows, %s)",
            split,
            result.uri,
            result.manifest["source"]["uri"],
            result.manifest["source"]["version"],
            f"{result.manifest['rows']:,}",
            how,
        )
        return LanceSource(uri=result.uri, columns=list(result.manifest["columns"]))

    def reopen(self, view_uri: str) -> LanceSource | None:
        """The source of the complete view at ``view_uri`` in this ``cache_dir``, or None if there is none.

        A checkpoint's data cursor names the view it was read from. Views are kept when the source
        moves on, so a resumed run can read that view again instead of a view of the new version.
        The view is checked as a reused one is (``verify``); a damaged one is copied again from its
        source at the version it recorded, or a `ConfigError` names it when that cannot be done.
        """
        view = Path(view_uri)
        root = _cache_root(self.cache_dir, "materialize.cache_dir")
        if view.suffix != ".lance" or view.parent != root:
            return None
        manifest_path = view.with_suffix(".json")
        with WriterLock(view.with_suffix(".lock")):
            found = check_view(view, manifest_path, None, self.verify)
        if found.manifest is not None:
            return LanceSource(uri=str(view), columns=list(found.manifest["columns"]))
        if found.problem is None or found.recorded is None:
            return None  # no view, or not a complete one: never read
        recorded = found.recorded
        source = LanceSource(
            recorded["source"]["uri"],
            columns=list(recorded["columns"]),
            filter=recorded["filter"],
            version=recorded["source"]["version"],
        )
        try:
            result = materialize_view(
                source,
                root,
                shuffle_seed=recorded.get("shuffle_seed"),
                chunk_rows=self.chunk_rows,
                param="train",
                verify=self.verify,
            )
            cause = f"the copy again went to {result.uri}"
        except ConfigError as error:
            if error.param == "materialize.cache_dir":
                raise
            result = None
            cause = f"{error.problem} ({error.param})"
        if result is not None and result.uri == str(view):
            return LanceSource(uri=str(view), columns=list(result.manifest["columns"]))
        raise ConfigError(
            "materialize.cache_dir",
            str(root),
            f"the view {view} that the checkpoint's data cursor was read from is damaged ({found.problem}) "
            f"and could not be copied again from {source.uri} (version {source.version}): {cause}",
            "make that source version readable and resume again, or resume with `resume_data=False` to "
            "start the data epoch fresh",
        )


@dataclass
class ViewResult:
    """What `materialize_view` returned: the view's URI, its manifest and whether it was reused."""

    uri: str
    manifest: dict[str, Any]
    reused: bool
    seconds: float
    resumed_rows: int = 0
    chunks: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    #: How a reused view was checked (e.g. ``7 files checked by size and change time in 0.2 ms``).
    verified: str = ""


def materialize(
    source: LanceSource,
    cache_dir: str | os.PathLike,
    *,
    columns: list[str] | None = None,
    filter: str | None = None,
    shuffle_seed: int | None = None,
    storage_options: dict[str, str] | None = None,
    version: int | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> str:
    """Copy ``source`` to a local Lance view under ``cache_dir`` once; return the view's local URI.

    ``columns``, ``filter``, ``storage_options`` and ``version`` override the source's own when
    given. See the module docstring for the guarantees.
    """
    return materialize_view(
        source,
        cache_dir,
        columns=columns,
        filter=filter,
        shuffle_seed=shuffle_seed,
        storage_options=storage_options,
        version=version,
        chunk_rows=chunk_rows,
    ).uri


def materialize_view(
    source: LanceSource,
    cache_dir: str | os.PathLike,
    *,
    columns: list[str] | None = None,
    filter: str | None = None,
    shuffle_seed: int | None = None,
    storage_options: dict[str, str] | None = None,
    version: int | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    retry: RetryPolicy | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
    param: str = "materialize",
    matched_rows: int | None = None,
    matches: RowSet | None = None,
    verify: Literal["stat", "checksum"] = "stat",
    cache_param: str | None = None,
    unreadable: tuple[str, str] | None = None,
) -> ViewResult:
    """`materialize`, returning a `ViewResult`; ``on_chunk(rows_done, rows_total)`` runs after each commit.

    ``param`` names the source in errors (``"train"`` when a data module materializes its split);
    ``matched_rows`` and ``matches`` are the filter's matches when the caller found them (`ViewCopier`).
    ``verify`` is how a reused view is checked (`MaterializedView.verify`); ``cache_param`` names the
    cache directory's option in the error raised when a damaged view cannot be copied again.
    ``unreadable`` is ``(created, problem)`` when the caller could not read the view whose manifest
    was created at ``created``: that view is copied again (unless another process already did).
    """
    started = time.perf_counter()
    config = MaterializedView(str(cache_dir), shuffle_seed=shuffle_seed, chunk_rows=chunk_rows, verify=verify)
    wanted = replace(
        source,
        columns=columns if columns is not None else source.columns,
        filter=filter if filter is not None else source.filter,
        version=version if version is not None else source.version,
        asof=None if version is not None else source.asof,
        storage_options=storage_options if storage_options is not None else source.storage_options,
    )
    pinned = pin_source(wanted, param)
    dataset = pinned.open()
    identity = _identity(pinned, dataset, shuffle_seed)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    if cache_param is None:
        cache_param = "cache_dir" if param == "materialize" else "materialize.cache_dir"
    root = _cache_root(config.cache_dir, cache_param)
    view, manifest_path = root / f"{key}.lance", root / f"{key}.json"
    with WriterLock(root / f"{key}.lock"):
        found = check_view(view, manifest_path, pinned, verify)
        damaged = found.problem
        if found.manifest is not None and unreadable is not None and found.manifest["created"] == unreadable[0]:
            damaged = unreadable[1]
        elif found.manifest is not None:
            return ViewResult(
                str(view), found.manifest, reused=True, seconds=time.perf_counter() - started, verified=found.note
            )
        if damaged is not None:
            log.warning(
                "lance-lightning: the local copy %s of %s (version %s) is damaged: %s; copying it again",
                view,
                pinned.uri,
                pinned.version,
                damaged,
            )
        _remove_stale(view, manifest_path, root, key, quiet=damaged is not None)
        try:
            copier = ViewCopier(
                pinned,
                dataset,
                shuffle_seed=shuffle_seed,
                chunk_rows=chunk_rows,
                retry=retry or DEFAULT_POLICY,
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
            _remove_stale(view, manifest_path, root, key)
            failure = space_error(pinned, root, needed, error, code)
            if damaged is None:
                raise failure from error
            raise cannot_copy_again(view, pinned, damaged, failure, cache_param, root) from None
        shutil.rmtree(work, ignore_errors=True)
    return ViewResult(
        str(view),
        manifest,
        reused=False,
        seconds=time.perf_counter() - started,
        resumed_rows=resumed,
        chunks=copier.chunks,
        stats=copier.stats,
    )


# -- identity and completeness ----------------------------------------------------------------
def _cache_root(cache_dir: str, param: str) -> Path:
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


def _identity(pinned: PinnedSource, dataset: lance.LanceDataset, shuffle_seed: int | None) -> dict[str, Any]:
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


def _remove_stale(view: Path, manifest_path: Path, root: Path, key: str, quiet: bool = False) -> None:
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
