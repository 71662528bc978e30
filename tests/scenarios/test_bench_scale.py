"""benchmarks/bench_scale.py stays runnable: its quick run measures every case it is given in a fresh
process, prints the table, the verdicts and the rows/s by size, and leaves scale.md alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_scale.py"
RESULTS = ROOT / "benchmarks" / "results" / "scale.md"


pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.slow
def test_quick_run_prints_every_case_and_leaves_the_results_file_alone(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cache", str(tmp_path), "--batches", "20", "--cases", "RowShuffle"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for case in ("NoShuffle", "RowShuffle"):
        for filtered in ("—", "10%"):
            assert re.search(rf"^\| 10\^6 \| {case} \| {filtered} \| [0-9.]+ \|", out, re.M), (case, filtered)
        rate = re.search(rf"^\| {case} \| ([0-9,]+) \(1\.00\) \|$", out, re.M)
        assert rate and int(rate.group(1).replace(",", "")) > 0, case
    assert "## Targets at 10^6 rows" in out
    assert re.search(r"^\| RowShuffle memory over NoShuffle \(MB\) \| [0-9.]+ \| <= 64 \| (PASS|FAIL) \|$", out, re.M)
    assert RESULTS.read_bytes() == before
