"""The closing report of a prepare: what was written, how fast, and which files were left out and why.

Guarantees: a `PrepareReport` states the output's rows, the rows, input bytes and seconds of this
run (rows/s from them), the bytes of the output's data files, the units adopted from an
interrupted run, and every skipped file with its reason (the first `SHOWN_SKIPS` in the text, all
of them in ``skipped`` up to the completion record's limit). ``status`` is ``prepared``,
``resumed`` or ``complete`` (nothing was written: the output already was complete).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lance

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
        resumed = f", resumed after {self.units_adopted} of {self.units} units" if self.units_adopted else ""
        return (
            f"prepare: {self.output} {self.status} from {self.format} {self.input}: {self.rows:,} rows "
            f"in {self.units} units{resumed}, {self.seconds:.1f} s, {self.skipped_count} files skipped"
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


def output_bytes(dataset: lance.LanceDataset) -> int:
    """Bytes of the dataset's data files (as their fragments record them)."""
    return sum(
        data_file.file_size_bytes or 0 for fragment in dataset.get_fragments() for data_file in fragment.metadata.files
    )


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"
