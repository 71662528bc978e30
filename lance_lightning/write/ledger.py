"""What a prepare's output holds, read from the dataset itself: the units it committed, its
completion record, and whether it is this prepare's and sound.

Guarantees:
- Each unit's commit holds, in its transaction properties, the plan's fingerprint, the unit's
  index, its files' hash and its skipped files: the record of committed units is the dataset's own
  history, written in the same atomic commit as the unit's rows (`unit_commits` reads it back; the
  completion's index commits carry no unit properties and are passed over). A dataset with any
  other commit is not a partial output of this prepare.
- A complete dataset has the ``lance_lightning.prepare`` config key (`DONE_KEY`); `completion_record` reads it.
- `check_numbering` refuses (`IntegrityError`, nothing committed) fragments that are not numbered
  as the dataset they are to join (its schema, its files' field ids), rather than let them be
  committed as columns that read another column's data; `data_file_fields` refuses a dataset whose
  data files are numbered two ways (left by a version before issue #50 was fixed).
- `refusal` says why an existing output (another schema, another input, not made by prepare) is
  not this prepare's: the writer raises it as a `ConfigError` before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
from lance import LanceOperation

from lance_lightning.errors import ConfigError
from lance_lightning.source import PREPARE_DONE_KEY, PREPARE_PLAN_KEY
from lance_lightning.write.units import Skipped, Unit

#: Dataset config key of a complete prepare (JSON: fingerprint, format, input, rows, skipped); a
#: reader refuses a prepared dataset without it (`lance_lightning.source.pin_source`).
DONE_KEY = PREPARE_DONE_KEY
#: Transaction properties of a unit's commit.
PLAN_KEY, UNIT_KEY, SKIPPED_KEY = PREPARE_PLAN_KEY, "lance_lightning.prepare.unit", "lance_lightning.prepare.skipped"
#: Transaction property of a unit's commit: its files' hash (`lance_lightning.write.units.unit_files`).
FILES_KEY = "lance_lightning.prepare.files"
#: Skipped files kept in the completion record (the report counts them all).
RECORDED_SKIPS = 1000

#: A unit's written fragments: an ``Overwrite`` when written before the staging dataset existed
#: (holding the schema Lance numbered them by), else an ``Append``.
Written = LanceOperation.Overwrite | LanceOperation.Append


def is_local(uri: str) -> bool:
    return "://" not in uri


@dataclass
class Progress:
    """What the output holds for this prepare: ``complete``, the units committed so far and the
    files they skipped, and where the rows go (``staging``)."""

    staging: str
    complete: bool = False
    committed: int = 0
    rows: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def open_output(uri: str, param: str, storage_options: dict[str, str] | None) -> lance.LanceDataset | None:
    """The dataset at ``uri``, None if there is none; `ConfigError` if something else is there."""
    if is_local(uri) and not Path(uri).exists():
        return None
    try:
        return lance.dataset(uri, storage_options=storage_options)
    except (ValueError, OSError) as error:
        if not is_local(uri) and "not found" in str(error).lower():
            return None
        raise ConfigError(
            param, uri, f"exists and is not a Lance dataset ({str(error)[:200]})", "choose another --output"
        ) from None


def refusal(dataset: lance.LanceDataset, record: dict[str, Any], uri: str, schema: pa.Schema) -> ConfigError:
    """Why the dataset at ``uri`` (the output or its staging location) is not the prepare's that
    writes ``schema``."""
    if not same_schema(dataset.schema, schema):
        problem = f"exists with another schema (columns {dataset.schema.names}; this prepare writes {schema.names})"
    elif record:
        problem = f"was prepared from other input or options ({record.get('format')} {record.get('input')})"
    else:
        problem = "exists and was not written by lance-lightning prepare"
    return ConfigError("output", uri, problem, "choose another --output, or delete it to prepare it again")


def completion_record(dataset: lance.LanceDataset) -> dict[str, Any]:
    """The completion record of a dataset, ``{}`` if it has none."""
    text = dataset.config().get(DONE_KEY)
    return json.loads(text) if text else {}


def unit_commits(dataset: lance.LanceDataset, fingerprint: str) -> list[dict[str, str]] | None:
    """The transaction properties of the dataset's unit commits in unit order; None if any commit
    is of another prepare (or not of a prepare)."""
    found: dict[int, dict[str, str]] = {}
    for transaction in dataset.get_transactions(recent_transactions=dataset.version):
        if transaction is not None and type(transaction.operation).__name__ == "CreateIndex":
            continue  # the completion's indexes (`build_indexes`), built before its record
        props = (transaction.transaction_properties or {}) if transaction is not None else {}
        if props.get(PLAN_KEY) != fingerprint:
            return None
        found[int(props[UNIT_KEY])] = props
    if sorted(found) != list(range(len(found))):
        return None
    return [found[index] for index in range(len(found))]


def same_schema(existing: pa.Schema, planned: pa.Schema) -> bool:
    """Same column names and types; a planned blob column matches Lance's blob type for it."""
    if existing.names != planned.names:
        return False
    for have, want in zip(existing, planned):
        blob = (want.metadata or {}).get(b"lance-encoding:blob") == b"true"
        if not blob and have.type != want.type:
            return False
    return True


class IntegrityError(RuntimeError):
    """A unit's fragment files are not numbered as the dataset they were to join: nothing of the
    unit was committed (the output stays resumable); a defect of lance-lightning, to report."""


def check_numbering(dataset: lance.LanceDataset, written: Written, unit: Unit) -> None:
    """Refuse (`IntegrityError`) fragments whose field ids are not the dataset's: written against
    another schema than the dataset's, or whose data files list other fields than its files do."""
    if isinstance(written, LanceOperation.Overwrite) and written.new_schema != dataset.lance_schema:
        raise IntegrityError(
            f"unit {unit.index} was written with another schema than the dataset's at {dataset.uri}: "
            "not committed (rerun to retry; report this as a lance-lightning defect)"
        )
    expected = data_file_fields(dataset)
    for fragment in written.fragments:
        for data_file in fragment.files:
            if expected is not None and list(data_file.fields) != expected:
                raise IntegrityError(
                    f"unit {unit.index}'s data file lists the field ids {list(data_file.fields)}, the dataset's "
                    f"files at {dataset.uri} {expected}: not committed (rerun to retry; report this defect)"
                )


def data_file_fields(dataset: lance.LanceDataset) -> list[int] | None:
    """The field ids the data files of a prepared dataset list (every file holds every column), or
    None if it has no data file yet; `IntegrityError` if its files disagree (a corrupt dataset)."""
    seen = {tuple(f.fields) for fragment in dataset.get_fragments() for f in fragment.metadata.files}
    if len(seen) > 1:
        raise IntegrityError(f"{dataset.uri} {MISNUMBERED} {sorted(seen)}")
    return list(seen.pop()) if seen else None


#: What a dataset whose data files list different field ids is.
MISNUMBERED = (
    "holds data files numbered two ways (some columns read another column's data: written by "
    "lance-lightning before issue #50 was fixed); their field ids:"
)
