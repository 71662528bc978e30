"""What a prepare writes, as deterministic work units: the survey of the input and its split into units.

Guarantees:
- A `Survey` lists the input's items (files) in a fixed order (`walk_files`), with their sizes
  and row counts, and the Arrow schema every unit's batches have (``id`` first).
  The same input gives the same survey, on any machine and any number of workers.
- `plan_units` splits the items, in that order, into units of at most ``unit_files`` files and
  ``unit_bytes`` input bytes (a larger file is a unit alone). Unit ``k`` covers the ids
  ``first_id .. first_id + rows - 1``: a row's ``id`` is its position in the whole input, so it is
  stable whether a row before it was skipped, whatever the workers, and across an interrupted run.
- `fingerprint` hashes the format, the items (path, size, rows), the unit boundaries and the
  schema: a rerun resumes a partial output only when it is the same.
- Every check of the input raises `ConfigError` naming the file or the flag, before anything is written:
  a column name Lance reserves (``_rowid``, ``_rowaddr``, ...) or ``id`` among them.
- `walk_files` never opens what is not a regular file: FIFOs, sockets, devices, dangling symbolic
  links, link loops and names that are not UTF-8 are skipped and listed (path shown escaped), or
  refused by ``on_bad_file="error"``; a prepare never blocks on one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import LANCE_RESERVED_COLUMNS

#: The column holding each row's stable integer id.
ID_COLUMN = "id"


@dataclass(frozen=True)
class Item:
    """One input file: ``path`` relative to the input root (``/``-separated), its ``size`` in bytes,
    the ``rows`` it holds and, for class folders, its ``label``."""

    path: str
    size: int
    rows: int
    label: int = -1


@dataclass(frozen=True)
class Skipped:
    """An input file left out, and why (shown in the closing report)."""

    path: str
    reason: str


@dataclass
class Survey:
    """The input as the writer sees it: items in order, their schema, files left out at survey time."""

    root: Path
    items: list[Item]
    schema: pa.Schema
    skipped: list[Skipped] = field(default_factory=list)
    #: Format-specific facts the readers need (class names, extension columns) and the report shows.
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unit:
    """One work unit: consecutive items, committed together; ids ``first_id ..`` in item order."""

    index: int
    first_id: int
    items: tuple[Item, ...]

    @property
    def rows(self) -> int:
        return sum(item.rows for item in self.items)

    @property
    def size(self) -> int:
        return sum(item.size for item in self.items)


def plan_units(items: list[Item], unit_files: int, unit_bytes: int) -> list[Unit]:
    """``items`` in order, cut into units of at most ``unit_files`` files and ``unit_bytes`` bytes."""
    units: list[Unit] = []
    current: list[Item] = []
    first_id = next_id = current_bytes = 0
    for item in items:
        if current and (len(current) >= unit_files or current_bytes + item.size > unit_bytes):
            units.append(Unit(len(units), first_id, tuple(current)))
            current, first_id, current_bytes = [], next_id, 0
        current.append(item)
        current_bytes += item.size
        next_id += item.rows
    if current:
        units.append(Unit(len(units), first_id, tuple(current)))
    return units


def fingerprint(format_: str, survey: Survey, units: list[Unit], index: list[str] | None = None) -> str:
    """A hash of what the output will hold (and the columns it indexes, when any): equal for a
    rerun of the same prepare on the same input."""
    described: dict[str, Any] = {
        "format": format_,
        "items": [[item.path, item.size, item.rows, item.label] for item in survey.items],
        "units": [len(unit.items) for unit in units],
        "schema": survey.schema.remove_metadata().to_string(),
    }
    if index:
        described["index"] = list(index)
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def walk_files(root: Path, skipped: list[Skipped], on_bad_file: str) -> Iterator[Path]:
    """Every regular file under ``root``, folders in sorted order and a folder's files (sorted)
    before its sub-folders'; hidden files and folders (``.DS_Store``, ``.git``) are left out. An
    entry that is not a regular file (a FIFO, socket or device, a dangling symbolic link, a link
    loop) or whose name is not UTF-8 is never opened: it is listed in ``skipped`` (or, with
    ``on_bad_file="error"``, refused naming it) and left out."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                path = Path(folder) / name
                problem = _not_a_file(path)
                if problem is None:
                    yield path
                    continue
                shown = shown_path(path, root)
                if on_bad_file == "error":
                    raise ConfigError(
                        "input", shown, problem, "remove it from the input, or pass --on-bad-file skip to leave it out"
                    )
                skipped.append(Skipped(shown, problem))


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a regular file with a UTF-8 name that prepare may open, or None."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return "has a file name that is not UTF-8 (rename it)"
    try:
        mode = path.stat().st_mode  # follows a symbolic link; never opens the file
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if path.is_symlink():
            return f"is a dangling symbolic link (to {os.readlink(path)})"
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"is not a regular file ({kind}): never opened"


