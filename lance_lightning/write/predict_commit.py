"""A prediction run's identity, the rows it owes each fragment, and its one commit (or its table).

Guarantees:
- `run_id` depends only on the dataset's location, the predict filter, the output columns, the
  run's name, ``overwrite`` and the separate table, never on the version: a rerun of the same
  command (even after other writers added versions) finds its run, its read version and records.
- `commit` makes exactly one new dataset version holding every fragment's new column file(s): one
  ``LanceOperation.Merge`` at the pinned read version (with ``overwrite``, one ``DataReplacement``
  of the existing columns' data, same types), whose transaction properties carry the run
  id (`RUN_PROPERTY`). `committed_version` finds that version again from the dataset's
  transactions, so a run killed between its commit and its marker never commits twice.
- A concurrent run of the same command (a twin: the same run id) that committed first is
  recognised: `commit` returns its version (``made`` false) instead of blaming its Merge.
- `fingerprint` names the read version's data files (fragment ids and file names, which are unique
  per write): a dataset deleted and written again at the same path, whose version numbers restart,
  has another.
- Rows another writer appended while the run lasted are kept, with nulls in the new columns (the
  commit is made on top of the appends). Any other change since the read version (a compaction,
  a delete, an update, another schema change) makes `commit` raise a `ConfigError` that names the
  version and its operation; nothing is committed then.
- `write_table` (the writer's ``table`` option) creates the separate table in one version whose
  transaction properties carry the run id, so `committed_version` finds it too.
- `hold` tags the read version (``lance-lightning-predict-<run>-v<version>``, listed by
  ``lance-lightning holds``) until `release`, after the commit.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import DataFile

from lance_lightning.errors import ConfigError
from lance_lightning.launch import tool_command
from lance_lightning.source import PinnedSource
from lance_lightning.write.predict_store import (
    BAD,
    OFFSET,
    ROW_IDS,
    RunFolder,
    good_rows,
    record_metadata,
    record_schema,
    split_addresses,
)

if TYPE_CHECKING:
    from lance.lance.schema import LanceField

#: The transaction property naming the prediction run a commit belongs to.
RUN_PROPERTY = "lance-lightning.predict-run"


def run_id(location: str, filter: str | None, columns: list[str], run_name: str, overwrite: bool, table: str) -> str:
    """16 hex digits naming the run: same dataset, filter, columns, name, overwrite and table -> same run."""
    key = json.dumps([location.rstrip("/"), filter, sorted(columns), run_name, overwrite, table])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def fingerprint(dataset: lance.LanceDataset) -> str:
    """16 hex digits naming the data files of ``dataset``'s version (fragment ids and file names)."""
    files = [[f.fragment_id, [d.path for d in f.metadata.files]] for f in dataset.get_fragments()]
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]


def expected_rows(dataset: lance.LanceDataset, filter: str | None) -> dict[int, int]:
    """Rows of each fragment (manifest order) the predict split reads: its live rows matching ``filter``."""
    fragments = dataset.get_fragments()
    if filter is None:
        return {fragment.fragment_id: fragment.count_rows() for fragment in fragments}
    addresses = dataset.to_table(columns=[], filter=filter, with_row_address=True).column("_rowaddr")
    ids, _ = split_addresses(addresses.to_numpy().astype(np.uint64).astype(np.int64))
    found, counts = np.unique(ids, return_counts=True)
    matched = dict(zip(found.tolist(), counts.tolist(), strict=True))
    return {fragment.fragment_id: matched.get(fragment.fragment_id, 0) for fragment in fragments}


def committed_version(location: str, storage_options: Any, after: int, run: str) -> int | None:
    """The version of the dataset at ``location`` that a commit of ``run`` made after version
    ``after`` (the read version; 0 for a table of its own), if there is one."""
    try:
        dataset = lance.dataset(location, storage_options=storage_options)
    except ValueError:  # a table not written yet
        return None
    for version in range(after + 1, dataset.version + 1):
        try:
            transaction = dataset.read_transaction(version)
        except Exception:  # noqa: BLE001 - a cleaned-up version has no transaction to read
            continue
        if transaction is not None and (transaction.transaction_properties or {}).get(RUN_PROPERTY) == run:
            return version
    return None


