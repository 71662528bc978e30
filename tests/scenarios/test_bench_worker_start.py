"""The worker-start suite of the harness stays runnable: ``python -m benchmarks run worker-start
--quick`` measures ``iter(loader)`` to the first batch (and a second loader's) at 0 and 2 workers,
each in a fresh process, and states the target's verdict, leaving results/worker_start.md alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "worker_start.md"

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.timeout(300)
def test_quick_run_states_the_first_batch_of_each_cell_and_the_verdict(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    out = tmp_path / "worker_start.md"
    args = ["run", "worker-start", "--quick", "--reps", "1", "--cache-dir", str(tmp_path), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=280, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    for workers in (0, 2):
        cell = re.escape(f"scan/ours/4k/{workers}/local")
        assert re.search(rf"^\| `{cell}` \|[^|]+\|[^|]+\|  \|  \| [0-9.]+ \| [0-9.]+ \|", text, re.M), cell
    assert re.search(r"^- `scan/ours/4k/2/local`: first batch -?[0-9.]+ s later .* \*\*(pass|FAIL)\*\*$", text, re.M)
    assert RESULTS.read_bytes() == before
