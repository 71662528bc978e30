"""A prediction run's folder: what each rank predicted, one record per finished fragment, the marker.

Guarantees:
- Every file is written whole or not at all (a temporary name, then a rename), so a run killed at
  any moment leaves only complete files: a *piece* (some rows of one fragment predicted by one
  rank: their offsets, Lance row ids and output columns, an Arrow IPC file whose name holds its
  rank, first offset and row count), a fragment's *record* (the ``FragmentMetadata`` of the
  fragment with its new column file(s), written by `RunFolder.finish`, and the Lance schema with
  the new columns as JSON and protobuf bytes: nothing read back from storage is unpickled),
  ``run.json`` (read version, its data files' fingerprint, rows expected per fragment),
  ``model.json`` (what computes the values, `lance_lightning.write.predict_checks`),
  ``columns.json`` (the output columns' Arrow types) and ``marker.json`` (the committed version).
- A fragment is finished once its pieces hold as many rows as the run expects of it (the predict
  split reads each row once); `RunFolder.finish` then writes its column file(s) through
  ``LanceFragment.merge_columns`` at the pinned version, reading only the fragment's row
  addresses: the existing columns' files are neither read nor rewritten. Rows a run did not
  predict (deleted, or outside the filter) get nulls.
- A bad row the bad-row policy replaced (`ReplaceBadRow`) is stored in its own fragment's piece
  with null outputs and ``_bad`` set: it counts toward the fragment's rows, gets nulls, and is
  counted as bad in the record (never as written).
- The folder lives under the dataset (``<uri>/_lance_lightning/predict/<run id>``) unless one is
  given; on S3 (or an S3-compatible store) it is opened with the dataset's ``storage_options``
  (endpoint, keys, region, ``allow_http``), other stores by pyarrow from the URI and the
  environment; nothing in it is read by Lance.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
from lance.fragment import FragmentMetadata
from lance.schema import LanceSchema

from lance_lightning.errors import ConfigError
from lance_lightning.source import PinnedSource
from lance_lightning.write.input_fs import filesystem

#: The column of a piece holding each row's offset in its fragment.
OFFSET = "_offset"
#: The column of a piece holding each row's Lance row id (`lance_lightning.vocabulary.ROW_ID`).
ROW_IDS = "_row_id"
#: The column of a piece marking a bad row the bad-row policy replaced (its outputs are null).
BAD = "_bad"
#: With ``overwrite``, the new column files' names for the columns they replace (never committed).
OVERWRITE_PREFIX = "__lance_lightning_new_"
_LOW = np.int64(0xFFFFFFFF)


def split_addresses(addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fragment ids, offsets) of row addresses ``fragment_id << 32 | offset``."""
    addresses = np.asarray(addresses, dtype=np.int64)
    return addresses >> 32, addresses & _LOW


