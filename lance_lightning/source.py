"""Lance sources: what to read, pinned to one dataset version.

Guarantees:
- `LanceSource` is a plain dataclass, so LightningCLI YAML gives it as a mapping. Its optional
  ``prepare`` (`Prepare`, checked when built) says how its dataset is made from raw files when it
  does not exist yet; `LanceDataModule.prepare_data` runs it (`lance_lightning.write`).
- `pin_source` opens the dataset once in the calling (main) process, pins the version (the latest
  at setup unless one is given) and validates URI, version, columns and filter (the filter's scan
  is planned, no data read). Every failure is a `ConfigError` naming the parameter, the value and
  the fix. A dataset written by a ``prepare`` that did not finish (its last commit a unit's, its
  completion record missing: an interrupted prepare to an object store, or a local ``OUT.partial``)
  is refused, naming the URI and both fixes (rerun the prepare, or ``allow_incomplete: true``).
- A `PinnedSource` is small and picklable. Each process opens it lazily, at most once, and always
  at the pinned version, so new versions written during training never change what a run reads.
  A dataset deleted and written again at the same path (its versions restart at 1) is a new
  source: cached handles of the old one are never reused.
- A pinned source's identity (what checkpointed cursors hold) names its data: a dataset deleted
  and written again at the same path, with the same version number and row count, has another.
- Storage options never appear in logs or checkpoints; `repr` shows them with
  every credential redacted (`lance_lightning.redaction`), and options holding the redaction
  placeholder (a saved config reused as is) are refused at `pin_source`.
- A URI's userinfo (``s3://user:password@bucket/...``) is redacted wherever it is shown: a
  `PinnedSource` has the redacted ``uri`` (used in messages, logs, plans, cursors and view
  manifests) and opens its ``location``, the URI as given.
- Training reads of an object store (``open(reads=True)``) use a handle whose Lance client does not
  retry with backoff itself (`READ_CLIENT_OPTIONS`, unless the storage options set those keys): a
  request that keeps failing reaches `lance_lightning.read.retry.RetryPolicy`, which retries,
  counts and bounds it. Planning keeps Lance's own retries. Training reads of local files use a
  handle that reads byte ranges up to `LOCAL_READ_BLOCK_BYTES` apart as one request (unless the
  storage options set ``block_size``): a filter's scattered rows cost a few large reads, not one
  request each.
- `blob_columns` names a schema's blob columns: blob v2 (the ``lance.blob.v2`` extension type of
  format 2.2, what ``lance.blob.blob_field`` makes) and blob v1 (``large_binary`` with
  ``lance-encoding:blob=true`` metadata). A pinned source lists them; readers fetch their bytes
  with `lance_lightning.read.blobs.with_blobs`.
- A source that cannot be opened gets a fix for its cause: a file that is not a Lance dataset, a
  missing bucket, a missing dataset, refused credentials, a local permission error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import lance
import pyarrow as pa

from lance_lightning.catalog import check_catalog, locate, shown_namespace
from lance_lightning.checks import check_choice, check_int, check_not_redacted
from lance_lightning.errors import ConfigError
from lance_lightning.open_errors import filter_error, open_error
from lance_lightning.redaction import (
    redact_config,
    redact_options,
    redact_text,
    redact_userinfo,
    secret_values,
)
from lance_lightning.version_ref import resolve_version
from lance_lightning.vocabulary import PREPARE_FORMATS

#: Dataset config key a prepare sets in its last commit: its completion record (`lance_lightning.write`).
PREPARE_DONE_KEY = "lance_lightning.prepare"
#: Transaction property of each of a prepare's unit commits: the plan's fingerprint.
PREPARE_PLAN_KEY = "lance_lightning.prepare.plan"


@dataclass
class Prepare:
    """How a source's dataset is made from raw files when it does not exist yet (or a prepare of
    it was interrupted): `LanceDataModule.prepare_data` runs it (`lance_lightning.write`).

    Args:
        format: One of `PREPARE_FORMATS` (docs/getting-data-in.md describes each).
        input: The raw files: a folder (or a file, for ``parquet`` and ``webdataset``), local or a
            URI of any store ``pyarrow.fs`` opens (``s3://bucket/raw``, read with the source's
            ``storage_options``; `lance_lightning.write.input_fs`).
        workers: Threads (or processes) reading and writing units in parallel; default ``min(4, cpus)``.
        pool: ``"threads"`` (the default: file reads and Lance's writer release the GIL),
            ``"processes"`` (spawned; for inputs whose checks are CPU-bound Python, e.g. many images)
            or ``"ray"`` (Ray tasks, on other machines of a Ray cluster for an object-store output;
            needs the ``ray`` extra).
        on_bad_file: ``"skip"`` lists an unreadable or corrupt file in the report and goes on;
            ``"error"`` stops, naming it.
        unit_files: At most this many input files per work unit (one commit, one fragment).
        unit_bytes: At most this many input bytes per work unit (a larger file is a unit alone).
        probe_media: ``videofolder``/``audiofolder``: open each file with FFmpeg (PyAV), add its
            stream facts as columns and skip a file that is not media (the default); False stores
            the bytes unopened, without those columns.
        index: Columns to build scalar indexes on (BITMAP or BTREE, by cardinality), in the same
            completion: a complete dataset always has them (`lance_lightning.write.indexes`).
    """

    format: str
    input: str
    workers: int | None = None
    pool: str = "threads"
    on_bad_file: str = "skip"
    unit_files: int = 2048
    unit_bytes: int = 256 << 20
    probe_media: bool = True
    index: list[str] | None = None

    def __post_init__(self) -> None:
        if self.index is not None:
            if isinstance(self.index, str) or not all(isinstance(c, str) and c for c in self.index):
                raise ConfigError("prepare.index", self.index, "is not a list of column names", "index: [label, split]")
            self.index = list(dict.fromkeys(self.index)) or None
        check_choice(
            "prepare.format",
            self.format,
            PREPARE_FORMATS,
            "is not a format prepare reads",
            f"use one of {', '.join(PREPARE_FORMATS)}",
        )
        check_choice(
            "prepare.pool", self.pool, ("threads", "processes", "ray"), "is not a pool", "threads, processes or ray"
        )
        check_choice("prepare.on_bad_file", self.on_bad_file, ("skip", "error"), "is not a choice", "skip or error")
        check_int("prepare.workers", self.workers, 1, "set workers to 1 or more, or null", optional=True)
        check_int("prepare.unit_files", self.unit_files, 1, "set unit_files to 1 or more")
        check_int("prepare.unit_bytes", self.unit_bytes, 1, "set unit_bytes to 1 or more")
        check_choice(
            "prepare.probe_media", self.probe_media, (True, False), "must be true or false", "probe_media: true"
        )


@dataclass
class LanceSource:
    """Where one split's rows come from.

    Args:
        uri: Local path or object-store URI (``s3://bucket/ds.lance``) of a Lance dataset.
        columns: Columns to read; ``None`` reads every column.
        filter: SQL predicate pushed down to Lance, e.g. ``"split = 'train'"``.
        version: Dataset version to read: a number or a Lance tag name (``"release-1"``); ``None``
            pins the latest version at setup. The number it names is pinned (`lance_lightning.version_ref`).
        storage_options: Object-store options passed to Lance (endpoint, region, credentials).
        prepare: Make the dataset at ``uri`` from raw files first, when it does not exist yet
            (`Prepare`; run by ``prepare_data``, once per node).
        asof: Instead of ``version``: an ISO 8601 time; the latest version written at or before it.
        allow_incomplete: Read a dataset whose ``prepare`` was interrupted (its units committed so
            far, without the completion record). By default such a dataset is refused at setup:
            rerun the prepare to finish it.
        namespace: Instead of ``uri``: a Lance namespace (catalog), ``{impl: dir, properties: {root:
            ...}}`` as ``lance_namespace.connect`` takes it; with ``table_id`` (`lance_lightning.catalog`).
        table_id: The table's id in ``namespace``, e.g. ``["images"]``.
    """

    uri: str = ""
    columns: list[str] | None = None
    filter: str | None = None
    version: int | str | None = None
    storage_options: dict[str, str] | None = None
    prepare: Prepare | None = None
    asof: str | None = None
    allow_incomplete: bool = False
    namespace: dict[str, Any] | None = None
    table_id: list[str] | None = None

    def __post_init__(self) -> None:
        check_catalog(self.uri, self.namespace, self.table_id, "LanceSource", self.prepare is not None)

    def located(self, param: str) -> LanceSource:
        """This source, a catalog table replaced by its URI and storage options (`lance_lightning.catalog`)."""
        if self.namespace is None and self.table_id is None:
            return self
        uri, options = locate(
            self.uri, self.storage_options, self.namespace, self.table_id, param, prepares=self.prepare is not None
        )
        return replace(self, uri=uri, storage_options=options, namespace=None, table_id=None)

    def __repr__(self) -> str:
        return (
            f"LanceSource(uri={redact_config(self.uri)!r}, columns={self.columns!r}, filter={self.filter!r}, "
            f"version={self.version!r}, storage_options={redact_options(self.storage_options)!r}"
            + (f", prepare={self.prepare!r}" if self.prepare is not None else "")
            + (f", asof={self.asof!r}" if self.asof is not None else "")
            + (", allow_incomplete=True" if self.allow_incomplete else "")
            + (f", namespace={shown_namespace(self.namespace)!r}" if self.namespace is not None else "")
            + (f", table_id={self.table_id!r})" if self.table_id is not None else ")")
        )


@dataclass(frozen=True)
class PinnedSource:
    """A validated source at a fixed dataset version: ``uri`` is shown (its userinfo redacted),
    ``location`` is opened (the URI as given; ``uri`` when not given)."""

    uri: str
    version: int
    columns: tuple[str, ...]
    filter: str | None
    total_rows: int
    storage_options: dict[str, str] | None = field(default=None, repr=False, compare=False)
    #: The pinned version's first data file (names are unique per write): tells a dataset written
    #: again at the same path, whose version numbers restart, from the one pinned.
    data_tag: str = field(default="", repr=False)
    #: The columns stored as Lance blobs (read with ``read_blobs``), from the pinned schema.
    blob_columns: tuple[str, ...] = ()
    #: The URI Lance opens, as given (``uri`` shows it with its userinfo redacted).
    location: str = field(default="", repr=False, compare=False)
    #: For a local copy of a remote source's matching rows (`lance_lightning.materialize.cache`):
    #: the source it stands for, whose identity it keeps (the same rows in the same order).
    stands_for: PinnedSource | None = field(default=None, repr=False)
    #: How the config named the version, when not by its number (``"tag release-1"``): shown only.
    pinned_by: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.location:
            object.__setattr__(self, "location", self.uri)

    def open(self, *, reads: bool = False) -> lance.LanceDataset:
        """Return this process's handle on the pinned version (opened once per process).

        Args:
            reads: The handle for training reads: on an object store its client leaves retries
                to `RetryPolicy` (`READ_CLIENT_OPTIONS`).
        """
        key, options = self._handle(reads)
        dataset = _OPEN_DATASETS.get(key)
        if dataset is None:
            dataset = lance.dataset(
                self.location, version=self.version, storage_options=options, session=dataset_session(self.location)
            )
            _OPEN_DATASETS[key] = dataset
        return dataset

    def opened(self, *, reads: bool = False) -> lance.LanceDataset | None:
        """This process's handle if `open` already made it, else None (opens nothing)."""
        return _OPEN_DATASETS.get(self._handle(reads)[0])

    def fragment(self, fragment_id: int) -> lance.LanceFragment:
        """Fragment ``fragment_id`` of the pinned version (callers list the ids from that version)."""
        fragment = self.open().get_fragment(fragment_id)
        if fragment is None:
            raise RuntimeError(f"{self.uri} {self.version_shown} has no fragment {fragment_id}")
        return fragment

    def _handle(self, reads: bool) -> tuple[tuple, dict[str, str] | None]:
        options = _read_options(self.location, self.storage_options) if reads else self.storage_options
        return (os.getpid(), _where(self.location), self.version, self.data_tag, _options_key(options)), options

    @property
    def version_shown(self) -> str:
        """``version 3``, or ``version 3 (tag release-1)`` when the config named it so."""
        return f"version {self.version}" + (f" ({self.pinned_by})" if self.pinned_by else "")

    def identity(self) -> dict[str, Any]:
        """Plain, credential-free description used in checkpointed cursors: ``data`` (the pinned
        version's first data file) tells apart two datasets written at the same path. A local
        copy has the identity of the source it stands for."""
        if self.stands_for is not None:
            return self.stands_for.identity()
        return {
            "uri": self.uri,
            "version": self.version,
            "data": self.data_tag,
            "columns": list(self.columns),
            "filter": self.filter,
        }


_OPEN_DATASETS: dict[tuple, lance.LanceDataset] = {}
_SESSIONS: dict[tuple[int, str], lance.Session] = {}


def _where(location: str) -> str:
    """``location`` as a key: a relative path names another dataset after a chdir, so local paths
    are keyed by their absolute path."""
    return location if "://" in location else os.path.abspath(location)


def dataset_session(location: str) -> lance.Session:
    """This process's one Lance session for the dataset at ``location``: every handle on it (the
    planning one, the reading one, another version's) shares its caches of manifests, file footers
    and indices, so on an object store each is downloaded once per process, not once per handle."""
    key = (os.getpid(), _where(location))
    session = _SESSIONS.get(key)
    if session is None:
        session = _SESSIONS[key] = lance.Session()
    return session


#: Lance client options of the handle for training reads on object stores: no retries with backoff
#: of its own (the object-store client's, the AIMD throttle's, the body download's), so a request
#: that still fails after Lance's three immediate re-sends reaches `RetryPolicy`, which backs off,
#: counts it (``data/retries``, ``data/throttles``, ``data/retry_wait_s``) and bounds the total by
#: its ``deadline_s``. A key the user sets in ``storage_options`` wins.
READ_CLIENT_OPTIONS = {"client_max_retries": "0", "lance_aimd_max_retries": "0", "download_retry_count": "0"}
#: URI schemes served by Lance's object-store client (local files have no client to configure).
_LOCAL_SCHEMES = ("file", "file+uring", "memory")


#: Prefixes of the environment variables object-store clients read (credentials, endpoints, regions).
STORE_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "OBJECT_STORE_")


class StoreEnvironment(dict):
    """This process's object-store variables, for a worker process to adopt (`adopt`): a worker
    forked from a forkserver started before they were set would not have them. Its repr names no
    value (they hold credentials)."""

    @classmethod
    def capture(cls) -> StoreEnvironment:
        return cls({k: v for k, v in os.environ.items() if k.startswith(STORE_ENV_PREFIXES)})

    def adopt(self) -> None:
        """Make this process's object-store variables exactly these."""
        for name in [k for k in os.environ if k.startswith(STORE_ENV_PREFIXES) and k not in self]:
            del os.environ[name]
        os.environ.update(self)

    def __repr__(self) -> str:
        return f"StoreEnvironment({sorted(self)})"


#: Lance's ``block_size`` on the handle for training reads of local files: byte ranges closer than
#: this are read as one request. Lance's local default (4 KiB) reads each row of a 10% filter of
#: 524-byte rows (5 KB apart) as its own request, and a request costs more than reading the bytes
#: between two rows: an epoch of ``label < 10`` over 400,000 rows took 15,590 requests (63 MB) in
#: ``lance.torch``'s loader and 22 (206 MB) in ours; a 1% filter 3,727 requests (4 MB) against
#: 1,120 (79 MB) (benchmarks/results/filter_scan.md). Contiguous reads are unchanged. The
#: ``block_size`` the storage options give wins.
LOCAL_READ_BLOCK_BYTES = 64 << 10
#: URI schemes of local files (``block_size`` applies to them; ``memory`` has no requests to merge).
_FILE_SCHEMES = ("file", "file+uring")


def _read_options(location: str, options: dict[str, str] | None) -> dict[str, str] | None:
    scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
    if scheme in _FILE_SCHEMES:
        given = {key.lower() for key in options or {}}
        return {**({} if "block_size" in given else {"block_size": str(LOCAL_READ_BLOCK_BYTES)}), **(options or {})}
    if scheme in _LOCAL_SCHEMES:
        return options
    given = {key.lower() for key in options or {}}
    return {**{k: v for k, v in READ_CLIENT_OPTIONS.items() if k not in given}, **(options or {})}


def _options_key(options: dict[str, str] | None) -> tuple:
    return tuple(sorted((options or {}).items()))


def pin_source(source: LanceSource, param: str) -> PinnedSource:
    """Open, pin and validate ``source``; ``param`` names it in errors (e.g. ``"train"``)."""
    source = source.located(param)
    if not isinstance(source.uri, str) or not source.uri:
        raise ConfigError(f"{param}.uri", source.uri, "a source needs a dataset URI", "give a local path or s3:// URI")
    check_not_redacted(f"{param}.storage_options", source.storage_options)
    dataset = _open_latest(source, param)
    pinned_by = ""
    if source.version is not None or source.asof is not None:
        number, pinned_by = resolve_version(dataset, source.version, source.asof, param, source.uri)
        dataset = dataset.checkout_version(number)
    _check_complete(dataset, source, param)
    schema_names = dataset.schema.names
    columns = tuple(source.columns) if source.columns is not None else tuple(schema_names)
    missing = [c for c in columns if c not in schema_names]
    if missing:
        raise ConfigError(
            f"{param}.columns",
            list(columns),
            f"column(s) {missing} are not in the dataset at {source.uri}",
            f"use only existing columns: {schema_names}",
        )
    if not columns:
        raise ConfigError(f"{param}.columns", [], "no columns selected", "list at least one column, or omit `columns`")
    if source.filter is not None:
        _validate_filter(dataset, source.filter, param)
    return PinnedSource(
        uri=redact_userinfo(source.uri),
        version=dataset.version,
        columns=columns,
        filter=source.filter,
        total_rows=dataset.count_rows(),
        storage_options=source.storage_options,
        data_tag=_data_tag(dataset),
        blob_columns=blob_columns(dataset.schema, columns),
        location=source.uri,
        pinned_by=pinned_by,
    )


def _check_complete(dataset: lance.LanceDataset, source: LanceSource, param: str) -> None:
    """Refuse a version written by a prepare that did not finish: its last commit is a unit's (it
    holds the plan's fingerprint) and the completion record is missing; unless ``allow_incomplete``."""
    check_choice(
        f"{param}.allow_incomplete", source.allow_incomplete, (False, True), "is not a boolean", "true or false"
    )
    if source.allow_incomplete or PREPARE_DONE_KEY in dataset.config():
        return
    try:
        transaction = dataset.read_transaction(dataset.version)
    except (ValueError, OSError):  # no transaction file (an old dataset): nothing says it is a prepare's
        return
    if PREPARE_PLAN_KEY not in ((transaction.transaction_properties or {}) if transaction is not None else {}):
        return
    raise ConfigError(
        f"{param}.uri",
        source.uri,
        f"was written by a prepare that did not finish (version {dataset.version} holds only the "
        f"{dataset.count_rows():,} rows committed so far; the completion record, dataset config key "
        f"`{PREPARE_DONE_KEY}`, is missing)",
        "rerun the same prepare (`lance-lightning prepare` with the same --format, --input and --output, "
        "or the source's `prepare` spec) to finish it, or set `allow_incomplete: true` on the source "
        "to read the rows committed so far",
    )


def _data_tag(dataset: lance.LanceDataset) -> str:
    """The path of the first data file of ``dataset`` ("" when it has none)."""
    for fragment in dataset.get_fragments():
        for data_file in fragment.metadata.files:
            return str(data_file.path)  # a plain str: checkpoints load with weights_only=True
    return ""


def _open_latest(source: LanceSource, param: str) -> lance.LanceDataset:
    try:
        return lance.dataset(source.uri, storage_options=source.storage_options, session=dataset_session(source.uri))
    except (ValueError, OSError) as error:
        shown = redact_text(str(error), secret_values({"storage_options": source.storage_options}))
        raise open_error(source.uri, param, shown) from None


def _validate_filter(dataset: lance.LanceDataset, filter: str, param: str) -> None:
    """Plan the filter's scan (no data read): a syntax error, an unknown column or a type mismatch
    is a `ConfigError` here; what only evaluation meets (a failing cast) is raised as the same error
    by the survey that evaluates the filter, in the same process, before training."""
    try:
        dataset.scanner(columns=[], filter=filter).explain_plan()
    except (ValueError, OSError) as error:
        raise filter_error(f"{param}.filter", filter, error, dataset.schema.names) from None


BLOB_V2 = "lance.blob.v2"
_BLOB_META = b"lance-encoding:blob"


def is_blob(field: pa.Field) -> bool:
    """Whether ``field`` is a Lance blob column (v1 or v2)."""
    if isinstance(field.type, pa.ExtensionType) and field.type.extension_name == BLOB_V2:
        return True
    return pa.types.is_large_binary(field.type) and (field.metadata or {}).get(_BLOB_META) == b"true"


def blob_columns(schema: pa.Schema, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The blob columns among ``columns`` of ``schema``."""
    return tuple(name for name in columns if is_blob(schema.field(name)))
