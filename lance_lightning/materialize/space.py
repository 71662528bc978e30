"""Disk space for materialized views: refuse early when a view cannot fit, explain when a write ran out.

Guarantees:
- `estimate_view_bytes` estimates a view's size from the source's per-column statistics (the
  selected columns, scaled by the fraction of rows the filter keeps, doubled while pre-shuffling
  because a staging copy is kept next to the view). It reads no rows.
- `check_space` raises `MaterializeError` before anything is written when the rest of a copy
  cannot fit the free space of the cache directory.
- `out_of_space_errno` recognises a full disk (ENOSPC), a quota (EDQUOT) and the file size limit
  (EFBIG), as an ``OSError`` or inside Lance's wrapped error text, anywhere in the cause chain.
- `space_error` turns such a failure into a `MaterializeError` that names the source, its
  version and the cache directory, says what to do (free N MB, raise the quota or the file size
  limit, or choose another cache_dir), quotes the system's message and states that no view was
  left behind (the caller deletes the partial copy first). Sizes are in MB with as many decimals
  as it takes for different sizes to read differently (needed vs free).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import lance

from lance_lightning.errors import MaterializeError
from lance_lightning.read.retry import first_line
from lance_lightning.source import PinnedSource

#: Out-of-space errnos and how Lance's error text spells them.
_SPACE_ERRNOS = {
    errno.ENOSPC: ("no space left", "os error 28"),
    errno.EFBIG: ("file too large", "os error 27"),
    errno.EDQUOT: ("disk quota", "os error 122"),
}
_SPACE_FIXES = {
    errno.EFBIG: "raise the file size limit (ulimit -f) or choose another cache_dir",
    errno.EDQUOT: "raise the disk quota or choose another cache_dir",
}


def estimate_view_bytes(pinned: PinnedSource, dataset: lance.LanceDataset, rows: int, staged: bool) -> int:
    """Bytes a view of ``rows`` selected rows of ``pinned`` will take (doubled when ``staged``)."""
    try:
        # Lance annotates `DataStatistics.fields` as one `FieldStatistics`; it is a list of them.
        by_id = {f.id: f.bytes_on_disk for f in dataset.stats.data_stats().fields}  # type: ignore[attr-defined]
        ids: list[int] = []
        stack = [dataset.lance_schema.field(name) for name in pinned.columns]
        while stack:
            fld = stack.pop()
            if fld is None:  # a column the schema lacks: the whole version, below
                raise KeyError("a column without a Lance field")
            ids.append(fld.id())
            stack.extend(fld.children())
        selected = sum(by_id.get(i, 0) for i in ids)
    except Exception:  # noqa: BLE001 - no statistics: assume the whole version
        selected = int(dataset.get_version()["metadata"].get("total_files_size", 0))
    fraction = rows / pinned.total_rows if pinned.total_rows else 1.0
    return int(selected * fraction * (2 if staged else 1))


def check_space(pinned: PinnedSource, root: Path, needed: int) -> None:
    """Raise `MaterializeError` when ``needed`` more bytes do not fit the free space under ``root``."""
    free = shutil.disk_usage(root).free
    if needed > free:
        need, have = _mb(needed, free)
        raise MaterializeError(
            _message(
                pinned,
                root,
                f"free {_mb(needed - free)[0]} MB or choose another cache_dir",
                f"the view needs about {need} MB, {have} MB are free",
            )
        )


def space_error(pinned: PinnedSource, root: Path, needed: int, error: BaseException, code: int) -> MaterializeError:
    """The clear error for a write that failed with ``code = out_of_space_errno(error)``."""
    free = shutil.disk_usage(root).free
    need, have = _mb(needed, free)
    room = f"the view needs about {need} MB, {have} MB are free after removing the partial copy"
    if code in _SPACE_FIXES:
        fix = _SPACE_FIXES[code]
    elif needed > free:
        fix = f"free at least {_mb(needed - free)[0]} MB ({room}) or choose another cache_dir"
    else:  # the data fits, Lance's metadata of every commit does not
        fix = (
            f"free some space or choose another cache_dir ({room}, plus Lance's metadata for each commit; "
            "a larger chunk_rows makes fewer commits)"
        )
    return MaterializeError(_message(pinned, root, fix, first_line(_root_cause(error))))


def out_of_space_errno(error: BaseException | None) -> int | None:
    """ENOSPC, EFBIG or EDQUOT when ``error`` (or an error it was raised from) is one; else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _SPACE_ERRNOS:
            return error.errno
        text = str(error).lower()
        for code, markers in _SPACE_ERRNOS.items():
            if any(marker in text for marker in markers):
                return code
        error = error.__cause__ or error.__context__
    return None


def _message(pinned: PinnedSource, root: Path, fix: str, detail: str) -> str:
    return (
        f"no space left while materializing {pinned.uri} (version {pinned.version}) into {root}: {fix} "
        f"({detail}); no view was left behind"
    )


def _root_cause(error: BaseException) -> BaseException:
    seen = set()
    while id(error) not in seen:
        following = error.__cause__ or error.__context__
        if following is None:
            break
        seen.add(id(error))
        error = following
    return error


def _mb(*sizes: int) -> tuple[str, ...]:
    """``sizes`` (bytes) in MB, rounded up, with the fewest decimals (1 to 6) that tell different
    sizes apart: 1.1 and 1.0, not 1 and 1."""
    for decimals in range(1, 7):
        scale = 10**decimals
        units = [-(-max(size, 0) * scale // 10**6) for size in sizes]  # ceil(size / 1e6 * scale), exactly
        shown = tuple(f"{unit // scale:,}.{unit % scale:0{decimals}d}" for unit in units)
        if len(set(shown)) == len(set(sizes)):
            break
    return shown
