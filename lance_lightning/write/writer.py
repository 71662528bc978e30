"""The resumable, atomic writer: work units in, one complete Lance dataset out, whatever stops it.

Where things are, for an output ``OUT``:

- Local ``OUT``: rows are written to ``OUT.partial`` (a Lance dataset) and, once complete, the
  folder is renamed to ``OUT`` in one ``rename``; ``OUT.lock`` serialises prepares of ``OUT``.
- Object store ``OUT``: rows are written in place; the completion record (below) tells a complete
  dataset from an interrupted one.

Guarantees:
- Every unit is one Lance commit, in unit order (units are written in parallel, on threads,
  spawned processes or Ray tasks (`lance_lightning.write.pools`), and committed in order by the
  calling thread): the first an ``Overwrite`` that creates the dataset, the others an ``Append``
  (a unit whose files were all skipped commits no fragment). Every unit's fragment files are
  written in Lance's append mode, so each lists the field ids of the dataset's schema (blob
  columns included), whichever unit, pool or rerun wrote it; before each commit the fragments are
  checked against the dataset (its schema, its files' field ids) and a mismatch is refused
  (`IntegrityError`, nothing committed) rather than committed as columns that read another
  column's data. Each commit's transaction properties hold the plan's fingerprint, the unit's
  index, its files' hash and its skipped files: the record of committed units is the dataset's own
  history, written in the same atomic commit as the unit's rows (`lance_lightning.write.ledger`).
- Complete only when the last commit, an ``UpdateConfig``, sets the ``lance_lightning.prepare``
  config key (fingerprint, rows, skipped files, the indexes built). The scalar indexes a prepare
  asks for (`lance_lightning.write.indexes`) are committed just before it: a complete dataset has
  them. A SIGKILL at any moment leaves either no dataset,
  a dataset without that key (for a local output, only under ``OUT.partial``) or a complete one.
  Data files written by a unit whose commit never happened are not referenced by any version;
  they are deleted when the dataset completes (``cleanup_old_versions``).
- A rerun of the same prepare (same fingerprint) continues after the last committed unit, once it
  has checked that the files of the committed units are unchanged (each commit records their
  hash, `lance_lightning.write.units.unit_files`; a modified file is a `ConfigError`); since
  units, ids and commit order do not depend on timing or workers, the result equals an
  uninterrupted run's, row for row and in order. On a complete output it writes nothing.
- A partial output whose data files are numbered two ways (left by a version before issue #50
  was fixed) is refused with a `ConfigError` saying to delete it.
- An output that exists and is not this prepare's (another schema, another input, not a Lance
  dataset, not made by prepare) is refused with a `ConfigError` before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import lance
import pyarrow as pa
from lance import LanceOperation, Transaction
from lance.fragment import write_fragments

from lance_lightning.errors import ConfigError
from lance_lightning.write.indexes import build_indexes
from lance_lightning.write.ledger import (
    DONE_KEY,
    FILES_KEY,
    PLAN_KEY,
    SKIPPED_KEY,
    UNIT_KEY,
    IntegrityError,
    Progress,
    Written,
    check_numbering,
    completion_record,
    data_file_fields,
    is_local,
    open_output,
    refusal,
    same_schema,
    unit_commits,
)
from lance_lightning.write.pools import unit_executor
from lance_lightning.write.units import Skipped, Survey, Unit, check_unchanged, unit_files

#: Rows per fragment file at most: a unit normally fits one fragment.
MAX_ROWS_PER_FILE = 1 << 20
#: Reads one unit's rows: (survey, unit, skipped list to append to, on_bad_file) -> record batches.
UnitReader = Callable[[Survey, Unit, list[Skipped], str], Any]


class DatasetWriter:
    """Writes a survey's units to ``output`` (see the module docstring)."""

    def __init__(self, output: str, survey: Survey, fingerprint: str, storage_options: dict[str, str] | None) -> None:
        self.output = output
        self.survey = survey
        self.fingerprint = fingerprint
        self.storage_options = storage_options
        self.staging = f"{output.rstrip('/')}.partial" if is_local(output) else output

    # -- what is there ------------------------------------------------------------------------
    def progress(self, units: list[Unit] | None = None) -> Progress:
        """What the output holds; `ConfigError` if it is not this prepare's, or if the files of a
        unit it committed changed since (another modification time: `check_unchanged`)."""
        done = open_output(self.output, "output", self.storage_options)
        if done is not None:
            record = completion_record(done)
            if record.get("fingerprint") == self.fingerprint:
                return Progress(self.output, complete=True, record=record)
            if is_local(self.output) or record or unit_commits(done, self.fingerprint) is None:
                raise refusal(done, record, self.output, self.survey.schema)
        partial = open_output(self.staging, "output", self.storage_options) if self.staging != self.output else done
        if partial is None:
            return Progress(self.staging)
        if not same_schema(partial.schema, self.survey.schema):
            raise refusal(partial, {}, self.staging, self.survey.schema)
        try:
            data_file_fields(partial)
        except IntegrityError as error:
            problem = str(error).removeprefix(f"{partial.uri} ")
            raise ConfigError("output", self.staging, problem, "delete it and prepare again") from None
        record = completion_record(partial)
        if record.get("fingerprint") == self.fingerprint:
            return Progress(self.staging, complete=True, record=record)
        committed = unit_commits(partial, self.fingerprint)
        if committed is None:
            raise ConfigError(
                "output",
                self.staging,
                "holds an interrupted prepare of other input or options (its fingerprint differs)",
                f"rerun that prepare to finish it, or delete {self.staging} to start over",
            )
        recorded = [props.get(FILES_KEY) for props in committed]
        check_unchanged(recorded, units or [], self.survey.source.shown, self.staging)
        skipped = [Skipped(*pair) for props in committed for pair in json.loads(props.get(SKIPPED_KEY, "[]"))]
        return Progress(self.staging, committed=len(committed), rows=partial.count_rows(), skipped=skipped)

    # -- writing ------------------------------------------------------------------------------
    def write(
        self,
        units: list[Unit],
        read: UnitReader,
        progress: Progress,
        *,
        workers: int,
        pool: str,
        on_bad_file: str,
        on_rows: Callable[[int], None],
    ) -> list[Skipped]:
        """Write ``units[progress.committed:]`` on ``workers`` threads or spawned processes, or as
        Ray tasks (``2 * workers`` units in flight), and commit them in order; return the files
        this run skipped. ``on_rows`` counts rows as they are read (threads) or as their unit
        commits (processes, Ray)."""
        todo = iter(units[progress.committed :])
        skipped: list[Skipped] = []
        threads = pool == "threads"
        with unit_executor(pool, workers, local=is_local(self.staging)) as executor:
            pending: deque[tuple[Unit, Future]] = deque()

            def submit() -> None:
                unit = next(todo, None)
                if unit is not None:
                    task = executor.submit(self.write_unit, unit, read, on_bad_file, on_rows if threads else None)
                    pending.append((unit, task))

            for _ in range(2 * workers):
                submit()
            try:
                while pending:
                    unit, future = pending.popleft()
                    written, unit_skipped = future.result()
                    self.commit(unit, written, unit_skipped)
                    skipped += unit_skipped
                    if not threads:
                        on_rows(unit.rows)
                    submit()
            except BaseException:
                for _, future in pending:
                    future.cancel()
                raise
        return skipped

    def write_unit(
        self, unit: Unit, read: UnitReader, on_bad_file: str, on_rows: Callable[[int], None] | None
    ) -> tuple[Written, list[Skipped]]:
        """Write one unit's rows as fragment files (not yet part of any version), in Lance's append
        mode (create mode before unit 0's commit, the same write): numbered by the staging
        dataset's schema when it exists, else as the dataset that unit 0 creates would number them
        (an ``Overwrite`` holding that schema; `commit` checks it is the dataset's). Never Lance's
        overwrite mode on an existing dataset: that numbers the fields anew
        and stores blob columns another way, so every column after a blob would be read from
        another column's data (issue #50)."""
        # Lance's create mode where no staging dataset exists yet: what its append mode does there
        # (the same ``Overwrite``, numbered alike), without the "No existing dataset ... it will be
        # created" warning it prints into the progress bar. A dataset committed meanwhile (unit 0)
        # makes create fail before a file is written: the unit is then read again in append mode.
        modes = ("append",) if self._staged() else ("create", "append")
        for mode in modes:
            try:
                return self._write_unit(unit, read, on_bad_file, on_rows, mode)
            except _AlreadyCreated as again:
                if on_rows is not None:
                    on_rows(-again.rows)  # those rows are counted again by the append
        raise AssertionError("unreachable: append mode never raises _AlreadyCreated")

    def _staged(self) -> bool:
        """Whether the staging dataset has a version (unit 0 committed)."""
        if is_local(self.staging):
            return (Path(self.staging) / "_versions").is_dir()
        try:
            lance.dataset(self.staging, storage_options=self.storage_options)
        except (ValueError, OSError):
            return False
        return True

    def _write_unit(
        self, unit: Unit, read: UnitReader, on_bad_file: str, on_rows: Callable[[int], None] | None, mode: str
    ) -> tuple[Written, list[Skipped]]:
        skipped: list[Skipped] = []
        failed: list[Exception] = []
        rows = [0]

        def batches() -> Any:
            try:
                for batch in read(self.survey, unit, skipped, on_bad_file):
                    rows[0] += batch.num_rows
                    if on_rows is not None:
                        on_rows(batch.num_rows)
                    yield batch
            except Exception as error:
                failed.append(error)
                raise

        reader = pa.RecordBatchReader.from_batches(self.survey.schema, batches())
        try:
            transaction = write_fragments(
                reader,
                self.staging,
                schema=self.survey.schema,
                return_transaction=True,
                mode=mode,
                max_rows_per_file=MAX_ROWS_PER_FILE,
                storage_options=self.storage_options,
            )
        except Exception as error:
            if failed:  # Lance wraps what the reader raised (a `ConfigError` naming a file): raise that
                raise failed[0] from None
            if mode == "create" and "already exists" in str(error):
                raise _AlreadyCreated(rows[0]) from None
            raise
        # Lance's documented result: an ``Overwrite`` in create mode, an ``Append`` in append mode.
        return cast(Written, transaction.operation), skipped

    def commit(self, unit: Unit, written: Written, skipped: list[Skipped]) -> None:
        """Commit one unit: its rows and its record, in one transaction; first check its fragments
        are numbered as the dataset (`IntegrityError` otherwise: nothing is committed)."""
        properties = {
            PLAN_KEY: self.fingerprint,
            UNIT_KEY: str(unit.index),
            SKIPPED_KEY: json.dumps([[s.path, s.reason] for s in skipped]),
            FILES_KEY: unit_files(unit),
        }
        operation: Written
        if unit.index == 0:
            if not isinstance(written, LanceOperation.Overwrite):
                raise IntegrityError(f"unit 0 was written into an existing dataset at {self.staging}")
            operation, version = written, 0
        else:
            dataset = self._latest()
            check_numbering(dataset, written, unit)
            operation, version = LanceOperation.Append(written.fragments), dataset.version
        lance.LanceDataset.commit(
            self.staging,
            Transaction(version, operation, transaction_properties=properties),
            storage_options=self.storage_options,
        )

    def finish(self, record: dict[str, Any], index: list[str] | None = None) -> lance.LanceDataset:
        """Build the ``index`` columns' scalar indexes, mark the staged dataset complete, drop
        unreferenced files and old versions, and (local output) move it in place; safe to repeat
        after a SIGKILL at any step (indexes are built before the record: a complete dataset has them)."""
        dataset = self._latest()
        if completion_record(dataset).get("fingerprint") != self.fingerprint:
            record = {**record, "indexes": build_indexes(dataset, index)} if index else record
            dataset = self._latest()
            dataset.update_config({DONE_KEY: json.dumps(record)})
            dataset = self._latest()
        dataset.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
        if self.staging != self.output:
            os.replace(self.staging, self.output)
        return lance.dataset(self.output, storage_options=self.storage_options)

    def _latest(self) -> lance.LanceDataset:
        return lance.dataset(self.staging, storage_options=self.storage_options)

    def discard_empty_staging(self) -> None:
        """Remove a local staging folder that holds no version yet (a run killed before its first commit)."""
        staging = Path(self.staging)
        if is_local(self.staging) and staging.is_dir() and not (staging / "_versions").exists():
            shutil.rmtree(staging)


class _AlreadyCreated(Exception):
    """A create-mode write found the staging dataset created meanwhile (after reading ``rows``)."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows
