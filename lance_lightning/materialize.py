"""Materialized views: a remote (or local) Lance source copied once to local disk.

A view is a local Lance dataset holding exactly the rows a source selects (its filter), only its
columns, optionally pre-shuffled with a seed, at one pinned source version. Training then reads
local files at disk speed, every epoch and every later run, while the source version is unchanged.

Layout of ``cache_dir``::

    <key>.lance        the finished view (a Lance dataset)
    <key>.json         its manifest: source URI, version, rows, columns, filter, seed, created
    <key>.partial-<pid>/   an unfinished copy (never read as a view)
    <key>.lock         serialises processes materializing the same view

Guarantees:
- The key is a hash of (source URI, storage endpoint, pinned version and its timestamp, columns,
  filter, shuffle seed): never of credentials. Storage options are used to read and are never
  written, logged or hashed.
- Atomic: rows are written under ``<key>.partial-<pid>/``; the finished dataset is renamed to
  ``<key>.lance`` in one ``rename``, and only then is ``<key>.json`` written (atomically, via a
  temporary file). A view counts as complete only when both exist, the manifest's source version
  matches and the row count agrees, so an interrupted copy never looks complete.
- Resumable: rows are appended in commits of ``chunk_rows`` rows (each a Lance commit, itself
  atomic). A rerun after an interruption (crash, SIGKILL, Ctrl-C, network failure) adopts the
  partial copy and continues after its last committed chunk; rows that were being written when
  it stopped are written again. The source order is deterministic for a pinned version, so the
  result is the same as an uninterrupted copy. A partial copy that cannot be opened is deleted
  and the copy restarts.
- Reuse: with a complete view for the key, ``materialize`` returns it without reading any rows.
  A new source version (or other columns, filter or seed) gives a new key and a new view; old
  views are kept (delete them from ``cache_dir`` when no run needs them).
- One writer: processes (e.g. DDP ranks on one node) materializing the same view take a file
  lock; the first copies, the others wait and reuse its view.
- Pre-shuffle (``shuffle_seed``): rows are first copied in source order to a local staging
  dataset (sequential reads, efficient on object stores), then written to the view in a seeded
  random permutation (local ``take``). Same seed, same order.
- Transient read errors are retried per chunk (`lance_lightning.retry.RetryPolicy`): the chunk is
  read again from the first row not yet committed. Retries are counted in ``ViewResult.stats``.
- Disk full: if the estimated size does not fit in the free space, nothing is written; if a
  write runs out of space (ENOSPC, EDQUOT or the file size limit), the partial copy is deleted.
  Either way `MaterializeError` says ``no space left while materializing <uri> into <dir>: free
  N MB or choose another cache_dir``, and no view or manifest is left behind.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.metrics import StageClock
from lance_lightning.retry import DEFAULT_POLICY, RetryPolicy, first_line
from lance_lightning.source import LanceSource, PinnedSource, pin_source

log = logging.getLogger(__name__)

FORMAT = 1
#: Rows per commit: the unit of resumption.
DEFAULT_CHUNK_ROWS = 131_072
#: Rows per batch read from the source (and taken from the staging copy).
READ_BATCH_ROWS = 8192
_OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_OUT_OF_SPACE_TEXT = ("no space left", "os error 28", "file too large", "os error 27", "disk quota",
                      "os error 122")


class MaterializeError(RuntimeError):
    """A view could not be made (e.g. the disk is full); no view or manifest was left behind."""


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
            raise ConfigError("materialize.cache_dir", self.cache_dir, "must be a local directory path",
                              "set e.g. cache_dir: /local_nvme/lance_views")
        if "://" in str(self.cache_dir) and not str(self.cache_dir).startswith("file://"):
            raise ConfigError("materialize.cache_dir", self.cache_dir, "views are written to local disk",
                              "give a local directory path, not an object-store URI")
        if self.shuffle_seed is not None and (isinstance(self.shuffle_seed, bool)
                                              or not isinstance(self.shuffle_seed, int) or self.shuffle_seed < 0):
            raise ConfigError("materialize.shuffle_seed", self.shuffle_seed, "must be an integer >= 0 or null",
                              "set shuffle_seed: 0, or null to keep the source order")
        if isinstance(self.chunk_rows, bool) or not isinstance(self.chunk_rows, int) or self.chunk_rows < 1:
            raise ConfigError("materialize.chunk_rows", self.chunk_rows, "must be an integer >= 1",
                              f"use e.g. {DEFAULT_CHUNK_ROWS}")
        known = {"train", "val", "test", "predict"}
        if self.splits is not None and (not isinstance(self.splits, (list, tuple)) or set(self.splits) - known):
            raise ConfigError("materialize.splits", self.splits, f"splits must be among {sorted(known)}",
                              "list e.g. [train], or null for every configured split")

    def apply(self, source: LanceSource, split: str) -> LanceSource:
        """The source to read for ``split``: a local view of ``source``, or ``source`` itself."""
        if self.splits is not None and split not in self.splits:
            return source
        result = materialize_view(source, self.cache_dir, shuffle_seed=self.shuffle_seed,
                                  chunk_rows=self.chunk_rows, param=split)
        how = "reused" if result.reused else f"made in {result.seconds:.1f} s"
        log.info("split '%s': reading the materialized view %s of %s @ version %s (%s rows, %s)", split,
                 result.uri, result.manifest["source"]["uri"], result.manifest["source"]["version"],
                 f"{result.manifest['rows']:,}", how)
        return LanceSource(uri=result.uri, columns=list(result.manifest["columns"]))


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


def materialize(source: LanceSource, cache_dir: str | os.PathLike, *, columns: list[str] | None = None,
                filter: str | None = None, shuffle_seed: int | None = None,
                storage_options: dict[str, str] | None = None, version: int | None = None,
                chunk_rows: int = DEFAULT_CHUNK_ROWS) -> str:
    """Copy ``source`` to a local Lance view under ``cache_dir`` once; return the view's local URI.

    ``columns``, ``filter``, ``storage_options`` and ``version`` override the source's own when
    given. See the module docstring for the guarantees.
    """
    return materialize_view(source, cache_dir, columns=columns, filter=filter, shuffle_seed=shuffle_seed,
                            storage_options=storage_options, version=version, chunk_rows=chunk_rows).uri


def materialize_view(source: LanceSource, cache_dir: str | os.PathLike, *, columns: list[str] | None = None,
                     filter: str | None = None, shuffle_seed: int | None = None,
                     storage_options: dict[str, str] | None = None, version: int | None = None,
                     chunk_rows: int = DEFAULT_CHUNK_ROWS, retry: RetryPolicy | None = None,
                     on_chunk: Callable[[int, int], None] | None = None, param: str = "materialize") -> ViewResult:
    """`materialize`, returning a `ViewResult`; ``on_chunk(rows_done, rows_total)`` runs after each commit."""
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
    root = Path(config.cache_dir).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{param}.cache_dir" if param != "materialize" else "cache_dir", str(root),
                          f"the directory cannot be created ({error.strerror or error})",
                          "choose a writable local directory") from None
    view, manifest_path = root / f"{key}.lance", root / f"{key}.json"
    with _Lock(root / f"{key}.lock"):
        manifest = _complete_manifest(view, manifest_path, pinned)
        if manifest is not None:
            return ViewResult(str(view), manifest, reused=True, seconds=time.perf_counter() - started)
        _remove_stale(view, manifest_path, root, key)
        copier = _Copier(pinned, dataset, shuffle_seed, chunk_rows, retry or DEFAULT_POLICY, on_chunk, root)
        work = copier.work = _adopt_partial(root, key)
        try:
            copier.check_space()
            view_rows, resumed = copier.run()
            os.rename(work / "view.lance", view)  # the commit point of the view
        except BaseException as error:  # noqa: BLE001 - out of space is turned into a clear error
            if _out_of_space(error):
                shutil.rmtree(work, ignore_errors=True)
                shutil.rmtree(view, ignore_errors=True)
                raise copier.space_error(error) from error
            raise
        manifest = {
            "format": FORMAT, "key": key, "view": str(view),
            "source": {"uri": pinned.uri, "version": pinned.version,
                       "version_timestamp": identity["version_timestamp"],
                       "columns": list(pinned.columns), "filter": pinned.filter},
            "columns": list(pinned.columns), "filter": pinned.filter, "shuffle_seed": shuffle_seed,
            "rows": view_rows, "bytes": _tree_bytes(view),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "copy_seconds": round(time.perf_counter() - started, 3), "resumed_from_rows": resumed,
        }
        tmp = root / f"{key}.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        os.replace(tmp, manifest_path)
        shutil.rmtree(work, ignore_errors=True)
    return ViewResult(str(view), manifest, reused=False, seconds=time.perf_counter() - started,
                      resumed_rows=resumed, chunks=copier.chunks, stats=copier.stats)


# -- identity and completeness ----------------------------------------------------------------
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
    return {"format": FORMAT, "uri": pinned.uri, "endpoint": endpoint, "version": pinned.version,
            "version_timestamp": stamp, "columns": list(pinned.columns), "filter": pinned.filter,
            "shuffle_seed": shuffle_seed}


def _complete_manifest(view: Path, manifest_path: Path, pinned: PinnedSource) -> dict[str, Any] | None:
    """The manifest of a complete view for ``pinned``, or None."""
    if not (view.is_dir() and manifest_path.is_file()):
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT or manifest["source"]["version"] != pinned.version \
                or manifest["source"]["uri"] != pinned.uri:
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


def _adopt_partial(root: Path, key: str) -> Path:
    """This process's work directory: an interrupted copy (the most advanced one), or a new one.

    Called under the lock, so every existing partial belongs to a writer that stopped.
    """
    mine = root / f"{key}.partial-{os.getpid()}"
    partials = [p for p in root.glob(f"{key}.partial-*") if p.is_dir()]
    best, best_rows = None, -1
    for partial in partials:
        rows = _rows(partial / "view.lance") + _rows(partial / "stage.lance")
        if rows > best_rows:
            best, best_rows = partial, rows
    for partial in partials:
        if partial != best:
            shutil.rmtree(partial, ignore_errors=True)
    if best is not None and best != mine:
        os.rename(best, mine)
    mine.mkdir(exist_ok=True)
    return mine


def _rows(uri: Path) -> int:
    if not uri.exists():
        return 0
    try:
        return lance.dataset(str(uri)).count_rows()
    except (OSError, ValueError):
        return 0


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _out_of_space(error: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MaterializeError):
            return False
        if isinstance(error, OSError) and error.errno in _OUT_OF_SPACE_ERRNOS:
            return True
        text = str(error).lower()
        if any(marker in text for marker in _OUT_OF_SPACE_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False


class _Lock:
    """An exclusive ``flock`` on a file (released by the OS if the process dies)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None

    def __enter__(self) -> _Lock:
        self._file = open(self.path, "a+")  # noqa: SIM115
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: one writer is assumed
            return self
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()  # closing releases the lock


