"""``prepare``: raw files in, a complete Lance dataset out, in parallel, resumable, with a closing report.

Guarantees:
- The input is a local path or a URI of any store ``pyarrow.fs`` opens (``s3://`` with the same
  ``storage_options`` as the output; `lance_lightning.write.input_fs`), for every format, with the
  same order, checks, resume and exactly-once result; credentials never reach the dataset or the
  report.
- `prepare` checks everything it can before it writes: the spec (`lance_lightning.source.Prepare`),
  the input (missing, unreachable store or refused credentials, empty, mixed formats, schemas that
  differ, a column name Lance reserves, corrupt files found by a survey) and the output (another
  schema, another input, not a Lance dataset, a partial output numbered two ways). Each problem
  is a `ConfigError` naming the file or the flag. Input entries that are not regular files
  (FIFOs, sockets, devices, dangling links, link loops) or whose names are not UTF-8 are skipped
  and listed without being opened.
- It then writes the units not yet committed (`lance_lightning.write.writer`), ``workers`` threads
  (or spawned processes, or ``2 * workers`` Ray tasks with ``pool="ray"``) at a time, with a
  progress bar on stderr, and returns a `PrepareReport`: rows, bytes in and out, rows/s, files
  skipped and why. On a complete output it writes nothing and says so.
- Prepares of one local output are serialised by a lock file (``OUT.lock``): DDP ranks of one node,
  or two shells, never interleave their commits; the second finds the output complete. The lock
  file is removed by its holder once the output is complete (it stays beside an unfinished one).
- `prepare_sources` prepares every source of a data module that has a ``prepare`` spec, once per
  output URI, and returns one line per output for ``explain()`` and the logs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lance

from lance_lightning.errors import ConfigError
from lance_lightning.source import LanceSource, Prepare
from lance_lightning.write.folders import AUDIO_FOLDER, IMAGE_FOLDER, VIDEO_FOLDER
from lance_lightning.write.indexes import check_index_columns
from lance_lightning.write.input_fs import Input
from lance_lightning.write.ledger import RECORDED_SKIPS, Progress, completion_record, is_local
from lance_lightning.write.report import PrepareReport, output_bytes
from lance_lightning.write.shards import WebDataset
from lance_lightning.write.tables import HuggingFace, Parquet
from lance_lightning.write.units import Survey, fingerprint, plan_units
from lance_lightning.write.writer import DatasetWriter

#: Each format name (`lance_lightning.source.PREPARE_FORMATS`) -> its reader.
FORMATS: dict[str, Any] = {
    "imagefolder": IMAGE_FOLDER,
    "webdataset": WebDataset(),
    "parquet": Parquet(),
    "hf": HuggingFace(),
    "videofolder": VIDEO_FOLDER,
    "audiofolder": AUDIO_FOLDER,
}


def prepare(
    spec: Prepare, output: str, *, storage_options: dict[str, str] | None = None, progress: bool = True
) -> PrepareReport:
    """Make (or finish) the dataset at ``output`` from ``spec``'s raw files; see the module docstring."""
    started = time.perf_counter()
    if not output:
        raise ConfigError("output", output, "is empty", "give the URI of the dataset to write")
    reader = FORMATS[spec.format]
    if not spec.probe_media and hasattr(reader, "probe"):  # video/audio folders: bytes only
        reader = dataclasses.replace(reader, probe=False)
    survey: Survey = reader.survey(spec.input, spec.on_bad_file, storage_options)
    _check_apart(survey.source, output)
    check_index_columns(spec.index, survey.schema)
    units = plan_units(survey.items, spec.unit_files, spec.unit_bytes)
    writer = DatasetWriter(output, survey, fingerprint(spec.format, survey, units, spec.index), storage_options)
    with _Lock(output) as lock:
        writer.discard_empty_staging()
        state = writer.progress(units)
        base: dict[str, Any] = {
            "format": spec.format,
            "input": survey.source.shown,
            "output": output,
            "units": len(units),
        }
        if state.complete:
            lock.done()
            return _complete(writer, state, base)
        workers = spec.workers or min(4, os.cpu_count() or 1)
        # -- units not yet committed: written on `workers` threads, committed in order --
        bar = _bar(sum(unit.rows for unit in units), sum(unit.rows for unit in units[: state.committed]), progress)
        try:
            skipped = writer.write(
                units,
                reader.read,
                state,
                workers=workers,
                pool=spec.pool,
                on_bad_file=spec.on_bad_file,
                on_rows=bar.update,
            )
            bar.update(bar.total - bar.n)  # skipped files' rows count as done
        finally:
            bar.close()
        pairs = [(s.path, s.reason) for s in [*survey.skipped, *state.skipped, *skipped]]
        record: dict[str, Any] = {
            "fingerprint": writer.fingerprint,
            "format": spec.format,
            "input": survey.source.shown,
        }
        record |= {"skipped": [list(p) for p in pairs[:RECORDED_SKIPS]], "skipped_count": len(pairs)}
        dataset = writer.finish(record, spec.index)
        lock.done()
        return PrepareReport(
            **base,
            status="resumed" if state.committed else "prepared",
            rows=dataset.count_rows(),
            rows_written=dataset.count_rows() - state.rows,
            units_adopted=state.committed,
            bytes_in=sum(unit.size for unit in units[state.committed :]),
            bytes_out=output_bytes(dataset, storage_options),
            seconds=time.perf_counter() - started,
            workers=workers,
            pool=spec.pool,
            skipped=pairs,
            skipped_count=len(pairs),
            notes=[
                *survey.info.get("notes", []),
                *storage_notes(dataset, survey),
                *[f"index: {i}" for i in completion_record(dataset).get("indexes", [])],
            ],
        )


