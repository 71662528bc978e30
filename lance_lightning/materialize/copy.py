"""The copy behind a materialized view: resumable chunk commits by one writer at a time.

Guarantees:
- `ViewCopier.run` fills ``<work>/view.lance`` with exactly the rows a pinned source selects, in
  commits of ``chunk_rows`` rows (each one Lance commit, itself atomic). Rows are read in source
  order (deterministic for a pinned version); with a shuffle seed they are first staged locally
  in ``<work>/stage.lance`` and then written in ``numpy.random.default_rng(seed).permutation``
  order, so the result never depends on where an earlier copy stopped.
- A work directory left by an interrupted copy is adopted (`adopt_partial`): the copy continues
  after its last committed chunk. A partial dataset that cannot be opened, or holds more rows
  than the source selects, is deleted and rewritten.
- Each chunk is retried through transient storage errors from the first row not yet committed
  (`lance_lightning.read.retry.RetryPolicy`); retries are counted in ``ViewCopier.stats["retries"]``.
- `WriterLock` serialises processes copying the same view (an ``flock``, released by the OS when
  a process dies, so a killed writer never blocks the next one).
- Writes that run out of space raise Lance's error unchanged; `lance_lightning.materialize.space`
  recognises it and cleans up.
- A finished copy is bound to its files (`bind_files`): every file under it (data files, Lance's
  version manifests and transactions) with its size and SHA-256, taken right after the copy, plus
  each file's (inode, mtime, ctime) when its checksum was last confirmed. `verify_files` checks a
  reused copy against that record: the file set and every size by ``stat`` always; the SHA-256 of
  every file whose (inode, mtime, ctime) changed since its checksum was confirmed (any write,
  truncation, replacement or ``touch`` through the file system changes the ctime, which no
  program can set back); with ``full=True`` the SHA-256 of every file. SHA-256, not CRC-32:
  CRC-32 does not detect every 3-bit error in files over about 11 KB, SHA-256 misses none in
  practice, and it costs 0.6-0.9 s per GB from the page cache and 1.3-1.4 s per GB from disk
  (2-core VM; `HASH_SECONDS_PER_GB`, `measure_hash`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.metrics.clock import StageClock
from lance_lightning.plan.rowset import RowSet
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import PinnedSource

log = logging.getLogger(__name__)

#: Rows per batch read from the source (and taken from the staging copy).
READ_BATCH_ROWS = 8192
#: Seconds per GB to re-read and SHA-256 a copy, measured on a 2-core VM (pages cached / from disk):
#: ``uv run python -c "from lance_lightning.materialize.copy import measure_hash; print(measure_hash())"``.
HASH_SECONDS_PER_GB = (0.6, 1.4)
#: Bytes read per call while hashing a file.
_HASH_CHUNK = 1 << 22


class ViewCopier:
    """Copies the selected rows of a pinned source into ``work/view.lance`` in resumable chunks.

    Args:
        pinned: The source at its pinned version (columns and filter select what is copied).
        dataset: ``pinned.open()``.
        shuffle_seed: Write the rows in this seeded permutation; ``None`` keeps source order.
        chunk_rows: Rows per commit.
        retry: How each chunk rides out transient storage errors.
        on_chunk: Called with ``(rows_done, rows_total)`` after each commit.
        filter_param: How errors name the filter (e.g. ``"train.filter"``).
        matched_rows: The rows the filter matches when the caller counted them already (a plan
            did): the filter is not evaluated again to count them.
        matches: The matching rows' offsets (a plan's `RowSet`, its ``rows`` the count): the copy
            takes them in order instead of scanning with the filter, so on an object store it
            fetches those rows' byte ranges, not the pages around them (a sparse selection).
    """

    def __init__(
        self,
        pinned: PinnedSource,
        dataset: lance.LanceDataset,
        *,
        shuffle_seed: int | None,
        chunk_rows: int,
        retry: RetryPolicy,
        on_chunk: Callable[[int, int], None] | None,
        filter_param: str = "filter",
        matched_rows: int | None = None,
        matches: RowSet | None = None,
    ) -> None:
        self.pinned = pinned
        self.matches = matches
        self.dataset = dataset
        self.shuffle_seed = shuffle_seed
        self.chunk_rows = chunk_rows
        self.retry = retry
        self.on_chunk = on_chunk
        self.columns = list(pinned.columns)
        if matches is not None:
            matched_rows = matches.rows
        elif matched_rows is None:
            matched_rows = dataset.count_rows(pinned.filter) if pinned.filter else pinned.total_rows
        self.rows = matched_rows
        self.schema = dataset.scanner(columns=self.columns).projected_schema
        self.chunks = 0
        self.stats: dict[str, float] = {"retries": 0.0}
        self.clock = StageClock()
        if self.rows == 0:
            raise ConfigError(
                filter_param,
                pinned.filter,
                f"matches no rows of {pinned.uri} (version {pinned.version}), so the view would be empty",
                "loosen the filter or check the column values",
            )

    # copy -------------------------------------------------------------------------------
    def run(self, work: Path) -> tuple[int, int]:
        """Copy into ``work/view.lance``; return (rows in the view, rows there from an interrupted copy)."""
        view = work / "view.lance"
        if self.shuffle_seed is None:
            resumed = self._prepare(view)
            self._fill(view, self._source_batches, "source")
        else:
            stage = work / "stage.lance"
            resumed = self._prepare(view) or self._prepare(stage)
            if count_rows(view) == 0:  # nothing of the shuffled view yet: the staging copy may be unfinished
                self._fill(stage, self._source_batches, "source")
            staged = lance.dataset(str(stage))
            order = np.random.default_rng(self.shuffle_seed).permutation(self.rows)
            self._fill(
                view,
                lambda start: _take_batches(staged, order.__getitem__, start, self.rows, self.columns),
                "staging copy",
            )
        rows = count_rows(view)
        if rows != self.rows:  # pragma: no cover - a bug, not an input problem
            raise RuntimeError(f"materialized {rows} rows of {self.pinned.uri}, expected {self.rows}")
        return rows, resumed

    def _prepare(self, path: Path) -> int:
        """Rows an interrupted copy committed at ``path`` (0 if none; an unusable one is removed)."""
        if not path.exists():
            return 0
        rows = count_rows(path)
        if rows == 0 or rows > self.rows:
            shutil.rmtree(path, ignore_errors=True)
            return 0
        log.info("resuming the copy of %s after %s committed rows", self.pinned.uri, f"{rows:,}")
        return rows

    def _source_batches(self, start: int) -> Iterator[pa.RecordBatch]:
        if self.matches is not None:
            yield from _take_batches(self.dataset, self.matches.select, start, self.rows, self.columns)
            return
        scanner = self.dataset.scanner(
            columns=self.columns,
            filter=self.pinned.filter,
            offset=start or None,
            batch_size=READ_BATCH_ROWS,
            scan_in_order=True,
        )
        yield from scanner.to_batches()

    def _fill(self, dest: Path, batches_from: Callable[[int], Iterator[pa.RecordBatch]], origin: str) -> None:
        """Append chunks to ``dest`` until it holds every row; each chunk is one Lance commit."""
        done = count_rows(dest)
        stream: _Rechunker | None = None
        while done < self.rows:
            count = min(self.chunk_rows, self.rows - done)

            def write_chunk(first: int = done, count: int = count) -> None:
                nonlocal stream
                if stream is None:
                    stream = _Rechunker(batches_from(first))
                try:
                    reader = pa.RecordBatchReader.from_batches(self.schema, stream.take(count))
                    lance.write_dataset(
                        reader,
                        str(dest),
                        mode="append" if first else "create",
                        max_rows_per_file=max(self.chunk_rows, 1024),
                        # Lance types the property `str`; it holds one of the versions a write takes.
                        data_storage_version=self.dataset.data_storage_version,  # type: ignore[arg-type]
                    )
                except BaseException:
                    stream = None  # the next attempt starts a fresh read after the committed rows
                    raise

            what = (
                f"rows {done}..{done + count - 1} of {self.rows} from the {origin} (materialize copy into "
                f"{dest.parent.name}), columns {self.columns}"
            )
            before = time.perf_counter()
            try:
                self.retry.call(
                    write_chunk, what=what, uri=self.pinned.uri, version=self.pinned.version, clock=self.clock
                )
            finally:
                self.stats["retries"] = self.clock.peek().get("retries", 0.0)
            self.stats[f"{origin}_seconds"] = self.stats.get(f"{origin}_seconds", 0.0) + time.perf_counter() - before
            committed = count_rows(dest)
            if committed != done + count:  # pragma: no cover - a bug, not an input problem
                raise RuntimeError(f"chunk of {count} rows committed {committed - done} rows into {dest}")
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


def _take_batches(
    dataset: lance.LanceDataset,
    offsets: Callable[[Any], np.ndarray],
    start: int,
    total: int,
    columns: list[str],
) -> Iterator[pa.RecordBatch]:
    """Rows ``offsets(positions)`` of ``dataset`` for positions ``start`` .. ``total``, in order."""
    for first in range(start, total, READ_BATCH_ROWS):
        table = dataset.take(offsets(np.arange(first, min(total, first + READ_BATCH_ROWS))), columns=columns)
        yield from table.combine_chunks().to_batches()


# -- work directories and locks ------------------------------------------------------------------
def adopt_partial(root: Path, key: str, owner: str) -> Path:
    """The work directory ``<key>.partial-<owner>``: the most advanced interrupted copy, or a new one.

    Call it holding the `WriterLock` of ``key``: every existing partial then belongs to a writer
    that stopped. The others are deleted.
    """
    mine = root / f"{key}.partial-{owner}"
    partials = [p for p in root.glob(f"{key}.partial-*") if p.is_dir()]
    best, best_rows = None, -1
    for partial in partials:
        rows = count_rows(partial / "view.lance") + count_rows(partial / "stage.lance")
        if rows > best_rows:
            best, best_rows = partial, rows
    for partial in partials:
        if partial != best:
            shutil.rmtree(partial, ignore_errors=True)
    if best is not None and best != mine:
        best.rename(mine)
    mine.mkdir(exist_ok=True)
    return mine


class WriterLock:
    """An exclusive ``flock`` on a file (released by the OS if the process dies)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None

    def __enter__(self) -> WriterLock:
        self._file = open(self.path, "a+")  # noqa: SIM115 - closed in __exit__
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: one writer is assumed
            return self
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()  # closing releases the lock


