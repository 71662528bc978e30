"""The resumable, atomic writer: work units in, one complete Lance dataset out, whatever stops it.

Where things are, for an output ``OUT``:

- Local ``OUT``: rows are written to ``OUT.partial`` (a Lance dataset) and, once complete, the
  folder is renamed to ``OUT`` in one ``rename``; ``OUT.lock`` serialises prepares of ``OUT``.
- Object store ``OUT``: rows are written in place; the completion record (below) tells a complete
  dataset from an interrupted one.

Guarantees:
- Every unit is one Lance commit, in unit order (units are written in parallel, on threads,
  spawned processes or Ray tasks, and committed in order by the calling thread): the first an
  ``Overwrite`` that creates the dataset, the others an ``Append`` (a unit whose files were all
  skipped commits no fragment). Every unit's fragment files are written in Lance's append mode, so
  each lists the field ids of the dataset's schema (blob columns included), whichever unit, pool
  or rerun wrote it; before each commit the fragments are checked against the dataset (its schema,
  its files' field ids) and a mismatch is refused (`IntegrityError`, nothing committed) rather
  than committed as columns that read another column's data. A spawned worker exits when the
  prepare that started it dies (SIGKILL): none is left running. Each commit's transaction
  properties hold the plan's fingerprint, the unit's index, its files' hash and its skipped files:
  the record of committed units is the dataset's own history, written in the same atomic commit
  as the unit's rows.
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
import multiprocessing
import os
import shutil
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import lance
import pyarrow as pa
from lance import LanceOperation, Transaction
from lance.fragment import write_fragments

from lance_lightning.errors import ConfigError
from lance_lightning.source import PREPARE_DONE_KEY, PREPARE_PLAN_KEY
from lance_lightning.write.indexes import build_indexes
from lance_lightning.write.units import Skipped, Survey, Unit, check_unchanged, unit_files

#: Dataset config key of a complete prepare (JSON: fingerprint, format, input, rows, skipped); a
#: reader refuses a prepared dataset without it (`lance_lightning.source.pin_source`).
DONE_KEY = PREPARE_DONE_KEY
#: Transaction properties of a unit's commit.
PLAN_KEY, UNIT_KEY, SKIPPED_KEY = PREPARE_PLAN_KEY, "lance_lightning.prepare.unit", "lance_lightning.prepare.skipped"
#: Transaction property of a unit's commit: its files' hash (`lance_lightning.write.units.unit_files`).
FILES_KEY = "lance_lightning.prepare.files"
#: Skipped files kept in the completion record (the report counts them all).
RECORDED_SKIPS = 1000
#: Rows per fragment file at most: a unit normally fits one fragment.
MAX_ROWS_PER_FILE = 1 << 20

#: A unit's written fragments: an ``Overwrite`` when written before the staging dataset existed
#: (holding the schema Lance numbered them by), else an ``Append``.
Written = LanceOperation.Overwrite | LanceOperation.Append
#: Reads one unit's rows: (survey, unit, skipped list to append to, on_bad_file) -> record batches.
UnitReader = Callable[[Survey, Unit, list[Skipped], str], Any]


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
        done = self._open(self.output, "output")
        if done is not None:
            record = _record(done)
            if record.get("fingerprint") == self.fingerprint:
                return Progress(self.output, complete=True, record=record)
            if is_local(self.output) or record or _unit_commits(done, self.fingerprint) is None:
                raise self._refusal(done, record, self.output)
        partial = self._open(self.staging, "output") if self.staging != self.output else done
        if partial is None:
            return Progress(self.staging)
        if not _same_schema(partial.schema, self.survey.schema):
            raise self._refusal(partial, {}, self.staging)
        try:
            data_file_fields(partial)
        except IntegrityError as error:
            problem = str(error).removeprefix(f"{partial.uri} ")
            raise ConfigError("output", self.staging, problem, "delete it and prepare again") from None
        record = _record(partial)
        if record.get("fingerprint") == self.fingerprint:
            return Progress(self.staging, complete=True, record=record)
        committed = _unit_commits(partial, self.fingerprint)
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

    def _open(self, uri: str, param: str) -> lance.LanceDataset | None:
        if is_local(uri) and not Path(uri).exists():
            return None
        try:
            return lance.dataset(uri, storage_options=self.storage_options)
        except (ValueError, OSError) as error:
            if not is_local(uri) and "not found" in str(error).lower():
                return None
            raise ConfigError(
                param, uri, f"exists and is not a Lance dataset ({str(error)[:200]})", "choose another --output"
            ) from None

    def _refusal(self, dataset: lance.LanceDataset, record: dict[str, Any], uri: str) -> ConfigError:
        """Why the dataset at ``uri`` (the output or its staging location) is not this prepare's."""
        if not _same_schema(dataset.schema, self.survey.schema):
            problem = (
                f"exists with another schema (columns {dataset.schema.names}; this prepare writes "
                f"{self.survey.schema.names})"
            )
        elif record:
            problem = f"was prepared from other input or options ({record.get('format')} {record.get('input')})"
        else:
            problem = "exists and was not written by lance-lightning prepare"
        return ConfigError("output", uri, problem, "choose another --output, or delete it to prepare it again")

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
        if threads:
            executor: Executor = ThreadPoolExecutor(workers, thread_name_prefix="lance-prepare")
        elif pool == "ray":  # Ray tasks: imported only here
            executor = _RayExecutor(local=is_local(self.staging))
        else:  # Lance is not fork-safe: spawned processes only
            executor = ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        with executor:
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
            _check_numbering(dataset, written, unit)
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
        if _record(dataset).get("fingerprint") != self.fingerprint:
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