class RunFolder:
    """The files of one prediction run under ``root`` (a local path or a URI pyarrow opens)."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        if "://" not in root:
            root = os.path.abspath(root)
        self.root = root
        self.fs, self.path = filesystem(root, storage_options)

    # -- whole files ------------------------------------------------------------------------
    def _write(self, name: str, data: bytes) -> None:
        final = f"{self.path}/{name}"
        self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        temporary = f"{final}.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(temporary) as out:
            out.write(data)
        self.fs.move(temporary, final)

    def _read(self, name: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/{name}") as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def read_json(self, name: str) -> dict[str, Any] | None:
        data = self._read(name)
        return None if data is None else json.loads(data)

    def written_json(self, name: str) -> dict[str, Any]:
        """`read_json` of a file this run wrote before (its absence: the folder changed underneath)."""
        value = self.read_json(name)
        if value is None:
            raise RuntimeError(f"the prediction run folder {self.path} lost its {name}")
        return value

    def write_json(self, name: str, value: dict[str, Any]) -> None:
        self._write(name, json.dumps(value, sort_keys=True).encode())

    def _names(self, folder: str) -> list[str]:
        selector = pafs.FileSelector(f"{self.path}/{folder}", allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(selector) if ".tmp-" not in info.base_name)

    # -- pieces -----------------------------------------------------------------------------
    def write_piece(self, fragment: int, rank: int, offsets: np.ndarray, columns: dict[str, pa.Array]) -> str:
        """Store rows ``offsets`` of ``fragment`` predicted by ``rank``; returns the piece's name."""
        table = pa.table({OFFSET: pa.array(offsets, type=pa.int64()), **columns})
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        name = f"{rank:05d}-{int(offsets[0]):010d}-{len(offsets)}.arrow"
        self._write(f"pieces/{fragment}/{name}", sink.getvalue().to_pybytes())
        return name

    def read_pieces_schema(self, fragments: list[int]) -> pa.Schema:
        """The schema of the first piece of ``fragments`` (every piece of a run has the same)."""
        for fragment in fragments:
            for name in self.pieces(fragment):
                with self.fs.open_input_file(f"{self.path}/pieces/{fragment}/{name}") as source:
                    return ipc.open_file(source).schema
        raise RuntimeError(f"prediction run folder {self.root} has no pieces")

    def pieces(self, fragment: int) -> list[str]:
        return self._names(f"pieces/{fragment}")

    def piece_rows(self, fragment: int) -> int:
        """Rows the fragment's pieces hold (from their names: no piece is read)."""
        return sum(int(name.rsplit("-", 1)[1].split(".")[0]) for name in self.pieces(fragment))

    def read_pieces(self, fragment: int) -> pa.Table | None:
        """The fragment's predicted rows, sorted by offset (``None`` without pieces)."""
        tables = []
        for name in self.pieces(fragment):
            with self.fs.open_input_file(f"{self.path}/pieces/{fragment}/{name}") as source:
                tables.append(ipc.open_file(source).read_all())
        if not tables:
            return None
        return pa.concat_tables(tables).sort_by(OFFSET)

    def stored(self) -> bool:
        """Whether any piece is stored (of any fragment)."""
        return bool(self._names("pieces"))

    def drop_all(self) -> None:
        """Delete everything the run stored: pieces, records, run.json, columns, model and marker."""
        for name in ("pieces", "records"):
            if self.fs.get_file_info(f"{self.path}/{name}").type != pafs.FileType.NotFound:
                self.fs.delete_dir(f"{self.path}/{name}")
        for name in ("marker.json", "run.json", "columns.json", "model.json"):
            if self.fs.get_file_info(f"{self.path}/{name}").type != pafs.FileType.NotFound:
                self.fs.delete_file(f"{self.path}/{name}")

    def check_writable(self, dataset: str | None = None) -> None:
        """`ConfigError` naming the folder when the run folder (or, for a local ``dataset``, its
        ``data/`` folder, where the new column files go) cannot be written."""
        probe = f"probe-{uuid.uuid4().hex}"
        try:
            self._write(probe, b"")
            self.fs.delete_file(f"{self.path}/{probe}")
        except OSError as error:
            raise ConfigError(
                "LancePredictionWriter.run_dir",
                self.root,
                f"the prediction run folder cannot be written ({type(error).__name__}: {error})",
                "make it writable, or set run_dir to a writable folder",
            ) from None
        if dataset is None or "://" in dataset:
            return
        data = os.path.join(dataset, "data")
        try:
            with open(os.path.join(data, probe), "wb"):
                pass
            os.remove(os.path.join(data, probe))
        except OSError as error:
            raise ConfigError(
                "predict dataset",
                dataset,
                f"its data folder cannot be written ({type(error).__name__}: {error}), and the new columns' files "
                "go there",
                "make the dataset folder writable, or write the outputs to a table of their own (table: <uri>)",
            ) from None

    def drop_pieces(self, fragment: int | None = None) -> None:
        """Delete the pieces of ``fragment`` (of every fragment for ``None``)."""
        folder = f"{self.path}/pieces" + ("" if fragment is None else f"/{fragment}")
        if self.fs.get_file_info(folder).type != pafs.FileType.NotFound:
            self.fs.delete_dir(folder)

    # -- records ----------------------------------------------------------------------------
    def record(self, fragment: int) -> dict[str, Any] | None:
        return self.read_json(f"records/{fragment}.json")

    def recorded(self) -> set[int]:
        return {int(name.split(".")[0]) for name in self._names("records") if name.endswith(".json")}

    def finish(
        self, source: PinnedSource, fragment: int, types: dict[str, pa.DataType], overwrite: bool = False
    ) -> dict[str, Any]:
        """Write ``fragment``'s new column file(s) from its pieces (no commit) and its record; with
        ``overwrite`` the file's columns get names of their own (`OVERWRITE_PREFIX`): the commit
        replaces the existing columns' data with them."""
        piece = source.fragment(fragment)
        before = {data_file.path for data_file in piece.metadata.files}
        table, bad = good_rows(self.read_pieces(fragment))
        stored = {(OVERWRITE_PREFIX if overwrite else "") + name: kind for name, kind in types.items()}
        metadata, schema = piece.merge_columns(
            _lookup(table, list(types), stored), columns=["_rowaddr"], reader_schema=pa.schema(list(stored.items()))
        )
        written = sum(f.file_size_bytes or 0 for f in metadata.files if f.path not in before)
        record = {
            "fragment": fragment,
            "metadata": metadata.to_json(),
            "lance_schema": _schema_json(schema),
            "rows": 0 if table is None else table.num_rows,
            "bad": bad,
            "bytes": written,
        }
        self.write_json(f"records/{fragment}.json", record)
        return record