# -- small helpers ---------------------------------------------------------------------------------
def count_rows(uri: Path) -> int:
    """Rows of the Lance dataset at ``uri``; 0 if there is none or it cannot be opened."""
    if not uri.exists():
        return 0
    try:
        return lance.dataset(str(uri)).count_rows()
    except (OSError, ValueError):
        return 0


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- binding a copy to its files ---------------------------------------------------------------------
def file_stats(root: Path) -> dict[str, os.stat_result]:
    """Every file under ``root`` by its path relative to ``root`` (``/``-separated), with its ``stat``."""
    found: dict[str, os.stat_result] = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                found[Path(os.path.relpath(path, root)).as_posix()] = os.stat(path)
            except FileNotFoundError:  # pragma: no cover - deleted while listed: missing
                continue
    return found


def stamp(stat: os.stat_result) -> list[int]:
    """What changes whenever a file is written, truncated, replaced or touched: (inode, mtime, ctime)."""
    return [stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (read sequentially; the hash releases the GIL)."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as file:
        while count := file.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def _hash_all(root: Path, names: list[str]) -> dict[str, str | OSError]:
    """SHA-256 of each of ``names`` under ``root``, several files at once; an unreadable file's error."""

    def one(name: str) -> str | OSError:
        try:
            return sha256(root / name)
        except OSError as error:
            return error

    if len(names) <= 1:
        return {name: one(name) for name in names}
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(names))) as pool:
        return dict(zip(names, pool.map(one, names)))


