"""Studies of the harness that no other test runs stay runnable: each at tiny sizes through
``python -m benchmarks run NAME --quick --set ...``, writing its table where ``--out`` says and
leaving results/ alone. The materialize study's S3 side reads the store every epoch (the remote
cache off): before, a row shuffle from S3 was copied by the default remote cache and the run
stopped on its own check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`

CASES = {
    # study: (its --set values, a line its table must hold)
    "materialize": (
        ("rows=5000", "epochs=2"),
        r"^\| RowShuffle\(clump_rows=64\) \(take\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|",
    ),
    "resume": (("rows=20000", "batch_size=1024"), r"^\| ShardShuffle\(.*\) \| 90% \| \d+–\d+ \| [0-9,]+ \| \d+ \|"),
    "memory": (("rows=600", "epochs=2", "workers=0", "batch_size=64"), r"^\| 0 \| [0-9.]+ \| ≤ 1.05 \| (PASS|FAIL) \|"),
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_study_runs_at_tiny_sizes(name: str, tmp_path: Path) -> None:
    sets, row = CASES[name]
    before = {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()}
    out = tmp_path / f"{name}.md"
    args = ["run", name, "--quick", *(x for s in sets for x in ("--set", s))]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--cache-dir", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert f"Command: `uv run python -m benchmarks run {name} --quick" in text and "QUICK smoke run" in text
    assert re.search(row, text, re.M), text[-2000:]
    assert {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()} == before
