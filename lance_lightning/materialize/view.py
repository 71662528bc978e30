"""Materialized views: a remote (or local) Lance source copied once to local disk.

A view is a local Lance dataset holding exactly the rows a source selects (its filter), only its
columns, optionally pre-shuffled with a seed, at one pinned source version. Training then reads
local files at disk speed, every epoch and every later run, while the source version is unchanged.
The copy itself is `lance_lightning.materialize.copy`, disk space `lance_lightning.materialize.space`
and the command line `lance_lightning.cli.materialize` (``lance-lightning materialize``).

Layout of ``cache_dir``::

    <key>.lance            the finished view (a Lance dataset)
    <key>.json             its manifest: source URI, version, rows, columns, filter, seed, created
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
  view it was read from), so a run can resume on it after the source moved on.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.copy import ViewCopier, WriterLock, adopt_partial, tree_bytes
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
    "MaterializeError",
    "MaterializedView",
    "ViewResult",
    "materialize",
    "materialize_view",
]

log = logging.getLogger(__name__)

FORMAT = 1
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
    """

    cache_dir: str
    shuffle_seed: int | None = None
    splits: list[str] | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS

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
            source, self.cache_dir, shuffle_seed=self.shuffle_seed, chunk_rows=self.chunk_rows, param=split
        )
        how = "reused" if result.reused else f"made in {result.seconds:.1f} s"
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
        """
        view = Path(view_uri)
        if view.suffix != ".lance" or view.parent != _cache_root(self.cache_dir, "materialize.cache_dir"):
            return None
        manifest = _complete_manifest(view, view.with_suffix(".json"), None)
        return LanceSource(uri=str(view), columns=list(manifest["columns"])) if manifest is not None else None


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
) -> ViewResult:
    """`materialize`, returning a `ViewResult`; ``on_chunk(rows_done, rows_total)`` runs after each commit.

    ``param`` names the source in errors (``"train"`` when a data module materializes its split);
    ``matched_rows`` and ``matches`` are the filter's matches when the caller found them (`ViewCopier`).
    """
    started = time.perf_counter()
    config = MaterializedView(str(cache_dir), shuffle_seed=shuffle_seed, chunk_rows=chunk_rows)  # validates
    wanted = LanceSource(
        uri=source.uri,
        columns=columns if columns is not None else source.columns,
        filter=filter if filter is not None else source.filter,
        version=version if version is not None else source.version,
        storage_options=storage_options if storage_options is not None else source.storage_options,
    )
    pinned = pin_source(wanted, param)
    dataset = pinned.open()
    identity = _identity(pinned, dataset, shuffle_seed)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    root = _cache_root(config.cache_dir, "cache_dir" if param == "materialize" else "materialize.cache_dir")
    view, manifest_path = root / f"{key}.lance", root / f"{key}.json"
    with WriterLock(root / f"{key}.lock"):
        manifest = _complete_manifest(view, manifest_path, pinned)
        if manifest is not None:
            return ViewResult(str(view), manifest, reused=True, seconds=time.perf_counter() - started)
        _remove_stale(view, manifest_path, root, key)
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
        try:
            check_space(pinned, root, needed - tree_bytes(work))
            view_rows, resumed = copier.run(work)
            os.rename(work / "view.lance", view)  # complete, but not a view until its manifest exists
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
            }
            tmp = root / f"{key}.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
            os.replace(tmp, manifest_path)  # the commit point of the view
        except MaterializeError:
            shutil.rmtree(work, ignore_errors=True)
            raise
        except BaseException as error:  # noqa: BLE001 - out of space is turned into a clear error
            code = out_of_space_errno(error)
            if code is None:
                raise  # anything else keeps the partial copy: a rerun resumes it
            shutil.rmtree(work, ignore_errors=True)
            _remove_stale(view, manifest_path, root, key)
            raise space_error(pinned, root, needed, error, code) from error
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
    try:
        stamp = dataset.get_version()["timestamp"]
        stamp = stamp.isoformat() if hasattr(stamp, "isoformat") else str(stamp)
    except Exception:  # noqa: BLE001 - older Lance: the version number alone
        stamp = None
    options = pinned.storage_options or {}
    endpoint = next((str(v) for k, v in sorted(options.items()) if "endpoint" in k.lower()), None)
    if endpoint is None and "://" in pinned.uri:
        endpoint = os.environ.get("AWS_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    return {
        "format": FORMAT,
        "uri": pinned.uri,
        "endpoint": endpoint,
        "version": pinned.version,
        "version_timestamp": stamp,
        "columns": list(pinned.columns),
        "filter": pinned.filter,
        "shuffle_seed": shuffle_seed,
    }


def _complete_manifest(view: Path, manifest_path: Path, pinned: PinnedSource | None) -> dict[str, Any] | None:
    """The manifest of a complete view (of ``pinned``, when given), or None."""
    if not (view.is_dir() and manifest_path.is_file()):
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT:
            return None
        if pinned is not None and (manifest["source"]["version"], manifest["source"]["uri"]) != (
            pinned.version,
            pinned.uri,
        ):
            return None
        if lance.dataset(str(view)).count_rows() != manifest["rows"]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest


def _remove_stale(view: Path, manifest_path: Path, root: Path, key: str) -> None:
    """Remove a view without a valid manifest (a crash between rename and manifest) and temp files."""
    if view.exists():
        log.warning("removing the incomplete view %s (no valid manifest)", view)
        shutil.rmtree(view, ignore_errors=True)
    if manifest_path.exists():
        manifest_path.unlink()
    for tmp in root.glob(f"{key}.json.tmp-*"):
        tmp.unlink(missing_ok=True)