def bind_files(root: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[int]]]:
    """The record of a finished copy's files: ``{name: {"bytes", "sha256"}}`` and ``{name: stamp}``."""
    stats = file_stats(root)
    hashes = _hash_all(root, sorted(stats))
    files: dict[str, dict[str, Any]] = {}
    for name, stat in sorted(stats.items()):
        digest = hashes[name]
        if isinstance(digest, OSError):
            raise digest
        files[name] = {"bytes": stat.st_size, "sha256": digest}
    return files, {name: stamp(stat) for name, stat in stats.items()}


@dataclass
class FileCheck:
    """What `verify_files` found: ``problem`` is None when the copy is intact."""

    problem: str | None
    files: int
    hashed: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0
    #: The stamps to record when files were hashed and matched (None: nothing new to record).
    stamps: dict[str, list[int]] | None = None

    def describe(self) -> str:
        """``4 files checked by size and change time in 0.2 ms`` (+ what was hashed)."""
        text = f"{self.files} files checked by size and change time"
        if self.hashed:
            text += f", {self.hashed} re-read by SHA-256 ({self.hashed_bytes / 1e6:,.1f} MB)"
        return text + f" in {_duration(self.seconds)}"


def verify_files(
    root: Path, files: dict[str, dict[str, Any]], stamps: dict[str, list[int]], *, full: bool
) -> FileCheck:
    """Check the copy at ``root`` against its record (`bind_files`): see the module's guarantees."""
    started = time.perf_counter()
    found = file_stats(root)
    for name in sorted(files):
        if name not in found:
            return FileCheck(f"{name} is missing (file set check)", len(files))
    for name in sorted(found):
        if name not in files:
            return FileCheck(f"{name} was not part of the copy (file set check)", len(files))
    for name, record in sorted(files.items()):
        if found[name].st_size != record["bytes"]:
            return FileCheck(
                f"{name} has {found[name].st_size:,} bytes, {record['bytes']:,} when copied (size check)", len(files)
            )
    changed = sorted(name for name in files if full or stamps.get(name) != stamp(found[name]))
    hashes = _hash_all(root, changed)
    for name in changed:
        digest = hashes[name]
        why = "" if full else ", re-read because it changed on disk since it was checked"
        if isinstance(digest, OSError):
            return FileCheck(f"{name} cannot be read ({digest.strerror or digest}){why}", len(files))
        if digest != files[name]["sha256"]:
            return FileCheck(f"{name} differs from the copy (SHA-256 check{why})", len(files))
    after = {name: stamp(stat) for name, stat in found.items()}
    return FileCheck(
        None,
        len(files),
        hashed=len(changed),
        hashed_bytes=sum(files[name]["bytes"] for name in changed),
        seconds=time.perf_counter() - started,
        stamps=after if changed and after != stamps else None,
    )


def measure_hash(size_mb: int = 512) -> str:
    """Seconds per GB to SHA-256 a file of ``size_mb`` MB in a temporary directory, from the page cache."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "probe"
        with open(path, "wb") as file:
            for _ in range(size_mb):
                file.write(os.urandom(1 << 20))
        sha256(path)  # into the page cache
        started = time.perf_counter()
        sha256(path)
        seconds = time.perf_counter() - started
    return f"SHA-256: {seconds / (size_mb * (1 << 20) / 1e9):.2f} s per GB (page cache)"


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"
