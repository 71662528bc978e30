"""The ``webdataset`` format: tar shards whose files are grouped into samples by key.

Guarantees:
- The input is one ``.tar`` (``.tar.gz``, ``.tgz``) file or a folder of them, local or in a store
  (`lance_lightning.write.input_fs`: read through a read-ahead buffer), in `Input.files` order.
  As in WebDataset, a member ``dir/name.ext1.ext2`` has the key ``dir/name`` and the extension
  ``ext1.ext2``; consecutive members with one key are one sample, in the shard's order.
- Columns: ``id`` (int64, the sample's position in the whole input), ``key`` (string), ``shard``
  (the tar file relative to the input) and one column per extension found in any shard (dots
  become underscores: ``seg.png`` is ``seg_png``), null where a sample lacks it, typed as
  WebDataset decodes it (`lance_lightning.write.wds_types`: ``cls`` int64, ``txt`` string,
  ``json`` struct or string; a member that does not fit keeps the column binary, noted in the
  report), other extensions large_binary. A binary extension whose files average `BLOB_BYTES` or
  more (videos, long audio) is stored with Lance's blob encoding, the others plain
  (docs/getting-data-in.md: where blobs pay).
- Every shard's headers are read at survey time: a shard that is not a readable tar is skipped and
  listed (or refused, by ``on_bad_file``) before anything is written; a member without an
  extension is left out and listed.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator

import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.write.folders import BLOB_METADATA
from lance_lightning.write.input_fs import open_input, unreachable
from lance_lightning.write.units import Item, Skipped, Survey, Unit, empty_input, refuse_foreign, with_id
from lance_lightning.write.wds_types import ColumnTyper, cell, kind

_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
#: WebDataset's split of a member name into key and extension.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Rows per record batch handed to the fragment writer.
BATCH_ROWS = 256
#: An extension's files of this mean size or more are stored as Lance blobs: through the loader plain
#: binary read faster up to 110 KiB and blobs at 1 MiB (benchmarks/results/blob_layout.md); Lance's
#: own calls agree (benchmarks/results/blob_encoding.md: inline wins at 4 KiB, mixed at 64 KiB,
#: blobs write ~10x and range-read ~10x faster at 1 MiB).
BLOB_BYTES = 1 << 20


def _samples(tar: tarfile.TarFile) -> Iterator[tuple[str, list[tuple[str, tarfile.TarInfo]]]]:
    """(key, [(extension, member)]) per sample, in the shard's order; a member without an
    extension comes as (its name, [])."""
    key = ""  # no sample yet (a key has at least one character)
    members: list[tuple[str, tarfile.TarInfo]] = []
    for member in tar:
        if not member.isfile():
            continue
        match = _KEY_EXT.match(member.name)
        if match is None:
            yield member.name, []
            continue
        if match.group(1) != key and members:
            yield key, members
            members = []
        key = match.group(1)
        members.append((match.group(2), member))
    if members:
        yield key, members


class WebDataset:
    """The ``webdataset`` format (see the module docstring)."""

    name = "webdataset"

    def survey(self, input_: str, on_bad_file: str, storage_options: dict[str, str] | None = None) -> Survey:
        source = open_input(input_, storage_options, file_ok=True)
        skipped: list[Skipped] = []
        items: list[Item] = []
        extensions: dict[str, tuple[int, int]] = {}  # extension -> (files, bytes)
        typers: dict[str, ColumnTyper] = {}
        for entry in list(source.files(skipped, on_bad_file)):
            name = entry.path
            if not name.lower().endswith(_SHARD_SUFFIXES):
                raise refuse_foreign(name, self.name, "a tar shard (.tar, .tar.gz, .tgz)")
            try:
                with source.open(name) as handle, tarfile.open(fileobj=handle, mode="r:*") as tar:
                    samples = 0
                    for key, members in _samples(tar):
                        if not members:
                            skipped.append(Skipped(f"{name}:{key}", "has no extension, so no sample key"))
                            continue
                        samples += 1
                        for ext, member in members:
                            count, total = extensions.get(ext, (0, 0))
                            extensions[ext] = (count + 1, total + member.size)
                            if kind(ext) != "bytes":
                                typer = typers.setdefault(ext, ColumnTyper(ext))
                                typer.see(f"{name}:{key}.{ext}", _bytes(tar, member))
            except (tarfile.TarError, EOFError, OSError) as error:
                if source.remote and isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
                    raise unreachable(source, error) from None  # nothing written yet; no shard skipped
                problem = f"is not a readable tar shard ({error})"
                if on_bad_file == "error":
                    raise ConfigError("input", name, problem, "replace the shard, or pass --on-bad-file skip") from None
                skipped.append(Skipped(name, problem))
                continue
            items.append(Item(name, entry.size, samples, mtime_ns=entry.mtime_ns))
        if not any(item.rows for item in items):
            raise empty_input(source, self.name, "samples in readable tar shards")
        columns = {ext: ext.replace(".", "_") for ext in sorted(extensions)}
        for ext, column in columns.items():
            if column in ("key", "shard") or list(columns.values()).count(column) > 1:
                raise ConfigError(
                    "input", ext, f"the extension's column `{column}` clashes with another column", "rename the files"
                )
        fields = [pa.field("key", pa.string()), pa.field("shard", pa.string())]
        notes, why = [], {}
        for ext, column in columns.items():
            count, total = extensions[ext]
            if ext in typers:  # WebDataset's own decoding: int64, string, struct (or bytes, noted)
                fields.append(pa.field(column, typers[ext].arrow_type()))
                notes += [note for note in [typers[ext].note(column)] if note]
                continue
            blob = total >= BLOB_BYTES * count
            why[column] = (
                f"its members average {total / count / 1024:,.0f} KiB, {'at least' if blob else 'under'} 1 MiB"
            )
            fields.append(pa.field(column, pa.large_binary(), metadata=BLOB_METADATA if blob else None))
        kinds = {ext: kind(ext) for ext in columns}
        info = {"columns": columns, "kinds": kinds, "notes": notes, "why": why}
        return Survey(source, items, with_id(fields, where="the extensions of the shards' members"), skipped, info)

    def read(self, survey: Survey, unit: Unit, skipped: list[Skipped], on_bad_file: str) -> Iterator[pa.RecordBatch]:
        """Yield the unit's samples as record batches of at most `BATCH_ROWS` rows, in order."""
        columns: dict[str, str] = survey.info["columns"]
        kinds: dict[str, str] = survey.info["kinds"]
        types = {ext: survey.schema.field(column).type for ext, column in columns.items()}
        next_id = unit.first_id
        rows: list[dict] = []
        for item in unit.items:
            with survey.source.open(item.path) as handle, tarfile.open(fileobj=handle, mode="r:*") as tar:
                for key, members in _samples(tar):
                    if not members:
                        continue
                    row = {"id": next_id, "key": key, "shard": item.path}
                    row.update(
                        {columns[ext]: cell(kinds[ext], types[ext], _bytes(tar, member)) for ext, member in members}
                    )
                    rows.append(row)
                    next_id += 1
                    if len(rows) >= BATCH_ROWS:
                        yield pa.RecordBatch.from_pylist(rows, schema=survey.schema)
                        rows = []
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=survey.schema)


def _bytes(tar: tarfile.TarFile, member: tarfile.TarInfo | None) -> bytes:
    handle = tar.extractfile(member) if member is not None else None
    return handle.read() if handle is not None else b""