def _init_worker(parent: int) -> None:
    """A spawned worker ignores Ctrl-C (the calling process stops the prepare) and exits once
    ``parent`` is gone (a SIGKILLed prepare), whose call queue would block it forever. ``parent``
    comes from the parent: one whose prepare died while it started has another parent already."""
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="lance-prepare-parent-watch", daemon=True).start()


class _RayExecutor(Executor):
    """Runs `DatasetWriter.write_unit` calls as Ray tasks (one CPU each) of the Ray instance the
    caller started or joined (``ray.init``; else Ray starts a local one). Arguments and results
    travel pickled, as to spawned processes: each task writes its unit's fragment files and returns
    the ``Overwrite`` operation listing them; the driver commits it. Tasks writing a local output
    are pinned to this machine (node); with an object-store output they run on any node."""

    def __init__(self, *, local: bool) -> None:
        try:
            import ray
        except ImportError as error:
            raise ConfigError(
                "prepare.pool",
                "ray",
                f"needs Ray, which the `ray` extra installs ({type(error).__name__}: {error})",
                "uv sync --extra ray (or pip install 'lance-lightning[ray]'), or use pool threads or processes",
            ) from None
        self._ray = ray
        options: dict[str, Any] = {"num_cpus": 1}
        if local:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if not ray.is_initialized():
                ray.init()
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        self._task = ray.remote(_call).options(**options)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return _RayFuture(self._ray, self._task.remote(fn, *args, **kwargs))


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class _RayFuture(Future):
    """A Ray task's result as the write loop reads it: ``result()`` raises the task's own exception
    (a `ConfigError` naming a bad file), ``cancel()`` cancels the task."""

    def __init__(self, ray: Any, ref: Any) -> None:
        super().__init__()
        self._ray, self._ref = ray, ref

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._ray.get(self._ref, timeout=timeout)
        except self._ray.exceptions.RayTaskError as error:
            cause = error.cause
            raise (cause if isinstance(cause, Exception) else error) from None

    def cancel(self) -> bool:
        self._ray.cancel(self._ref)
        return True


class _AlreadyCreated(Exception):
    """A create-mode write found the staging dataset created meanwhile (after reading ``rows``)."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class IntegrityError(RuntimeError):
    """A unit's fragment files are not numbered as the dataset they were to join: nothing of the
    unit was committed (the output stays resumable); a defect of lance-lightning, to report."""


def _check_numbering(dataset: lance.LanceDataset, written: Written, unit: Unit) -> None:
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


def _record(dataset: lance.LanceDataset) -> dict[str, Any]:
    """The completion record of a dataset, ``{}`` if it has none."""
    text = dataset.config().get(DONE_KEY)
    return json.loads(text) if text else {}


def _unit_commits(dataset: lance.LanceDataset, fingerprint: str) -> list[dict[str, str]] | None:
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


def _same_schema(existing: pa.Schema, planned: pa.Schema) -> bool:
    """Same column names and types; a planned blob column matches Lance's blob type for it."""
    if existing.names != planned.names:
        return False
    for have, want in zip(existing, planned):
        blob = (want.metadata or {}).get(b"lance-encoding:blob") == b"true"
        if not blob and have.type != want.type:
            return False
    return True
