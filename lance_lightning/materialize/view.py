"""Materialized views: a remote (or local) Lance source copied once to local disk.

A view is a local Lance dataset holding exactly the rows a source selects (its filter), only its
columns, optionally pre-shuffled with a seed, at one pinned source version. Training then reads
local files at disk speed, every epoch and every later run, while the source version is unchanged.
Making one view (its key, the copy, its manifest) is `lance_lightning.materialize.build`, the
copy itself `lance_lightning.materialize.copy`, disk space `lance_lightning.materialize.space`
and the command line `lance_lightning.cli.materialize` (``lance-lightning materialize``).

Layout of ``cache_dir``::

    <key>.lance            the finished view (a Lance dataset)
    <key>.json             its manifest: source URI, version, rows, columns, filter, seed, created,
                           and the view's files (name, size, SHA-256) taken when it was copied
    <key>.partial-<pid>/   an unfinished copy (never read as a view)
    <key>.lock             serialises processes materializing the same view

Guarantees:
- The key is a hash of the view's identity, never of credentials; a view is written atomically,
  bound to its files (size and SHA-256 in its manifest), resumably, and a full disk leaves
  nothing behind (`lance_lightning.materialize.build`). A view counts as complete only when both
  ``<key>.lance`` and ``<key>.json`` exist, the manifest's source version matches and the row
  count agrees, so an interrupted copy never looks complete.
- Checked before reuse: every reuse checks, before any row is read, the file set and each size
  (``stat`` only) and re-reads by SHA-256 each file that changed on disk since its checksum was
  last confirmed (its inode, mtime or ctime differ: any write, truncation, replacement or
  ``touch`` changes the ctime). ``verify="checksum"`` re-reads
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
- Reuse: with a complete view for the key, ``materialize`` returns it without copying any rows
  (it only opens the source to pin its version). A new source version (or other columns, filter
  or seed) gives a new key and a new view; old views are kept (delete them from ``cache_dir``
  when no run needs them).
- One writer: processes (e.g. DDP ranks on one node) materializing the same view take a file
  lock; the first copies, the others wait and reuse its view.
- Pre-shuffle (``shuffle_seed``): same seed, same order; the rows are a permutation of the
  selected rows.
- Transient read errors are retried per chunk; retries are counted in ``ViewResult.stats``.
- `MaterializedView.reopen` finds a complete view by its path (a checkpoint's cursor names the
  view it was read from), so a run can resume on it after the source moved on; it checks the view
  as a reuse does, and copies a damaged one again from the source version it recorded.
- A filter matching no rows is a `ConfigError` (an empty view would train on nothing).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.build import cache_root, make_view, view_identity, view_key
from lance_lightning.materialize.copy import WriterLock
from lance_lightning.materialize.integrity import VERIFY_MODES, check_verify, check_view
from lance_lightning.materialize.space import MaterializeError
from lance_lightning.plan.rowset import RowSet
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.source import LanceSource, pin_source
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
        root = cache_root(self.cache_dir, "materialize.cache_dir")
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
    identity = view_identity(pinned, dataset, shuffle_seed)
    key = view_key(identity)
    if cache_param is None:
        cache_param = "cache_dir" if param == "materialize" else "materialize.cache_dir"
    root = cache_root(config.cache_dir, cache_param)
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
        manifest, resumed, copier = make_view(
            pinned,
            dataset,
            identity,
            root,
            key,
            started=started,
            damaged=damaged,
            cache_param=cache_param,
            param=param,
            shuffle_seed=shuffle_seed,
            chunk_rows=chunk_rows,
            retry=retry or DEFAULT_POLICY,
            on_chunk=on_chunk,
            matched_rows=matched_rows,
            matches=matches,
        )
    return ViewResult(
        str(view),
        manifest,
        reused=False,
        seconds=time.perf_counter() - started,
        resumed_rows=resumed,
        chunks=copier.chunks,
        stats=copier.stats,
    )