def good_rows(table: pa.Table | None) -> tuple[pa.Table | None, int]:
    """``table`` without its bad rows (`BAD`), and how many there were."""
    if table is None or BAD not in table.column_names:
        return table, 0
    bad = table.column(BAD).combine_chunks().fill_null(False)
    return table.filter(pa.compute.invert(bad)), int(pa.compute.sum(bad.cast(pa.int64())).as_py() or 0)


def record_metadata(record: dict[str, Any]) -> FragmentMetadata:
    return FragmentMetadata.from_json(json.dumps(record["metadata"]))


def record_schema(record: dict[str, Any]) -> Any:
    """The Lance schema a record's column files were written for: parsed from its JSON metadata and
    protobuf field bytes (`_schema_json`), never unpickled. A record of an older release (a pickled
    schema) is refused by name."""
    if "lance_schema" not in record:
        raise ConfigError(
            "prediction run record",
            f"fragment {record.get('fragment')}",
            "was written by an older lance-lightning (a pickled schema, which is never loaded)",
            "delete the run folder and rerun the prediction",
        )
    saved = record["lance_schema"]
    return LanceSchema._from_protos(saved["metadata"], *(base64.b64decode(field) for field in saved["fields"]))


def _schema_json(schema: LanceSchema) -> dict[str, Any]:
    """A Lance schema as JSON: its metadata and each field's protobuf bytes (what Lance's own
    ``__reduce__`` hands to ``LanceSchema._from_protos``), base64-encoded."""
    # Lance's stub leaves out ``__reduce__`` (object's: ``str | tuple``); it returns (function, arguments).
    _, (metadata, *fields) = cast("tuple[Any, tuple[Any, ...]]", schema.__reduce__())
    return {"metadata": metadata, "fields": [base64.b64encode(field).decode() for field in fields]}


def _lookup(table: pa.Table | None, names: list[str], types: dict[str, pa.DataType]) -> Any:
    """The ``merge_columns`` function: each row address's predicted values, null where none."""
    offsets = np.zeros(0, dtype=np.int64) if table is None else table.column(OFFSET).to_numpy()

    def values(batch: pa.RecordBatch) -> pa.RecordBatch:
        wanted = batch.column("_rowaddr").to_numpy().astype(np.uint64).astype(np.int64) & _LOW
        if table is None or len(offsets) == 0:
            return pa.record_batch([pa.nulls(len(wanted), kind) for kind in types.values()], names=list(types))
        index = np.minimum(np.searchsorted(offsets, wanted), len(offsets) - 1)
        take = pa.array(index, mask=offsets[index] != wanted)
        return pa.record_batch([table.column(name).take(take).combine_chunks() for name in names], names=list(types))

    return values