def storage_notes(dataset: lance.LanceDataset, survey: Survey) -> list[str]:
    """One line per binary column: how the dataset stores it (Lance's blob type as the dataset
    reports it, or inline large_binary) and why (`BLOB_BYTES`; media files are always blobs)."""
    why: dict[str, str] = survey.info.get("why", {})
    notes = []
    for planned in survey.schema:
        blob = (planned.metadata or {}).get(b"lance-encoding:blob") == b"true"
        if not (blob or planned.name in why):
            continue
        stored = str(dataset.schema.field(planned.name).type)
        how = f"as Lance blobs ({stored})" if blob else "inline (large_binary)"
        reason = why.get(planned.name, "video and audio files are read a window at a time")
        notes.append(f"column `{planned.name}` stored {how}: {reason} (benchmarks/results/blob_encoding.md)")
    return notes


def _complete(writer: DatasetWriter, state: Progress, base: dict[str, Any]) -> PrepareReport:
    """The report of an output found complete (moved in place first if a kill came before the rename)."""
    if state.staging == writer.output:
        dataset = lance.dataset(writer.output, storage_options=writer.storage_options)
    else:
        dataset = writer.finish(state.record)  # the record was written: so were its indexes
    return PrepareReport(
        **base,
        status="complete",
        rows=dataset.count_rows(),
        seconds=0.0,
        skipped=[(path, reason) for path, reason in state.record.get("skipped", [])],
        skipped_count=state.record.get("skipped_count", 0),
        bytes_out=output_bytes(dataset, writer.storage_options),
    )


def prepare_sources(sources: Iterable[Any], *, progress: bool = True) -> dict[str, str]:
    """Prepare each `LanceSource` (a mixture's too) that has a ``prepare`` spec, once per URI;
    return URI -> the report's one line."""
    done: dict[str, str] = {}
    for source in _flatten(sources):
        if source.prepare is None or source.uri in done:
            continue
        try:
            report = prepare(source.prepare, source.uri, storage_options=source.storage_options, progress=progress)
        except ConfigError as error:  # name the source's field: `uri` is the output, the rest the spec's
            param = "uri" if error.param == "output" else f"prepare.{error.param.rsplit('.', 1)[-1]}"
            raise ConfigError(param, error.value, error.problem, error.fix) from None
        if progress:
            print(report.text(), file=sys.stderr, flush=True)
        done[source.uri] = report.line()
    return done


def _flatten(sources: Iterable[Any]) -> list[LanceSource]:
    flat: list[LanceSource] = []
    for source in sources:
        if isinstance(source, LanceSource):
            flat.append(source)
        elif source is not None:
            flat += _flatten(getattr(source, "sources", ()))
    return flat


def _check_apart(source: Input, output: str) -> None:
    """Refuse an output inside the input (its files would be read as input by the next run)."""
    if source.contains(output):
        raise ConfigError(
            "output", output, f"is inside the input {source.shown}", "write the dataset outside the input folder"
        )


def _bar(total: int, initial: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="rows", desc="prepare", disable=not enabled, file=sys.stderr)


class _Lock:
    """An exclusive ``flock`` on ``OUT.lock`` for a local output (released by the OS if the process
    dies); nothing for an object store, where one prepare per output is the caller's to ensure.
    After a prepare that completed (`done`), its holder deletes the file while still holding it; a
    prepare that was waiting on the deleted file finds, once it holds it, that the path no longer
    names it and locks the path again (so two holders never hold two files of one path)."""

    def __init__(self, output: str) -> None:
        self.path = Path(f"{output.rstrip('/')}.lock") if is_local(output) else None
        self._file: Any = None
        self.complete = False

    def __enter__(self) -> _Lock:
        if self.path is not None:
            import fcntl

            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                self._file = open(self.path, "a+")  # noqa: SIM115 - closed in __exit__
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
                try:
                    if os.stat(self.path).st_ino == os.fstat(self._file.fileno()).st_ino:
                        return self
                except FileNotFoundError:
                    pass
                self._file.close()  # its holder deleted it after completing: lock the path anew
        return self

    def done(self) -> None:
        """The output is complete (and in place): the lock file goes when the lock is released."""
        self.complete = True

    def __exit__(self, *exc: Any) -> None:
        if self._file is not None:
            if self.complete and exc[0] is None and self.path is not None:
                self.path.unlink(missing_ok=True)  # while held: see the class docstring
            self._file.close()