def commit(
    source: PinnedSource,
    folder: RunFolder,
    fragments: list[int],
    run: str,
    columns: list[str],
    overwrite: bool = False,
    attempts: int = 5,
) -> tuple[int, bool]:
    """Commit every fragment's record as one version (module docstring); returns it, and whether this
    call made it (false: a twin run of the same run id had committed it). Rows another writer
    appended since the read version are kept, with nulls in new columns (their old values in
    overwritten ones)."""
    found = [folder.record(fragment) for fragment in fragments]
    missing = [fragment for fragment, record in zip(fragments, found, strict=True) if record is None]
    if missing:
        raise RuntimeError(f"prediction run {run}: fragments {missing} have no record at commit time")
    records = [record for record in found if record is not None]
    mine = [record_metadata(record) for record in records]
    for attempt in range(attempts):
        twin = committed_version(source.location, source.storage_options, source.version, run)
        if twin is not None:
            return twin, False
        latest = lance.dataset(source.location, storage_options=source.storage_options)
        appended = _appended_fragments(source, latest)
        if overwrite:
            operation = _replacement(latest, mine, columns)
        else:
            operation = lance.LanceOperation.Merge(mine + appended, record_schema(records[0]))
        transaction = lance.Transaction(latest.version, operation, transaction_properties={RUN_PROPERTY: run})
        try:
            made = lance.LanceDataset.commit(
                source.location, transaction, storage_options=source.storage_options, max_retries=0
            )
            return made.version, True
        except Exception as error:  # noqa: BLE001 - Lance's conflict errors have no public type
            if attempt == attempts - 1 or "conflict" not in str(error).lower():
                raise
    raise AssertionError("unreachable")


def _replacement(latest: lance.LanceDataset, fragments: list[Any], columns: list[str]) -> Any:
    """A ``DataReplacement`` giving ``columns`` the data of each fragment's new file (its last)."""
    ids = [_field(latest, name).id() for name in columns]
    groups = []
    for fragment in fragments:
        new = fragment.files[-1]
        data_file = DataFile(
            new.path, ids, list(range(len(ids))), new.file_major_version, new.file_minor_version, new.file_size_bytes
        )
        groups.append(lance.LanceOperation.DataReplacementGroup(fragment.id, data_file))
    return lance.LanceOperation.DataReplacement(groups)


def _field(latest: lance.LanceDataset, name: str) -> LanceField:
    """The Lance field of column ``name``, which the latest version has (only appends came since the
    version the run read, which has it: `_appended_fragments`)."""
    field = latest.lance_schema.field(name)
    if field is None:
        raise RuntimeError(f"version {latest.version} of {latest.uri} has no column {name!r} to overwrite")
    return field


def _appended_fragments(source: PinnedSource, latest: lance.LanceDataset) -> list[Any]:
    """The fragments other writers appended since the read version (a `ConfigError` for any other
    change: a compaction, delete, update or schema change moves or rewrites the rows predicted)."""
    for version in range(source.version + 1, latest.version + 1):
        transaction = latest.read_transaction(version)
        operation = "an unrecorded change" if transaction is None else type(transaction.operation).__name__
        if operation == "BaseOperation":  # what pylance 14 shows for a compaction's Rewrite
            operation = "a compaction, or another rewrite"
        if operation != "Append":
            raise ConfigError(
                "predict read version",
                source.version,
                f"version {version} of the dataset ({operation}) changed rows this run predicted from version "
                f"{source.version}; only appends can be combined with the new column(s)",
                "do not compact, delete or update the dataset while predicting; delete the run folder and rerun to "
                "predict on the new version",
            )
    pinned = {fragment.fragment_id for fragment in source.open().get_fragments()}
    return [fragment.metadata for fragment in latest.get_fragments() if fragment.fragment_id not in pinned]


def check_table(table: str, storage_options: Any, overwrite: bool) -> None:
    """`ConfigError` when the separate ``table`` exists and ``overwrite`` is not set."""
    try:
        lance.dataset(table, storage_options=storage_options)
    except ValueError:
        return
    if not overwrite:
        raise ConfigError(
            "LancePredictionWriter.table",
            table,
            "a dataset already exists there",
            "name a new table, or set overwrite: true to replace it",
        )


def write_table(
    folder: RunFolder, fragments: list[int], table: str, storage_options: Any, run: str, overwrite: bool
) -> int:
    """Write every fragment's pieces to the separate ``table`` as one version (``row_id``: the
    rows' Lance row id, stable when the dataset has stable row ids; ``row_address``: the row's
    address in the read version; then the outputs); returns the version."""

    stored = folder.read_pieces_schema(fragments)
    names = [name for name in stored.names if name not in (OFFSET, ROW_IDS, BAD)]
    schema = pa.schema(
        [pa.field("row_id", pa.uint64()), pa.field("row_address", pa.uint64())] + [stored.field(n) for n in names]
    )

    def batches() -> Any:
        for fragment in fragments:
            pieces, _ = good_rows(folder.read_pieces(fragment))
            if pieces is None or pieces.num_rows == 0:
                continue
            address = ((np.int64(fragment) << 32) | pieces.column(OFFSET).to_numpy()).astype(np.uint64)
            keys = {"row_id": pieces.column(ROW_IDS).cast(pa.uint64()), "row_address": address}
            yield from pa.table({**keys, **{name: pieces.column(name) for name in names}}, schema=schema).to_batches()

    written = lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        table,
        schema=schema,
        mode="overwrite" if overwrite else "create",
        storage_options=storage_options,
        transaction_properties={RUN_PROPERTY: run},
    )
    return written.version


