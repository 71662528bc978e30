"""The harness's planning study stays runnable: its quick run (``python -m benchmarks run planning
--quick``) starts its processes together, prints every mode and its ratios, computes the survey once
with the cache on, and leaves planning.md alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "planning.md"


pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.slow
@pytest.mark.timeout(600)  # 9 fresh interpreters importing Lightning, on 2 loaded cores
def test_quick_run_prints_every_mode_and_leaves_the_results_file_alone(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "planning", "--quick", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    number = r"[0-9.]+"
    for mode, computed in (("off", 2), ("on", 1)):  # --quick: 2 processes
        name = re.escape(mode)
        assert re.search(rf"^\| {name} \| 1 \| 1 \| {number} \| {number} \| {number} \| {number} \|$", out, re.M), mode
        assert re.search(rf"^\| {name} \| 2 \| {computed} \| {number} \|", out, re.M), mode
        assert re.search(rf"^\| {name} \| {number} \| {number} \| {number} \| (PASS|FAIL|\(before\)) \|$", out, re.M)
    assert "- on, 2 process(es), repetition 1:" in out
    assert out.count("/loaded") == 1 and out.count("/computed") == 2  # one of each pair loaded, with the cache on
    assert RESULTS.read_bytes() == before
    assert (tmp_path / "runs" / "planning.md").read_text().startswith("# Planning once per node")