def shown_path(path: Path, root: Path) -> str:
    """`relative`, with bytes that are not UTF-8 shown as ``\\xNN`` escapes."""
    return os.fsencode(relative(path, root)).decode("utf-8", "backslashreplace")


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root``, ``/``-separated (``path``'s name when it is ``root``)."""
    return path.name if path == root else path.relative_to(root).as_posix()


def check_input(input_: str | os.PathLike[str], *, file_ok: bool) -> Path:
    """The input as a path, refused with a `ConfigError` when it is missing, or a file where a
    folder is needed."""
    path = Path(input_).expanduser()
    if not path.exists():
        raise ConfigError("input", str(input_), "does not exist", "give the folder (or file) holding the raw data")
    if path.is_file() and not file_ok:
        raise ConfigError("input", str(input_), "is a file; this format reads a folder", "give its folder")
    return path


def refuse_foreign(path: Path, root: Path, format_: str, expected: str) -> ConfigError:
    """The error for a file of another kind in the input (a folder of mixed formats)."""
    guess = FORMAT_OF_SUFFIX.get(path.suffix.lower())
    hint = f"; it looks like --format {guess}" if guess and guess != format_ else ""
    return ConfigError(
        "input",
        relative(path, root),
        f"is not {expected}, which --format {format_} reads (a folder of mixed formats?){hint}",
        "move the other files out of the input, or choose the --format they have",
    )


def empty_input(root: Path, format_: str, expected: str) -> ConfigError:
    return ConfigError("input", str(root), f"holds no {expected} (--format {format_})", "check the path and --format")


#: A file suffix -> the format that reads it, for the hint of `refuse_foreign`.
FORMAT_OF_SUFFIX = {
    ".parquet": "parquet",
    ".arrow": "hf",
    ".tar": "webdataset",
    ".jpg": "imagefolder",
    ".jpeg": "imagefolder",
    ".png": "imagefolder",
    ".mp4": "videofolder",
    ".wav": "audiofolder",
    ".flac": "audiofolder",
    ".mp3": "audiofolder",
}


def with_id(fields: list[pa.Field], metadata: dict[bytes, bytes] | None = None, *, where: str = "") -> pa.Schema:
    """The output schema: ``id`` (int64, not null) first, then ``fields``; a field named ``id``, or a
    name Lance reserves (`LANCE_RESERVED_COLUMNS`), is refused naming it and ``where`` it comes from."""
    for item in fields:
        if item.name in LANCE_RESERVED_COLUMNS:
            raise ConfigError(
                "input",
                where or item.name,
                f"has a column named `{item.name}`, a name Lance reserves ({', '.join(LANCE_RESERVED_COLUMNS)})",
                f"rename the column `{item.name}` in the input (e.g. `source{item.name}`) and prepare again",
            )
        if item.name == ID_COLUMN:
            raise ConfigError(
                "input",
                ID_COLUMN,
                "the input already has a column named `id`, which prepare adds (each row's stable id)",
                "rename that column in the input (e.g. `source_id`) and prepare again",
            )
    return pa.schema([pa.field(ID_COLUMN, pa.int64(), nullable=False), *fields], metadata=metadata)