# -- copying ----------------------------------------------------------------------------------
class _Copier:
    """Copies the selected rows of a pinned source into ``work/view.lance`` in resumable chunks."""

    def __init__(self, pinned: PinnedSource, dataset: lance.LanceDataset, shuffle_seed: int | None,
                 chunk_rows: int, retry: RetryPolicy, on_chunk: Callable[[int, int], None] | None,
                 root: Path) -> None:
        self.pinned = pinned
        self.dataset = dataset
        self.shuffle_seed = shuffle_seed
        self.chunk_rows = chunk_rows
        self.retry = retry
        self.on_chunk = on_chunk
        self.root = root
        self.work = root  # set to the work directory once the partial copy is adopted
        self.columns = list(pinned.columns)
        self.rows = dataset.count_rows(pinned.filter) if pinned.filter else pinned.total_rows
        self.schema = dataset.scanner(columns=self.columns).projected_schema
        self.chunks = 0
        self.stats: dict[str, float] = {"retries": 0.0}
        self.clock = StageClock()
        if self.rows == 0:
            raise ConfigError("filter", pinned.filter, f"matches no rows of {pinned.uri} (version {pinned.version}), "
                              "so the view would be empty", "loosen the filter or check the column values")

    # space ------------------------------------------------------------------------------
    def estimate_bytes(self) -> int:
        """Bytes the view will take (twice that while pre-shuffling: staging + view)."""
        try:
            by_id = {f.id: f.bytes_on_disk for f in self.dataset.stats.data_stats().fields}
            schema = self.dataset.lance_schema
            ids: list[int] = []
            stack = [schema.field(name) for name in self.columns]
            while stack:
                fld = stack.pop()
                ids.append(fld.id())
                stack.extend(fld.children())
            selected = sum(by_id.get(i, 0) for i in ids)
        except Exception:  # noqa: BLE001 - no statistics: assume the whole version
            selected = int(self.dataset.get_version()["metadata"].get("total_files_size", 0))
        fraction = self.rows / self.pinned.total_rows if self.pinned.total_rows else 1.0
        return int(selected * fraction * (2 if self.shuffle_seed is not None else 1))

    def check_space(self) -> None:
        needed = self.estimate_bytes() - _tree_bytes(self.work)
        free = shutil.disk_usage(self.root).free
        if needed > free:
            raise MaterializeError(self._space_message(needed - free, "the view needs about "
                                                       f"{_mb(needed)} MB, {_mb(free)} MB are free"))

    def space_error(self, error: BaseException) -> MaterializeError:
        free = shutil.disk_usage(self.root).free
        missing = max(self.estimate_bytes() - free, 1)
        return MaterializeError(self._space_message(missing, first_line(_root_cause(error))))

    def _space_message(self, missing: int, detail: str) -> str:
        return (f"no space left while materializing {self.pinned.uri} (version {self.pinned.version}) into "
                f"{self.root}: free {_mb(missing)} MB or choose another cache_dir ({detail}); "
                "no view was left behind")

    # copy -------------------------------------------------------------------------------
    def run(self) -> tuple[int, int]:
        """Copy; return (rows in the view, rows already there from an interrupted copy)."""
        view = self.work / "view.lance"
        if self.shuffle_seed is None:
            resumed = self._prepare(view)
            self._fill(view, self._source_batches, "source")
        else:
            stage = self.work / "stage.lance"
            resumed = self._prepare(view) or self._prepare(stage)
            if _rows(view) == 0:  # nothing of the shuffled view yet: the staging copy may be unfinished
                self._fill(stage, self._source_batches, "source")
            staged = lance.dataset(str(stage))
            order = np.random.default_rng(self.shuffle_seed).permutation(self.rows)
            self._fill(view, lambda start: _take_batches(staged, order, start, self.columns), "staging copy")
        rows = _rows(view)
        if rows != self.rows:  # pragma: no cover - a bug, not an input problem
            raise MaterializeError(f"materialized {rows} rows of {self.pinned.uri}, expected {self.rows}")
        return rows, resumed

    def _prepare(self, path: Path) -> int:
        """Rows an interrupted copy committed at ``path`` (0 if none; an unreadable one is removed)."""
        if not path.exists():
            return 0
        rows = _rows(path)
        if rows == 0 or rows > self.rows:
            shutil.rmtree(path, ignore_errors=True)
            return 0
        log.info("resuming the copy of %s after %s committed rows", self.pinned.uri, f"{rows:,}")
        return rows

    def _source_batches(self, start: int) -> Iterator[pa.RecordBatch]:
        scanner = self.dataset.scanner(columns=self.columns, filter=self.pinned.filter, offset=start or None,
                                       batch_size=READ_BATCH_ROWS, scan_in_order=True)
        yield from scanner.to_batches()

    def _fill(self, dest: Path, batches_from: Callable[[int], Iterator[pa.RecordBatch]], origin: str) -> None:
        """Append chunks to ``dest`` until it holds every row; each chunk is one Lance commit."""
        done = _rows(dest)
        stream: _Rechunker | None = None
        while done < self.rows:
            count = min(self.chunk_rows, self.rows - done)

            def write_chunk(first: int = done, count: int = count) -> None:
                nonlocal stream
                if stream is None:
                    stream = _Rechunker(batches_from(first))
                try:
                    reader = pa.RecordBatchReader.from_batches(self.schema, stream.take(count))
                    lance.write_dataset(reader, str(dest), mode="append" if first else "create",
                                        max_rows_per_file=max(self.chunk_rows, 1024),
                                        data_storage_version=self.dataset.data_storage_version)
                except BaseException:
                    stream = None  # the next attempt starts a fresh read after the committed rows
                    raise

            what = (f"rows {done}..{done + count - 1} of {self.rows} from the {origin} (materialize copy into "
                    f"{self.work.name}), columns {self.columns}")
            before = time.perf_counter()
            try:
                self.retry.call(write_chunk, what=what, uri=self.pinned.uri, version=self.pinned.version,
                                clock=self.clock)
            finally:
                self.stats["retries"] = self.clock.peek().get("retries", 0.0)
            self.stats[f"{origin}_seconds"] = self.stats.get(f"{origin}_seconds", 0.0) + time.perf_counter() - before
            committed = _rows(dest)
            if committed != done + count:  # pragma: no cover - a bug, not an input problem
                raise MaterializeError(f"chunk of {count} rows committed {committed - done} rows into {dest}")
            done = committed
            self.chunks += 1
            if self.on_chunk is not None:
                self.on_chunk(done, self.rows)


