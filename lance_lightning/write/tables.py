"""Table formats: ``parquet`` (files or a folder) and ``hf`` (a Hugging Face ``save_to_disk`` folder).

Guarantees:
- ``parquet``: the input is one ``.parquet`` file or a folder of them, read in `walk_files` order;
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
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lance_lightning.errors import ConfigError
from lance_lightning.write.units import (
    Item,
    Skipped,
    Survey,
    Unit,
    check_input,
    empty_input,
    refuse_foreign,
    relative,
    walk_files,
    with_id,
)

#: Rows per record batch read from a file.
BATCH_ROWS = 8192


class _TableFormat(ABC):
    """A format of Arrow tables in files: the subclasses say which files and how to open them."""

    name = ""

    @abstractmethod
    def files(self, root: Path, skipped: list[Skipped], on_bad_file: str) -> list[Path]:
        """The format's files under ``root`` (or ``root`` itself), in the order they are read
        (entries that are not regular files listed in ``skipped``, `walk_files`)."""

    @abstractmethod
    def inspect(self, path: Path) -> tuple[pa.Schema, int]:
        """The file's schema and row count."""

    @abstractmethod
    def batches(self, path: Path) -> Iterator[pa.RecordBatch]:
        """The file's rows, in order."""

    def survey(self, input_: str, on_bad_file: str) -> Survey:
        root = check_input(input_, file_ok=self.name == "parquet")
        items: list[Item] = []
        skipped: list[Skipped] = []
        first: pa.Schema | None = None
        for path in self.files(root, skipped, on_bad_file):
            name = relative(path, root)
            try:
                schema, rows = self.inspect(path)
            except (pa.ArrowException, OSError) as error:
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
            items.append(Item(name, path.stat().st_size, rows))
        if first is None or not any(item.rows for item in items):
            raise empty_input(root, self.name, "rows in readable files")
        metadata = {k: v for k, v in (first.metadata or {}).items() if k == b"huggingface"} or None
        return Survey(root, items, with_id(list(first.remove_metadata()), metadata, where=items[0].path), skipped)

    def read(self, survey: Survey, unit: Unit, skipped: list[Skipped], on_bad_file: str) -> Iterator[pa.RecordBatch]:
        """Yield the unit's rows with their ``id`` column, in file order."""
        next_id = unit.first_id
        for item in unit.items:
            for batch in self.batches(table_path(survey.root, item)):
                ids = pa.array(range(next_id, next_id + batch.num_rows), pa.int64())
                next_id += batch.num_rows
                yield pa.RecordBatch.from_arrays([ids, *batch.columns], schema=survey.schema)


class Parquet(_TableFormat):
    name = "parquet"

    def files(self, root: Path, skipped: list[Skipped], on_bad_file: str) -> list[Path]:
        paths = [root] if root.is_file() else list(walk_files(root, skipped, on_bad_file))
        for path in paths:
            if path.suffix.lower() not in (".parquet", ".pq"):
                raise refuse_foreign(path, root, self.name, "a Parquet file (.parquet)")
        return paths

    def inspect(self, path: Path) -> tuple[pa.Schema, int]:
        with pq.ParquetFile(path) as handle:
            return handle.schema_arrow, handle.metadata.num_rows

    def batches(self, path: Path) -> Iterator[pa.RecordBatch]:
        with pq.ParquetFile(path) as handle:
            yield from handle.iter_batches(batch_size=BATCH_ROWS)


class HuggingFace(_TableFormat):
    name = "hf"

    def files(self, root: Path, skipped: list[Skipped], on_bad_file: str) -> list[Path]:
        state = root / "state.json"
        if not state.exists():
            splits = root / "dataset_dict.json"
            if splits.exists():
                names = json.loads(splits.read_text()).get("splits", [])
                raise ConfigError(
                    "input",
                    str(root),
                    f"is a DatasetDict of the splits {names}; prepare reads one split",
                    f"give one split's folder, e.g. --input {root / (names[0] if names else 'train')}",
                )
            raise ConfigError(
                "input", str(root), "is not a save_to_disk folder (no state.json)", "give the folder save_to_disk wrote"
            )
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError("input", str(state), f"cannot be read ({error!r})", "save the dataset again") from None
        for name in names:
            if not (root / name).is_file():
                raise ConfigError("input", str(root / name), "is listed in state.json but missing", "save it again")
        return [root / name for name in names]

    def inspect(self, path: Path) -> tuple[pa.Schema, int]:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_stream(source)
            return reader.schema, sum(batch.num_rows for batch in reader)

    def batches(self, path: Path) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(str(path)) as source:
            for batch in pa.ipc.open_stream(source):
                yield from pa.Table.from_batches([batch]).to_batches(max_chunksize=BATCH_ROWS)


def _difference(first: pa.Schema, other: pa.Schema) -> str:
    """The first difference between two schemas, in a few words."""
    for name in dict.fromkeys(first.names + other.names):
        a = first.field(name).type if name in first.names else None
        b = other.field(name).type if name in other.names else None
        if a != b:
            return f"column `{name}` is {b or 'missing'} (was {a or 'missing'})"
    return "the column order differs"


def table_path(root: Path, item: Item) -> Path:
    """The item's file (the input itself when it is one file)."""
    return root if root.is_file() else root / item.path
