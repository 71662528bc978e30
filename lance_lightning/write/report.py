"""The closing report of a prepare: what was written, how fast, and which files were left out and why.

Guarantees: a `PrepareReport` states the output's rows, the rows, input bytes and seconds of this
run (rows/s from them), the bytes of the output's data files (blob files included), the units adopted from an
interrupted run, and every skipped file with its reason (the first `SHOWN_SKIPS` in the text, all
of them in ``skipped`` up to the completion record's limit). ``status`` is ``prepared``,
``resumed`` or ``complete`` (nothing was written: the output already was complete).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import lance
import pyarrow as pa

from lance_lightning.write.input_fs import filesystem

#: Skipped files listed in the report's text (all are counted).
SHOWN_SKIPS = 20


@dataclass
class PrepareReport:
    """One prepare's outcome (see the module docstring)."""

    format: str
    input: str
    output: str
    status: str
    rows: int
    units: int
    seconds: float
    rows_written: int = 0
    units_adopted: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    workers: int = 0
    pool: str = "threads"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    skipped_count: int = 0
    #: What the survey decided that a reader should know (a column kept as bytes, and why).
    notes: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows_written / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """One line: what happened to the output."""
        if self.status == "complete":
            return (
                f"prepare: {self.output} is already complete ({self.rows:,} rows from {self.format} "
                f"{self.input}): nothing to do"
            )
        resumed = f", resumed after {self.units_adopted} of {_count(self.units, 'unit')}" if self.units_adopted else ""
        return (
            f"prepare: {self.output} {self.status} from {self.format} {self.input}: {_count(self.rows, 'row')} "
            f"in {_count(self.units, 'unit')}{resumed}, {self.seconds:.1f} s, "
            f"{_count(self.skipped_count, 'file')} skipped"
        )

    def text(self) -> str:
        """The closing report: the line, the figures, the skipped files."""
        lines = [self.line()]
        if self.status != "complete":
            lines.append(
                f"  this run: {self.rows_written:,} rows, {_size(self.bytes_in)} in -> dataset "
                f"{_size(self.bytes_out)}, {self.rows_per_s:,.0f} rows/s on {self.workers} {self.pool}"
            )
        lines += [f"  note: {note}" for note in self.notes]
        for path, reason in self.skipped[:SHOWN_SKIPS]:
            lines.append(f"  skipped {path}: {reason}")
        if self.skipped_count > SHOWN_SKIPS:
            lines.append(f"  ... and {self.skipped_count - SHOWN_SKIPS} more skipped files")
        return "\n".join(lines)


def output_bytes(dataset: lance.LanceDataset, storage_options: dict[str, str] | None = None) -> int:
    """Bytes of the files the dataset's fragments reference: each data file (as its fragment records
    it) and the blob files Lance keeps beside it (``data/<data file>/*.blob``: blob columns' values),
    listed in an object store with the dataset's ``storage_options``."""
    total = 0
    for fragment in dataset.get_fragments():
        for data_file in fragment.metadata.files:
            total += (data_file.file_size_bytes or 0) + _blob_bytes(dataset.uri, data_file.path, storage_options)
    return total


def _blob_bytes(uri: str, data_file: str, storage_options: dict[str, str] | None) -> int:
    """Bytes of the blob files beside ``data_file`` (its folder ``data/<stem>/``), 0 if none (or if
    the store cannot be listed)."""
    folder = f"{uri.rstrip('/')}/data/{data_file.removesuffix('.lance')}"
    try:
        if "://" not in uri:
            return sum(entry.stat().st_size for entry in Path(folder).iterdir() if entry.is_file())
        from pyarrow import fs

        store, path = filesystem(folder, storage_options)
        return sum(info.size or 0 for info in store.get_file_info(fs.FileSelector(path, allow_not_found=True)))
    except (OSError, ValueError, pa.ArrowException):
        return 0


def _count(n: int, noun: str) -> str:
    """``1 unit``, ``2 units``, ``1,024 rows``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"