def table_written(table: str, storage_options: Any, version: int) -> tuple[int, int]:
    """(rows, bytes of data files) of the separate table at ``version``."""
    dataset = lance.dataset(table, version=version, storage_options=storage_options)
    files = [data_file for fragment in dataset.get_fragments() for data_file in fragment.metadata.files]
    return dataset.count_rows(), sum(data_file.file_size_bytes or 0 for data_file in files)


def written(folder: RunFolder, fragments: list[int]) -> tuple[int, int]:
    """(rows predicted, bytes of new column files) over the fragments' records."""
    records = [folder.record(fragment) or {} for fragment in fragments]
    return sum(r.get("rows", 0) for r in records), sum(r.get("bytes", 0) for r in records)


def bad_rows(folder: RunFolder, fragments: list[int]) -> int:
    """Bad rows the bad-row policy replaced (null outputs) over the fragments' pieces or records."""
    total = 0
    for fragment in fragments:
        record = folder.record(fragment)
        total += record.get("bad", 0) if record is not None else good_rows(folder.read_pieces(fragment))[1]
    return total


def check_new_columns(schema: Any, columns: list[str], overwrite: bool) -> None:
    """`ConfigError` for an output column the dataset already has, unless ``overwrite`` (then every
    output column must exist: the commit replaces their data, `replace_columns`)."""
    clash = sorted(set(columns) & set(schema.names))
    if clash and not overwrite:
        raise ConfigError(
            "LancePredictionWriter.columns",
            clash,
            "the dataset already has that column",
            "write to a new column name (LancePredictionWriter(columns=...)), or set overwrite: true",
        )
    if clash and len(clash) < len(columns):
        raise ConfigError(
            "LancePredictionWriter.columns",
            columns,
            f"overwrite replaces existing columns, and only {clash} exist",
            "write the new columns in a run of their own (without overwrite)",
        )


def check_replaced_types(schema: Any, types: dict[str, Any]) -> None:
    """`ConfigError` unless each overwritten column keeps its type (Lance replaces data, not types)."""
    for name, kind in types.items():
        if schema.field(name).type != kind:
            raise ConfigError(
                f"predict_step output[{name!r}]",
                str(kind),
                f"overwrite keeps a column's type, and '{name}' is {schema.field(name).type}",
                f"return {schema.field(name).type}, or drop the column first (dataset.drop_columns([{name!r}]))",
            )


def hold_tag(source: PinnedSource, run: str, version: int | None = None) -> str:
    """The Lance tag holding the run's read version (``version``, else the source's; ``lance-lightning
    holds`` lists it)."""
    return f"lance-lightning-predict-{run}-v{source.version if version is None else version}"


def release_hint(source: PinnedSource, tag: str) -> str:
    """The command that removes ``tag``, as it runs from here (`lance_lightning.launch.tool_command`)."""
    return tool_command(["holds", source.uri, "--release", tag])


def hold(source: PinnedSource, run: str) -> None:
    """Tag the read version so no cleanup deletes it while the run (and its reruns) last."""
    tags = lance.dataset(source.location, storage_options=source.storage_options).tags
    try:
        if hold_tag(source, run) not in tags.list():
            tags.create(hold_tag(source, run), source.version)
    except Exception as error:  # noqa: BLE001 - a store that refuses tags must not stop predicting
        warnings.warn(
            f"could not hold version {source.version} of {source.uri} with a Lance tag ({error}); a cleanup "
            "of old versions while predicting could delete the files this run reads",
            stacklevel=2,
        )


def release(source: PinnedSource, run: str) -> None:
    tags = lance.dataset(source.location, storage_options=source.storage_options).tags
    try:
        if hold_tag(source, run) in tags.list():
            tags.delete(hold_tag(source, run))
    except Exception as error:  # noqa: BLE001 - the commit is made; a tag left behind is only said
        warnings.warn(
            f"could not remove the Lance tag {hold_tag(source, run)} ({error}); remove it with "
            f"`{release_hint(source, hold_tag(source, run))}`",
            stacklevel=2,
        )
