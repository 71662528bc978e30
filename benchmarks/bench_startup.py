"""Start-up time of the ``lance-lightning`` commands against ``python -c "import lance"``.

Usage::

    uv run python benchmarks/bench_startup.py            # 7 repetitions
    uv run python benchmarks/bench_startup.py --quick    # 3 repetitions

Each repetition runs the baseline and every command once, back to back in a fresh interpreter
(the console script of this environment, as a user types it), and records the wall time. The
figure per command is the median over repetitions of its time divided by the baseline's time in
the same repetition. Target: <= 1.5 for ``--help``, ``materialize`` (a 2,000-row local copy) and
``profile --help``; ``fit --help`` is shown for comparison (it builds LightningCLI's parser).
Writes ``benchmarks/results/startup.md``.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lance

BENCH = Path(__file__).resolve().parent  # benchmarks/: the shared harness `common`
for path in (BENCH, BENCH.parent):  # ... and the repository root (lance_lightning, tests)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
from common import RESULTS_DIR, write_result  # noqa: E402

from tests.helpers import write_dataset  # noqa: E402

TARGET = 1.5


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{command} exited {result.returncode}: {result.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 7
    script = str(Path(sys.executable).with_name("lance-lightning"))
    work = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    try:
        uri = write_dataset(work / "source.lance", 2000)
        commands = {
            "lance-lightning --help": [script, "--help"],
            "lance-lightning materialize (2,000 rows)": [
                script,
                "materialize",
                "--uri",
                uri,
                "--out-dir",
                str(work / "views"),
                "--quiet",
            ],
            "lance-lightning profile --help": [script, "profile", "--help"],
            "lance-lightning fit --help": [script, "fit", "--help"],
        }
        uv = shutil.which("uv")
        if uv:  # the per-call cost of `uv run` itself, now and with the project's former setting
            root = str(Path(__file__).resolve().parent.parent)
            commands["uv run python -c pass"] = [uv, "run", "--project", root, "python", "-c", "pass"]
            commands["uv run --compile-bytecode python -c pass (former [tool.uv] setting)"] = [
                uv,
                "run",
                "--project",
                root,
                "--compile-bytecode",
                "python",
                "-c",
                "pass",
            ]
        baseline = [sys.executable, "-c", "import lance"]
        _timed(baseline)  # warm the page cache and bytecode before measuring
        times: dict[str, list[float]] = {name: [] for name in ["python -c 'import lance'", *commands]}
        ratios: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(reps):
            base = _timed(baseline)
            times["python -c 'import lance'"].append(base)
            for name, command in commands.items():
                shutil.rmtree(work / "views", ignore_errors=True)  # every materialize copies
                seconds = _timed(command)
                times[name].append(seconds)
                ratios[name].append(seconds / base)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    for name, values in times.items():
        ratio = statistics.median(ratios[name]) if name in ratios else 1.0
        measured = name in ratios and "fit" not in name and not name.startswith("uv")
        verdict = ("pass" if ratio <= TARGET else "MISS") if measured else ""
        rows.append(f"| {name} | {statistics.median(values):.2f} | {ratio:.2f} | {verdict} |")
    text = f"""# Start-up time of the command line

{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}. Command: `uv run python benchmarks/bench_startup.py{" --quick" if args.quick else ""}` ({reps} repetitions).

Machine: {platform.machine()}, {__import__("os").cpu_count()} CPU(s), Python {platform.python_version()}, pylance {lance.__version__}. Each repetition runs the baseline and each command once, back to back, in fresh interpreters; the ratio is the median of the per-repetition ratios command / baseline. Target: <= {TARGET} for `--help`, `materialize` and `profile --help`.

| command | median wall time (s) | ratio to `import lance` | target |
|---|---:|---:|---|
{chr(10).join(rows)}

`profile --help` lists the profiler's own options and says that the data module's are those of
`fit --help`: listing them from `LanceDataModule`'s signature would import Lightning
(`LanceDataModule` subclasses `LightningDataModule`), nearly all of `fit --help`'s time.

`uv run` rows: with `compile-bytecode = true` in `[tool.uv]` (the project's former setting) every
`uv run` re-checked the bytecode of all ~14,000 files of the environment before starting Python. CI
now compiles once, in `uv sync --locked --compile-bytecode` (.ci/run), so workers and DDP ranks still
start from compiled files.

Raw seconds per repetition:

{chr(10).join(f"- {name}: {', '.join(f'{v:.2f}' for v in values)}" for name, values in times.items())}
"""
    RESULTS_DIR.mkdir(exist_ok=True)
    write_result(RESULTS_DIR / "startup.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
