"""Lance sources: what to read, pinned to one dataset version.

Guarantees:
- `LanceSource` is a plain dataclass, so LightningCLI YAML gives it as a mapping.
- `pin_source` opens the dataset once in the calling (main) process, pins the version (the latest
  at setup unless one is given) and validates URI, version, columns and filter. Every failure is a
  `ConfigError` naming the parameter, the value and the fix.
- A `PinnedSource` is small and picklable. Each process opens it lazily, at most once, and always
  at the pinned version, so new versions written during training never change what a run reads.
- Storage options (credentials) never appear in `repr`, logs, plan fingerprints or checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import lance

from lance_lightning.blobs import blob_columns
from lance_lightning.errors import ConfigError


@dataclass
class LanceSource:
    """Where one split's rows come from.

    Args:
        uri: Local path or object-store URI (``s3://bucket/ds.lance``) of a Lance dataset.
        columns: Columns to read; ``None`` reads every column.
        filter: SQL predicate pushed down to Lance, e.g. ``"split = 'train'"``.
        version: Dataset version to read; ``None`` pins the latest version at setup.
        storage_options: Object-store options passed to Lance (endpoint, region, credentials).
    """

    uri: str
    columns: list[str] | None = None
    filter: str | None = None
    version: int | None = None
    storage_options: dict[str, str] | None = None


@dataclass(frozen=True)
class PinnedSource:
    """A validated source at a fixed dataset version."""

    uri: str
    version: int
    columns: tuple[str, ...]
    filter: str | None
    total_rows: int
    storage_options: dict[str, str] | None = field(default=None, repr=False, compare=False)
    #: The columns stored as Lance blobs (read with ``read_blobs``), from the pinned schema.
    blob_columns: tuple[str, ...] = ()

    def open(self) -> lance.LanceDataset:
        """Return this process's handle on the pinned version (opened once per process)."""
        # A relative path names another dataset after a chdir: key local paths by their absolute path.
        where = self.uri if "://" in self.uri else os.path.abspath(self.uri)
        key = (os.getpid(), where, self.version, _options_key(self.storage_options))
        dataset = _OPEN_DATASETS.get(key)
        if dataset is None:
            dataset = lance.dataset(self.uri, version=self.version, storage_options=self.storage_options)
            _OPEN_DATASETS[key] = dataset
        return dataset

    def identity(self) -> dict[str, Any]:
        """Plain, credential-free description used in plan fingerprints and cursors."""
        return {"uri": self.uri, "version": self.version, "columns": list(self.columns), "filter": self.filter}


_OPEN_DATASETS: dict[tuple, lance.LanceDataset] = {}


def _options_key(options: dict[str, str] | None) -> tuple:
    return tuple(sorted((options or {}).items()))


def pin_source(source: LanceSource, param: str) -> PinnedSource:
    """Open, pin and validate ``source``; ``param`` names it in errors (e.g. ``"train"``)."""
    if not isinstance(source.uri, str) or not source.uri:
        raise ConfigError(f"{param}.uri", source.uri, "a source needs a dataset URI", "give a local path or s3:// URI")
    dataset = _open_latest(source, param)
    if source.version is not None:
        dataset = _checkout(dataset, source, param)
    schema_names = dataset.schema.names
    columns = tuple(source.columns) if source.columns is not None else tuple(schema_names)
    missing = [c for c in columns if c not in schema_names]
    if missing:
        raise ConfigError(
            f"{param}.columns", list(columns), f"column(s) {missing} are not in the dataset at {source.uri}",
            f"use only existing columns: {schema_names}",
        )
    if not columns:
        raise ConfigError(f"{param}.columns", [], "no columns selected", "list at least one column, or omit `columns`")
    if source.filter is not None:
        _validate_filter(dataset, source, param)
    return PinnedSource(
        uri=source.uri,
        version=dataset.version,
        columns=columns,
        filter=source.filter,
        total_rows=dataset.count_rows(),
        storage_options=source.storage_options,
        blob_columns=blob_columns(dataset.schema, columns),
    )


def _open_latest(source: LanceSource, param: str) -> lance.LanceDataset:
    try:
        return lance.dataset(source.uri, storage_options=source.storage_options)
    except (ValueError, OSError) as error:
        text = str(error)
        if "not found" in text.lower() or "no such file" in text.lower():
            raise ConfigError(
                f"{param}.uri", source.uri, "no Lance dataset exists there",
                "check the path (relative paths resolve from the working directory "
                f"{os.getcwd()}) or write the dataset first",
            ) from None
        raise ConfigError(
            f"{param}.uri", source.uri, f"the dataset could not be opened ({_first_line(text)})",
            f"check `{param}.storage_options` (endpoint, region, credentials) and that the store is reachable",
        ) from None


def _checkout(dataset: lance.LanceDataset, source: LanceSource, param: str) -> lance.LanceDataset:
    available = [v["version"] for v in dataset.versions()]
    if source.version not in available:
        shown = available if len(available) <= 20 else available[:5] + ["..."] + available[-5:]
        raise ConfigError(
            f"{param}.version", source.version, f"that version does not exist (or was cleaned up) at {source.uri}",
            f"pick an existing version {shown}, or omit `version` to pin the latest",
        )
    return dataset.checkout_version(source.version)


def _validate_filter(dataset: lance.LanceDataset, source: LanceSource, param: str) -> None:
    try:
        dataset.scanner(columns=[], filter=source.filter, limit=1).to_table()
    except (ValueError, OSError) as error:
        raise ConfigError(
            f"{param}.filter", source.filter, f"Lance cannot run this filter ({_first_line(str(error))})",
            f"write a SQL predicate over the columns {dataset.schema.names}, e.g. \"label = 3\"",
        ) from None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].split(", /")[0] if text.strip() else text
