"""Planning once per node: a filter's matching rows, surveyed by one process and loaded by the others.

Guarantees:
- `cached_survey(source, compute)` returns a filtered source's matches (`RowSet`) and row bytes:
  from the survey cache when an entry of the same survey verifies, else from ``compute()``, run
  by one process of the node at a time under the entry's lock (``fcntl.flock``, blocking, no
  timeout); the processes that waited load what it wrote instead of scanning. A holder that dies
  releases the lock with its descriptors: the next waiter finds no entry and computes itself.
- The key is a SHA-256 of the survey's identity (`lance_lightning.plan.survey_entry.survey_identity`:
  the dataset, its pinned version and a fingerprint of that version's manifest, the filter, the
  read columns): a dataset deleted and written again at the same URI and version number, another
  filter or another version gets another entry.
- An entry (`lance_lightning.plan.survey_entry`) is one file, written atomically, led by a SHA-256
  of its content, and recording the identity: one that does not verify (truncated, damaged, of
  another survey) is never used: it is recomputed and replaced, with a warning naming it and the
  check that failed.
- Where: ``$LANCE_LIGHTNING_SURVEY_CACHE_DIR``, else ``$XDG_CACHE_HOME/lance-lightning/surveys``
  (``~/.cache/...`` without it), beside the remote cache's ``remote/``: on the node, for local and
  object-store sources alike. A directory the nodes share (where ``flock`` works, e.g. NFSv4)
  makes the survey once per job; where it does not, each process computes (writes stay atomic).
- Bounded: after each write the most recently used entries are kept while at most
  ``$LANCE_LIGHTNING_SURVEY_CACHE_ENTRIES`` (256) and ``$LANCE_LIGHTNING_SURVEY_CACHE_GB`` (2) GB;
  older ones are deleted, with their idle lock files and dead writers' temporary files. A survey
  larger than the bound is not cached.
- ``LANCE_LIGHTNING_SURVEY_CACHE=off``: every process surveys, as before. A default directory that
  cannot be written, or a failed write, leaves the survey uncached (one warning); a bad variable,
  or a directory it names that cannot be made, is a `ConfigError` naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lance_lightning.checks import env_switch
from lance_lightning.errors import ConfigError
from lance_lightning.plan.rowset import RowSet
from lance_lightning.plan.survey_entry import load_entry, survey_identity, write_entry
from lance_lightning.source import PinnedSource

log = logging.getLogger(__name__)

ENV_SWITCH = "LANCE_LIGHTNING_SURVEY_CACHE"
ENV_DIR = "LANCE_LIGHTNING_SURVEY_CACHE_DIR"
ENV_GB = "LANCE_LIGHTNING_SURVEY_CACHE_GB"
ENV_ENTRIES = "LANCE_LIGHTNING_SURVEY_CACHE_ENTRIES"
DEFAULT_LIMIT_GB = 2.0
DEFAULT_ENTRIES = 256
SUFFIX = ".survey"
#: How this process's surveys went ("computed", "loaded", "off"): for tests and benchmarks.
OUTCOMES: Counter[str] = Counter()
_WARNED: set[str] = set()


@dataclass(frozen=True)
class Surveyed:
    """A survey's cached part: ``row_bytes`` is None where it was not measured."""

    matches: RowSet
    row_bytes: int | None
    outcome: str  # "computed", "loaded" or "off"


def cached_survey(source: PinnedSource, compute: Callable[[], tuple[RowSet, int | None]]) -> Surveyed:
    """``compute()``'s result for ``source``, computed once per node (module docstring)."""
    settings = cache_settings()
    if settings is None:
        return _done(*compute(), "off")
    root, limit, entries = settings
    identity = survey_identity(source)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    entry = root / f"{key}{SUFFIX}"
    found, _ = load_entry(entry, identity)
    if found is not None:
        return _done(found.matches, found.row_bytes, "loaded", touch=entry)
    lock = _lock(root / f"{key}.lock")
    try:
        found, problem = load_entry(entry, identity)  # written while this process waited
        if found is not None:
            return _done(found.matches, found.row_bytes, "loaded", touch=entry)
        if problem is not None:
            log.warning("lance-lightning: the survey cache entry %s is damaged (%s); surveying again", entry, problem)
        matches, row_bytes = compute()
        try:
            if write_entry(entry, identity, matches, row_bytes, limit):
                _evict(root, entry, limit, entries)
            else:
                log.info("lance-lightning: the survey of %s exceeds the survey cache's bound: not cached", source.uri)
        except OSError as error:
            _warn_once(str(root), f"cannot write the survey cache {root} ({error}); this survey is not cached")
        return _done(matches, row_bytes, "computed")
    finally:
        if lock is not None:
            os.close(lock)


