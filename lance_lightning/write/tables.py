"""Table formats: ``parquet`` (files or a folder) and ``hf`` (a Hugging Face ``save_to_disk`` folder).

Guarantees:
- ``parquet``: the input is one ``.parquet`` file or a folder of them, read in `Input.files` order
  (local, or in any store ``pyarrow.fs`` opens: `lance_lightning.write.input_fs`);
  ``hf``: the Arrow IPC stream files that the folder's ``state.json`` lists (``_data_files``), in
  its order, read with pyarrow alone (no ``datasets`` library). A ``DatasetDict`` folder (with
  ``dataset_dict.json``) is refused, naming its splits' folders.
- Columns: ``id`` (int64, the row's position in the whole input) and the input's columns, as
  they are. Every file must have the first one's schema: a file that differs is refused, naming
  it and the difference, at survey time, before anything is written. An ``hf`` dataset keeps its
  ``huggingface`` schema metadata (its features).
- A file that cannot be read as Parquet (or Arrow) is skipped and listed, or refused, by
  ``on_bad_file``, at survey time.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from lance_lightning.errors import ConfigError
from lance_lightning.write.input_fs import Entry, Input, open_input, unreachable
from lance_lightning.write.units import Item, Skipped, Survey, Unit, empty_input, refuse_foreign, suffix, with_id

#: Rows per record batch read from a file.
BATCH_ROWS = 8192


class _TableFormat(ABC):
    """A format of Arrow tables in files: the subclasses say which files and how to open them."""

    name = ""

    @abstractmethod
    def files(self, source: Input, skipped: list[Skipped], on_bad_file: str) -> list[Entry]:
        """The format's files in ``source`` (or the input itself), in the order they are read
        (entries that are not regular files listed in ``skipped``, `Input.files`)."""

    @abstractmethod
    def inspect(self, source: Input, path: str) -> tuple[pa.Schema, int]:
        """The file's schema and row count."""

    @abstractmethod
    def batches(self, source: Input, path: str) -> Iterator[pa.RecordBatch]:
        """The file's rows, in order."""

    def survey(self, input_: str, on_bad_file: str, storage_options: dict[str, str] | None = None) -> Survey:
        source = open_input(input_, storage_options, file_ok=self.name == "parquet")
        items: list[Item] = []
        skipped: list[Skipped] = []
        first: pa.Schema | None = None
        for entry in self.files(source, skipped, on_bad_file):
            name = entry.path
            try:
                schema, rows = self.inspect(source, name)
            except (pa.ArrowException, OSError) as error:
                if source.remote and isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
                    raise unreachable(source, error) from None  # nothing written yet; no file skipped
                problem = f"cannot be read as {self.name} ({error})"
                if on_bad_file == "error":
                    raise ConfigError("input", name, problem, "replace the file, or pass --on-bad-file skip") from None
                skipped.append(Skipped(name, problem))
                continue
            if first is None:
                first = schema
            elif not schema.remove_metadata().equals(first.remove_metadata()):
                raise ConfigError(
                    "input",
                    name,
                    f"has another schema than {items[0].path}: {_difference(first, schema)}",
                    "convert the files to one schema, or prepare them as separate datasets",
                )
            items.append(Item(name, entry.size, rows, mtime_ns=entry.mtime_ns))
        if first is None or not any(item.rows for item in items):
            raise empty_input(source, self.name, "rows in readable files")
        metadata = {k: v for k, v in (first.metadata or {}).items() if k == b"huggingface"} or None
        return Survey(source, items, with_id(list(first.remove_metadata()), metadata, where=items[0].path), skipped)

    def read(self, survey: Survey, unit: Unit, skipped: list[Skipped], on_bad_file: str) -> Iterator[pa.RecordBatch]:
        """Yield the unit's rows with their ``id`` column, in file order."""
        next_id = unit.first_id
        for item in unit.items:
            for batch in self.batches(survey.source, item.path):
                ids = pa.array(range(next_id, next_id + batch.num_rows), pa.int64())
                next_id += batch.num_rows
                yield pa.RecordBatch.from_arrays([ids, *batch.columns], schema=survey.schema)


class Parquet(_TableFormat):
    name = "parquet"

    def files(self, source: Input, skipped: list[Skipped], on_bad_file: str) -> list[Entry]:
        entries = list(source.files(skipped, on_bad_file))
        for entry in entries:
            if suffix(entry.path) not in (".parquet", ".pq"):
                raise refuse_foreign(entry.path, self.name, "a Parquet file (.parquet)")
        return entries

    def inspect(self, source: Input, path: str) -> tuple[pa.Schema, int]:
        with pq.ParquetFile(source.arrow_file(path)) as handle:
            return handle.schema_arrow, handle.metadata.num_rows

    def batches(self, source: Input, path: str) -> Iterator[pa.RecordBatch]:
        with pq.ParquetFile(source.arrow_file(path)) as handle:
            yield from handle.iter_batches(batch_size=BATCH_ROWS)


class HuggingFace(_TableFormat):
    name = "hf"

    def files(self, source: Input, skipped: list[Skipped], on_bad_file: str) -> list[Entry]:
        shown = source.shown.rstrip("/")
        if source.entry("state.json") is None:
            if source.entry("dataset_dict.json") is not None:
                names = json.loads(source.read_bytes("dataset_dict.json")).get("splits", [])
                raise ConfigError(
                    "input",
                    shown,
                    f"is a DatasetDict of the splits {names}; prepare reads one split",
                    f"give one split's folder, e.g. --input {shown}/{names[0] if names else 'train'}",
                )
            raise ConfigError(
                "input", shown, "is not a save_to_disk folder (no state.json)", "give the folder save_to_disk wrote"
            )
        try:
            names = [entry["filename"] for entry in json.loads(source.read_bytes("state.json"))["_data_files"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(
                "input", f"{shown}/state.json", f"cannot be read ({error!r})", "save the dataset again"
            ) from None
        entries = []
        for name in names:
            entry = source.entry(name)
            if entry is None:
                raise ConfigError("input", f"{shown}/{name}", "is listed in state.json but missing", "save it again")
            entries.append(entry)
        return entries

    def inspect(self, source: Input, path: str) -> tuple[pa.Schema, int]:
        with _ipc_file(source, path) as stream:
            reader = pa.ipc.open_stream(stream)
            return reader.schema, sum(batch.num_rows for batch in reader)

    def batches(self, source: Input, path: str) -> Iterator[pa.RecordBatch]:
        with _ipc_file(source, path) as stream:
            for batch in pa.ipc.open_stream(stream):
                yield from pa.Table.from_batches([batch]).to_batches(max_chunksize=BATCH_ROWS)


def _ipc_file(source: Input, path: str) -> pa.NativeFile:
    """An Arrow stream file: memory-mapped when local, a store's file otherwise."""
    opened = source.arrow_file(path)
    return pa.memory_map(opened) if isinstance(opened, str) else opened


def _difference(first: pa.Schema, other: pa.Schema) -> str:
    """The first difference between two schemas, in a few words."""
    for name in dict.fromkeys(first.names + other.names):
        a = first.field(name).type if name in first.names else None
        b = other.field(name).type if name in other.names else None
        if a != b:
            return f"column `{name}` is {b or 'missing'} (was {a or 'missing'})"
    return "the column order differs"
