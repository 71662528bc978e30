"""The harness's scale suite stays runnable: ``python -m benchmarks run scale --quick`` measures ours
(storage order and a row shuffle, with and without the 10% filter) and the hand-written take
baseline on a tiny one-column table, each cell in a fresh process: setup, first batch, rows/s,
resumes at 10% and 90% of the epoch, memory over unfiltered NoShuffle, and each target's verdict,
leaving results/scale.md alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "scale.md"

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.timeout(400)
def test_quick_run_measures_every_cell_and_states_the_targets(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    out = tmp_path / "scale.md"
    args = ["run", "scale", "--quick", "--seconds", "0.3", "--resume", "3", "--cache-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    number = r"[0-9][0-9,]*\.?[0-9]*"
    for workload in ("x-scan", "x-shuffle", "x-scan-f10"):
        cell = re.escape(f"{workload}/ours/20k/0/local")
        resumes = rf"\| {number} \| {number} \| {number} \| -?{number} \|$"
        assert re.search(rf"^\| `{cell}` \|[^|]+\|[^|]+\| {number} \|.* \| ok[^|]* {resumes}", text, re.M), workload
    take = re.escape("x-shuffle/lance-take/20k/0/local")
    assert re.search(rf"^\| `{take}` \|[^|]+\|[^|]+\| {number} \|", text, re.M)
    for target in ("setup + first batch", "RowShuffle memory over NoShuffle", "resume 90% / 10%", "with the filter"):
        assert re.search(
            rf"^- 20k rows, [^:]*{re.escape(target)}.*: -?{number} \(<= [0-9.]+\): \*\*(PASS|FAIL)\*\*$", text, re.M
        )
    assert RESULTS.read_bytes() == before