def cache_settings() -> tuple[Path, int, int] | None:
    """``(directory, byte bound, entry bound)`` from the environment; None when the cache is off."""
    if not env_switch(ENV_SWITCH):
        return None
    limit = _number(ENV_GB, DEFAULT_LIMIT_GB, float)
    entries = int(_number(ENV_ENTRIES, DEFAULT_ENTRIES, int))
    given = os.environ.get(ENV_DIR)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(given or os.path.join(base, "lance-lightning", "surveys")).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        writable = os.access(root, os.W_OK | os.X_OK)
        problem = "is not writable"
    except OSError as error:
        writable, problem = False, f"cannot be created ({error.strerror or error})"
    if writable:
        return root, int(limit * 1e9), entries
    if given:
        raise ConfigError(ENV_DIR, given, problem, f"name a writable local directory, or set {ENV_SWITCH}=off")
    _warn_once(str(root), f"the survey cache directory {root} {problem}; every process surveys its splits")
    return None


def _evict(root: Path, keep: Path, limit: int, most: int) -> None:
    """Delete entries beyond the most recently used that fit ``limit`` bytes and ``most`` entries
    (``keep``, just written, first), their idle lock files, and dead writers' temporary files."""
    found = []
    for path in root.glob(f"*{SUFFIX}"):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        found.append((path != keep, -stat.st_mtime, path, stat.st_size))
    total, kept = 0, 0
    for _, _, path, size in sorted(found):
        if kept < most and total + size <= limit:
            total, kept = total + size, kept + 1
            continue
        path.unlink(missing_ok=True)
        log.info("lance-lightning: survey cache: evicted %s", path)
        _remove_idle(root / f"{path.name[: -len(SUFFIX)]}.lock")
    for temporary in root.glob(f"*{SUFFIX}.tmp-*"):
        key = temporary.name.split(".", 1)[0]
        if key == keep.name[: -len(SUFFIX)] or _remove_idle(root / f"{key}.lock", keep_lock=True):
            temporary.unlink(missing_ok=True)  # its writer is gone: a live one holds the key's lock


def _remove_idle(lock: Path, keep_lock: bool = False) -> bool:
    """Whether no process holds ``lock``; then it is deleted (unless ``keep_lock``)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not keep_lock:
            lock.unlink(missing_ok=True)  # a process waiting on it re-opens the path (`_lock`)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _lock(path: Path) -> int | None:
    """An exclusive ``flock`` on ``path`` (the file itself, not one an eviction unlinked);
    None where the filesystem has no ``flock`` (the caller computes without it)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass  # deleted by an eviction while this process waited: lock the new one
        except OSError as error:
            os.close(fd)
            _warn_once(str(path.parent), f"no file locks in {path.parent} ({error}); each process surveys itself")
            return None
        os.close(fd)


def _done(matches: RowSet, row_bytes: int | None, outcome: str, touch: Path | None = None) -> Surveyed:
    if touch is not None:
        with contextlib.suppress(OSError):
            os.utime(touch, ns=(time.time_ns(), time.time_ns()))  # recently used: evicted last
    OUTCOMES[outcome] += 1
    return Surveyed(matches, row_bytes, outcome)


def _number(name: str, default: float, kind: type) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = kind(text) if text else default
    except ValueError:
        value = 0
    if not value > 0:
        raise ConfigError(name, text, "must be a positive number", f"set e.g. {name}={kind(default)}")
    return value


def _warn_once(where: str, message: str) -> None:
    if where not in _WARNED:
        _WARNED.add(where)
        log.warning("lance-lightning: %s", message)