class _Rechunker:
    """Hands out exactly ``n`` rows at a time from a stream of record batches."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = iter(batches)
        self._left: pa.RecordBatch | None = None

    def take(self, n: int) -> Iterator[pa.RecordBatch]:
        while n > 0:
            batch = self._left if self._left is not None else next(self._batches, None)
            self._left = None
            if batch is None:
                return
            if batch.num_rows > n:
                batch, self._left = batch.slice(0, n), batch.slice(n)
            n -= batch.num_rows
            if batch.num_rows:
                yield batch


def _take_batches(dataset: lance.LanceDataset, order: np.ndarray, start: int,
                  columns: list[str]) -> Iterator[pa.RecordBatch]:
    for first in range(start, len(order), READ_BATCH_ROWS):
        table = dataset.take(order[first:first + READ_BATCH_ROWS], columns=columns)
        yield from table.combine_chunks().to_batches()


def _root_cause(error: BaseException) -> BaseException:
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def _mb(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / 1e6))


# -- command line -----------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lance-lightning materialize",
        description=("Copy a (remote) Lance dataset to a local materialized view, once: only the rows of "
                     "--filter, only --columns, optionally pre-shuffled. Prints the view's path; train from it "
                     "with data.train.uri, or set data.materialize.cache_dir to do this automatically. "
                     "Credentials: prefer environment variables (AWS_ACCESS_KEY_ID, ...); they are never "
                     "written into the view or its manifest."),
    )
    parser.add_argument("--uri", required=True, help="source dataset URI (local path or s3://...)")
    parser.add_argument("--out-dir", required=True, help="local cache directory for views")
    parser.add_argument("--columns", nargs="+", default=None, help="columns to keep (default: all)")
    parser.add_argument("--filter", default=None, help="SQL predicate selecting the rows to keep")
    parser.add_argument("--version", type=int, default=None, help="source version (default: the latest)")
    parser.add_argument("--shuffle-seed", type=int, default=None, help="pre-shuffle the view with this seed")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                        help="rows per commit (an interrupted copy resumes after the last one)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an object-store option for Lance, e.g. aws_endpoint=http://... (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="print only the view's path")
    return parser


def materialize_main(argv: list[str] | None = None) -> int:
    """``lance-lightning materialize ...``: returns the exit status (0 ok, 1 failed, 2 usage)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    options: dict[str, str] = {}
    for item in args.storage_option:
        if "=" not in item:
            print(f"lance-lightning materialize: error: --storage-option {item.split('=')[0]!r} must be KEY=VALUE",
                  file=sys.stderr)
            return 2
        key, value = item.split("=", 1)
        options[key.strip()] = value
    source = LanceSource(uri=args.uri, columns=args.columns, filter=args.filter, version=args.version,
                         storage_options=options or None)

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"  {done:,} / {total:,} rows", file=sys.stderr, flush=True)

    try:
        result = materialize_view(source, args.out_dir, shuffle_seed=args.shuffle_seed, chunk_rows=args.chunk_rows,
                                  on_chunk=progress)
    except (ConfigError, MaterializeError, RuntimeError, OSError, ValueError) as error:
        print(f"lance-lightning materialize: error: {error}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.uri)
        return 0
    m = result.manifest
    how = "reused (source version unchanged)" if result.reused else (
        f"created in {result.seconds:.1f} s" + (f", resumed after {result.resumed_rows:,} rows"
                                                 if result.resumed_rows else ""))
    print(f"view: {result.uri}\n  {how}\n  source: {m['source']['uri']} @ version {m['source']['version']}\n"
          f"  rows: {m['rows']:,}  columns: {m['columns']}  filter: {m['filter']!r}  shuffle_seed: "
          f"{m['shuffle_seed']}\n  manifest: {Path(result.uri).with_suffix('.json')}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(materialize_main())
