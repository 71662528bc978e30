"""Start-up time of the ``lance-lightning`` commands against ``python -c "import lance"``.

Each repetition runs the baseline and every command once, back to back in a fresh interpreter
(the console script of this environment, as a user types it). The figure per command is the
median over repetitions of its time divided by the baseline's time in the same repetition.
Target: <= 1.5 for ``--help``, ``materialize`` (a 2,000-row local copy) and ``profile --help``;
``fit --help`` is shown for comparison (it builds LightningCLI's parser).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import tables
from benchmarks.harness.study import ROOT, Params
from tests.helpers import write_dataset

TARGET = 1.5


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{command} exited {result.returncode}: {result.stderr[-2000:]}")
    return seconds


def commands(script: str, uri: str, views: Path) -> dict[str, list[str]]:
    found = {
        "lance-lightning --help": [script, "--help"],
        "lance-lightning materialize (2,000 rows)": [
            script,
            "materialize",
            "--uri",
            uri,
            "--out-dir",
            str(views),
            "--quiet",
        ],
        "lance-lightning profile --help": [script, "profile", "--help"],
        "lance-lightning fit --help": [script, "fit", "--help"],
    }
    uv = shutil.which("uv")
    if uv:  # the per-call cost of `uv run` itself, now and with the project's former setting
        found["uv run python -c pass"] = [uv, "run", "--project", str(ROOT), "python", "-c", "pass"]
        former = "uv run --compile-bytecode python -c pass (former [tool.uv] setting)"
        found[former] = [uv, "run", "--project", str(ROOT), "--compile-bytecode", "python", "-c", "pass"]
    return found


def table(times: dict[str, list[float]], ratios: dict[str, list[float]]) -> list[str]:
    """Each command's median seconds and median ratio to the baseline (the one without ratios), with
    the verdict where the target applies."""
    rows = []
    for name, values in times.items():
        ratio = statistics.median(ratios[name]) if name in ratios else 1.0
        measured = name in ratios and "fit" not in name and not name.startswith("uv")
        verdict = ("pass" if ratio <= TARGET else "MISS") if measured else ""
        rows.append((name, statistics.median(values), ratio, verdict))
    return tables.table("command | median wall time (s) | ratio to `import lance` | target", "< >.2f >.2f <", rows)


def measure(p: Params) -> str:
    script = str(Path(sys.executable).with_name("lance-lightning"))
    work = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    base_name = "python -c 'import lance'"
    try:
        found = commands(script, write_dataset(work / "source.lance", p.rows), work / "views")
        baseline = [sys.executable, "-c", "import lance"]
        _timed(baseline)  # warm the page cache and bytecode before measuring
        times: dict[str, list[float]] = {name: [] for name in [base_name, *found]}
        ratios: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(p.reps):
            base = _timed(baseline)
            times[base_name].append(base)
            for name, command in found.items():
                shutil.rmtree(work / "views", ignore_errors=True)  # every materialize copies
                times[name].append(_timed(command))
                ratios[name].append(times[name][-1] / base)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = "\n".join(f"- {name}: {', '.join(f'{v:.2f}' for v in values)}" for name, values in times.items())
    return f"""{p.reps} repetitions. Each repetition runs the baseline and each command once, back to back, in fresh
interpreters; the ratio is the median of the per-repetition ratios command / baseline. Target: <= {TARGET}
for `--help`, `materialize` and `profile --help`.

{chr(10).join(table(times, ratios))}

`profile --help` lists the profiler's own options and says that the data module's are those of
`fit --help`: listing them from `LanceDataModule`'s signature would import Lightning
(`LanceDataModule` subclasses `LightningDataModule`), nearly all of `fit --help`'s time.

`uv run` rows: with `compile-bytecode = true` in `[tool.uv]` (the project's former setting) every
`uv run` re-checked the bytecode of all ~14,000 files of the environment before starting Python. CI
now compiles once, in `uv sync --locked --compile-bytecode` (.ci/run), so workers and DDP ranks still
start from compiled files.

Raw seconds per repetition:

{raw}
"""
