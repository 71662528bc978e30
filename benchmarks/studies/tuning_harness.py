"""Tuning benchmark, the harness: every figure of the ``tuning`` study is measured here as a
`benchmarks.harness.timing.paired` ratio (or recorded as measured) and lands, formatted, in one `Figure` row of the table.

`Tuning` holds the run's figures, raw per-repetition values and notes; `Tuning.rate` pairs two
loaders (rows/s), `Tuning.duration` two calls (ms per call). `loader` builds the plugin's train
loader outside the timings; `PythonLoop` is the GIL-holding transform of item 6. The table shapes
(columns, batch size, filters, selectivities) shared by the items are the constants below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import lance
import torch

from benchmarks.harness.fit import train_loader
from benchmarks.harness.timing import Paired, paired

COLUMNS = ["id", "label", "vec"]
IMAGE_COLUMNS = ["image", "label"]
BATCH = 256
#: Batches timed for single-row takes (about 50k rows/s): a whole epoch would dominate the run.
TAKE_BATCHES = 60
FILTERS = {"1%": "label = 7", "50%": "label < 50"}
#: Selectivity -> filter on the vector table (label: 100 values, uniform; BITMAP index).
SELECTIVITIES = {
    "0.5%": "label = 0 AND id % 2 = 0",
    "1%": "label = 0",
    "2%": "label < 2",
    "5%": "label < 5",
    "10%": "label < 10",
    "20%": "label < 20",
}


@dataclass
class Figure:
    """One line of the result table (values already formatted)."""

    item: int
    scenario: str
    value: str
    baseline: str
    base_value: str
    ratio: str


class PythonLoop:
    """A GIL-holding transform: a pure-Python loop of ``iterations`` additions per row."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations

    def __call__(self, batch: dict) -> dict:
        total = 0
        for _ in range(len(batch["label"])):
            for i in range(self.iterations):
                total += i
        batch["loop_total"] = torch.tensor(total)
        return batch


def loader(uri: str, **kwargs):
    """The plugin's train loader (set up outside the timings): `benchmarks.harness.fit.train_loader`'s."""
    return train_loader(uri, **kwargs)[1]


def count(ds: lance.LanceDataset, filter: str, use_index: bool) -> int:
    """Rows matching ``filter``, with or without the scalar index."""
    return ds.scanner(columns=[], with_row_id=True, filter=filter, use_scalar_index=use_index).count_rows()


def calls(fn: Callable[[], object]) -> Callable[[], int]:
    """``fn`` counted as one unit per call (so `benchmarks.harness.timing.paired` yields calls/s)."""

    def run() -> int:
        fn()
        return 1

    return run


class Tuning:
    def __init__(self, reps: int, min_seconds: float) -> None:
        self.reps, self.min_seconds = reps, min_seconds
        self.figures: list[Figure] = []
        self.raw: list[str] = []
        self.notes: list[str] = []

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        print(
            f"  [{figure.item}] {figure.scenario}: {figure.value} | {figure.baseline}: {figure.base_value} | "
            f"ratio {figure.ratio}",
            flush=True,
        )

    def rate(self, item: int, scenario: str, candidate, baseline_name: str, baseline) -> Paired:
        """Rows/s of two loaders or reads, paired; ratio = candidate / baseline."""
        result = paired(candidate, baseline, self.reps, self.min_seconds)
        self.raw.append(f"- [{item}] {scenario} vs {baseline_name}: " + result.raw_text())
        self.add(
            Figure(
                item,
                scenario,
                f"{result.rows_per_s:,.0f} rows/s",
                baseline_name,
                f"{result.base_rows_per_s:,.0f} rows/s",
                f"{result.ratio:.2f}",
            )
        )
        return result

    def duration(self, item: int, scenario: str, candidate, baseline_name: str, baseline) -> Paired:
        """Time per call of two functions, paired; ratio = baseline time / candidate time."""
        result = paired(calls(candidate), calls(baseline), self.reps, self.min_seconds)
        self.raw.append(
            f"- [{item}] {scenario} vs {baseline_name} (ms per call): "
            + ", ".join(f"{1e3 / c:.2f} / {1e3 / b:.2f}" for c, b in result.raw)
        )
        self.add(
            Figure(
                item,
                scenario,
                f"{1e3 / result.rows_per_s:.2f} ms",
                baseline_name,
                f"{1e3 / result.base_rows_per_s:.2f} ms",
                f"{result.ratio:.2f}",
            )
        )
        return result
