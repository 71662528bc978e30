"""The remote cache: a split read by ``take`` from an object store is copied once, sequentially,
to local disk, and shuffled from there.

Guarantees:
- On by default (`RemoteCache()`): a split whose source is on an object store (``s3://``,
  ``gs://``, ``az://``, ...) and whose plan reads rows by ``take`` (a row shuffle, or a filter
  selective enough to be read by take) is copied with one sequential, filtered scan of its
  columns into ``directory`` (`lance_lightning.materialize.view.materialize_view`: atomic,
  resumable after a crash, one writer per node through a file lock, the ranks and workers of
  the node then share the copy) and planned again over the copy, through the planning entry
  (`lance_lightning.plan.split.plan_split`, the copy pinned as standing for the source). Scans
  and local sources are read in place. ``RemoteCache(enabled=False)`` turns it off.
- A sparse split (matching under `SPARSE_SHARE` of its source's rows) is copied by ``take`` of
  the rows its plan already found, through a handle that merges byte ranges only closer than
  `SPARSE_BLOCK_BYTES`: the copy downloads those rows (and the narrow columns' encoded chunks
  around them), not the table, and the filter is not evaluated again. A ``block_size`` the user
  sets in ``storage_options`` wins.
- Transparent to the order and the cursor: the copy holds exactly the matching rows in storage
  order, so the plan over it has the same units, the same per-(seed, epoch) order and the same
  identity (`PinnedSource.stands_for`): a checkpoint resumes with the cache on or off, on any
  topology, and warm epochs and later runs read local files only.
- Bounded: the copies in ``directory`` stay under ``limit_gb``; before a copy, the least recently
  used copies not in use by a live process (a shared ``flock`` held for the process's life) are
  deleted until the new one fits. A split larger than the limit is read from the store directly,
  as without the cache, and ``explain()`` says so. The plan's ``cache`` line (``explain()``) says
  what was downloaded or reused, where, and the limit.
- Never a damaged copy: each copy is bound to its files when it is made (their names, sizes and
  SHA-256, in ``<key>.json``), and every reuse checks them before any row is read
  (`lance_lightning.materialize.view`): by default (``verify="stat"``) the file set and sizes,
  plus a SHA-256 re-read of every file changed on disk since it was last checked (about a
  millisecond when none was); ``verify="checksum"`` re-reads every file once per process
  (0.6-1.4 s per GB, measured on a 2-core VM: a 50 GB copy takes about a minute; the ranks of a
  node that started before another rank's full check finished rely on it).
  A copy that fails a check, or that Lance cannot open or plan, is deleted and copied again
  with one warning line naming it, the file and the check; a copy made before copies recorded
  their files is copied again the same way. When that copy fails, a `ConfigError` on
  ``remote_cache.directory`` names the copy and the cause and says what to do.
- Bad input is a `ConfigError` at setup, before any batch: a directory that cannot be created or
  written, a limit that is not a positive number, a limit below one data file of the source.

Where copies live (for tools that inspect or damage them in tests): ``<directory>/<key>.lance``
is a copy (a Lance dataset; its rows in ``data/*.lance``), ``<key>.json`` its manifest (the
source, rows, and ``files``: each file's size and SHA-256), ``<key>.inuse`` held by processes
reading it, ``<key>.lock`` its writers' lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from lance_lightning.errors import ConfigError
from lance_lightning.materialize.integrity import check_verify
from lance_lightning.materialize.space import estimate_view_bytes
from lance_lightning.materialize.view import materialize_view
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.planner import ReadPlan
from lance_lightning.plan.split import plan_split
from lance_lightning.read.retry import RetryPolicy, first_line
from lance_lightning.source import LanceSource, pin_source

log = logging.getLogger(__name__)

#: Default bound on the bytes of all copies in the cache directory.
DEFAULT_LIMIT_GB = 50.0
#: A split matching less than this share of its source's rows is sparse: its copy fetches the
#: matching rows' byte ranges only (`SPARSE_BLOCK_BYTES`), not the ranges between them.
SPARSE_SHARE = 0.125
#: Lance's ``block_size`` for the copy of a sparse split: byte ranges closer than this are merged
#: into one request. Lance's default for object stores merges rows up to 64 KiB apart, so a 1%
#: filter of 524-byte rows (52 KB apart) downloaded the whole table; 4 KiB fetches each row alone
#: and still merges the narrow columns' neighbouring values.
SPARSE_BLOCK_BYTES = 4096
#: URI schemes read in place: a local copy of a local dataset gains nothing.
_LOCAL_SCHEMES = ("file", "file+uring", "memory")
#: Open ``<key>.inuse`` files of this process (a shared lock each: their copies are not evicted).
_IN_USE: dict[str, int] = {}


def default_directory() -> str:
    """``$XDG_CACHE_HOME/lance-lightning/remote`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lance-lightning", "remote")


@dataclass
class RemoteCache:
    """Copy remote splits read by take to local disk once, and read the copy (module docstring).

    Args:
        enabled: ``False`` reads every split from its store, as it is.
        directory: Local directory of the copies (default ``~/.cache/lance-lightning/remote``).
        limit_gb: Bound on the copies' total size, in GB (10^9 bytes); least recently used copies
            are deleted to make room, and a split larger than this is read from the store.
        verify: How a reused copy is checked against the files recorded when it was made:
            ``"stat"`` (the file set and sizes, and a SHA-256 re-read of each file changed on disk
            since it was checked: about a millisecond when none was) or ``"checksum"`` (every
            file re-read once per process, 0.6-1.4 s per GB; also catches a disk's bit rot). A
            damaged copy is copied again.
    """

    enabled: bool = True
    directory: str | None = None
    limit_gb: float = DEFAULT_LIMIT_GB
    verify: Literal["stat", "checksum"] = "stat"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("remote_cache.enabled", self.enabled, "must be true or false", "set enabled: false")
        if self.directory is not None and (not isinstance(self.directory, str) or "://" in self.directory):
            raise ConfigError(
                "remote_cache.directory",
                self.directory,
                "must be a local directory path",
                "set e.g. directory: /local_nvme/lance_cache, or null for ~/.cache/lance-lightning/remote",
            )
        limit = self.limit_gb
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigError(
                "remote_cache.limit_gb",
                limit,
                "must be a positive number of GB",
                f"set e.g. limit_gb: {DEFAULT_LIMIT_GB}",
            )
        check_verify("remote_cache.verify", self.verify)

    @property
    def limit_bytes(self) -> int:
        return int(self.limit_gb * 1e9)

    def apply(self, split: str, plan: Plan, settings: SplitSettings, retry: RetryPolicy) -> Plan:
        """``plan``, or the same plan over a local copy of its rows when the cache applies (one
        source's `ReadPlan`: a mixture's sources are read in place)."""
        if not (
            self.enabled and isinstance(plan, ReadPlan) and plan.method == "take" and _remote(plan.source.location)
        ):
            return plan
        pinned = plan.source
        dataset = pinned.open()
        files = sum(len(fragment.metadata.files) for fragment in dataset.get_fragments())
        every_row = estimate_view_bytes(pinned, dataset, pinned.total_rows, staged=False)  # reads statistics once
        per_file = every_row / max(1, files)
        if per_file > self.limit_bytes:
            raise ConfigError(
                "remote_cache.limit_gb",
                self.limit_gb,
                f"is below one data file's share of the read columns of {pinned.uri} ({per_file / 1e9:.3g} GB)",
                f"set limit_gb to {per_file / 1e9 * 4:.3g} or more, or enabled: false to read from the store",
            )
        needed = every_row * plan.matched_documents // max(1, pinned.total_rows)
        root = self._root()
        if needed > self.limit_bytes:
            note = (
                f"off: the {plan.unit}s' columns (~{needed / 1e6:,.0f} MB) exceed limit_gb={self.limit_gb:g}; "
                "read from the store by take"
            )
            return replace(plan, cache=note)
        _evict(root, self.limit_bytes - needed, keep=(pinned.uri, pinned.version, list(pinned.columns), pinned.filter))
        sparse = plan.selectivity < SPARSE_SHARE
        options = dict(pinned.storage_options or {})
        if sparse:
            options.setdefault("block_size", str(SPARSE_BLOCK_BYTES))
        wanted = LanceSource(pinned.location, list(pinned.columns), pinned.filter, pinned.version, options or None)

        def copy(unreadable: tuple[str, str] | None = None) -> Any:
            return materialize_view(
                wanted,
                str(root),
                retry=retry,
                param=split,
                matched_rows=plan.matched_documents,
                matches=plan.matches if sparse else None,
                verify=self.verify,
                cache_param="remote_cache.directory",
                unreadable=unreadable,
            )

        result = copy()
        _hold(Path(result.uri))
        try:
            local = replace(pin_source(LanceSource(result.uri, list(pinned.columns)), split), stands_for=pinned)
            cached = plan_split(split, local, settings)
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - a reused copy Lance cannot read is copied again
            if not result.reused:
                raise
            result = copy((result.manifest["created"], f"Lance cannot plan it ({first_line(error)})"))
            local = replace(pin_source(LanceSource(result.uri, list(pinned.columns)), split), stands_for=pinned)
            cached = plan_split(split, local, settings)
        how = "reused" if result.reused else f"downloaded in {result.seconds:.1f} s"
        if sparse and not result.reused:
            how += f", by take of the matching {plan.selectivity:.2%} of the rows"
        verified = f", verified: {result.verified}" if result.reused else ""
        size = _size(result.manifest["bytes"])
        note = (
            f"local copy of {result.manifest['rows']:,} rows, {size}: {result.uri} ({how}){verified}; "
            f"limit_gb={self.limit_gb:g}, least recently used evicted"
        )
        log.info("split '%s': %s", split, note)
        return replace(cached, cache=note)

    def _root(self) -> Path:
        root = Path(self.directory or default_directory()).expanduser().resolve()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                "remote_cache.directory",
                str(root),
                f"cannot be created ({error.strerror or error})",
                "choose a writable local directory, or set enabled: false",
            ) from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise ConfigError(
                "remote_cache.directory", str(root), "is not writable", "choose a writable local directory"
            )
        return root


def _size(nbytes: float) -> str:
    if nbytes < 1000:
        return f"{nbytes:,.0f} bytes"
    for unit in ("KB", "MB"):
        nbytes /= 1000
        if nbytes < 1000:
            return f"{nbytes:,.1f} {unit}"
    return f"{nbytes / 1000:,.1f} GB"


def _remote(location: str) -> bool:
    return "://" in location and location.split("://", 1)[0].lower() not in _LOCAL_SCHEMES


def _hold(view: Path) -> None:
    """Mark ``view`` in use for this process's life (a shared lock on ``<key>.inuse``)."""
    marker = str(view.with_suffix(".inuse"))
    if marker in _IN_USE:
        return
    fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _IN_USE[marker] = fd
    os.utime(view.with_suffix(".json"))  # recently used


def _evict(root: Path, room: int, keep: tuple[Any, ...]) -> None:
    """Delete least recently used copies not in use until the others take at most ``room`` bytes;
    never the copy of ``keep`` (uri, version, columns, filter), which another rank of this node
    may have just made for the same split."""
    copies = []
    for manifest in root.glob("*.json"):
        try:
            content = json.loads(manifest.read_text())
            size, source = int(content["bytes"]), content["source"]
            if (source["uri"], source["version"], source["columns"], source["filter"]) == keep:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        copies.append((manifest.stat().st_mtime, manifest, size))
    total = sum(size for _, _, size in copies)
    for _, manifest, size in sorted(copies):
        if total <= room:
            return
        if _delete_unused(manifest.with_suffix(".lance"), manifest):
            log.info("remote cache: evicted %s (%.1f MB)", manifest.with_suffix(".lance"), size / 1e6)
            total -= size


def _delete_unused(view: Path, manifest: Path) -> bool:
    marker = view.with_suffix(".inuse")
    fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False  # a live process reads it
    try:
        manifest.unlink(missing_ok=True)  # first: without its manifest a copy is never read
        shutil.rmtree(view, ignore_errors=True)
    finally:
        os.close(fd)
    return True
