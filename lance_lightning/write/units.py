"""What a prepare writes, as deterministic work units: the survey of the input and its split into units.

Guarantees:
- A `Survey` lists the input's items (files) in a fixed order (`lance_lightning.write.input_fs`:
  a local folder or any store ``pyarrow.fs`` opens), with their sizes, modification times and row
  counts, and the Arrow schema every unit's batches have (``id`` first).
  The same input gives the same survey, on any machine and any number of workers.
- `plan_units` splits the items, in that order, into units of at most ``unit_files`` files and
  ``unit_bytes`` input bytes (a larger file is a unit alone). Unit ``k`` covers the ids
  ``first_id .. first_id + rows - 1``: a row's ``id`` is its position in the whole input, so it is
  stable whether a row before it was skipped, whatever the workers, and across an interrupted run.
- `fingerprint` hashes the format, the items (path, size, rows), the unit boundaries and the
  schema: a rerun resumes a partial output only when it is the same.
- `unit_files` hashes a unit's files (path, size, modification time): each unit's commit records
  it, and a rerun resumes a partial output only when the files of its committed units are
  unchanged (`lance_lightning.write.writer`): a file rewritten in place with the same size
  (same fingerprint) is found too.
- Every check of the input raises `ConfigError` naming the file or the flag, before anything is written:
  a column name Lance reserves (``_rowid``, ``_rowaddr``, ...) or ``id`` among them.
- The listing never opens what is not a regular file: FIFOs, sockets, devices, dangling symbolic
  links, link loops and names that are not UTF-8 are skipped and listed (path shown escaped), or
  refused by ``on_bad_file="error"``; a prepare never blocks on one (`input_fs.Input.files`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import LANCE_RESERVED_COLUMNS
from lance_lightning.write.input_fs import Input, Skipped

#: The column holding each row's stable integer id.
ID_COLUMN = "id"


@dataclass(frozen=True)
class Item:
    """One input file: ``path`` relative to the input root (``/``-separated), its ``size`` in bytes,
    the ``rows`` it holds, for class folders its ``label``, and its modification time (ns)."""

    path: str
    size: int
    rows: int
    label: int = -1
    mtime_ns: int = 0


@dataclass
class Survey:
    """The input as the writer sees it: items in order, their schema, files left out at survey time."""

    #: Where the files are (`lance_lightning.write.input_fs`): readers open items through it.
    source: Input
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


def unit_files(unit: Unit) -> str:
    """A hash of the unit's files as the survey found them: path, size and modification time."""
    described = [[item.path, item.size, item.mtime_ns] for item in unit.items]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def check_unchanged(recorded: list[str | None], units: list[Unit], shown: str, staging: str) -> None:
    """Refuse (`ConfigError`) to resume when a committed unit's files were modified since its commit
    (``recorded``: the hashes its commits hold): same paths and sizes, so the same fingerprint, but
    another modification time; the rows committed hold the old files."""
    for files, unit in zip(recorded, units):
        if files is not None and files != unit_files(unit):
            names = [item.path for item in unit.items]
            listed = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
            raise ConfigError(
                "input",
                shown,
                f"changed since the interrupted prepare at {staging} committed them: a file of {listed} "
                "was modified (another modification time)",
                f"put the files back as they were, or delete {staging} to prepare the current files",
            )


def refuse_foreign(path: str, format_: str, expected: str) -> ConfigError:
    """The error for the file ``path`` (relative to the input) of another kind in the input (a folder
    of mixed formats)."""
    guess = FORMAT_OF_SUFFIX.get(suffix(path))
    hint = f"; it looks like --format {guess}" if guess and guess != format_ else ""
    return ConfigError(
        "input",
        path,
        f"is not {expected}, which --format {format_} reads (a folder of mixed formats?){hint}",
        "move the other files out of the input, or choose the --format they have",
    )


def suffix(path: str) -> str:
    """The lowercased extension of a ``/``-separated path (``.jpg``), ``""`` if none."""
    name = path.rsplit("/", 1)[-1]
    return name[name.rindex(".") :].lower() if "." in name.lstrip(".") else ""


def empty_input(source: Input, format_: str, expected: str) -> ConfigError:
    return ConfigError(
        "input", source.shown, f"holds no {expected} (--format {format_})", "check the path and --format"
    )


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
