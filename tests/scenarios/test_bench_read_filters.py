"""The harness's filter-scan study stays runnable: on a tiny table (``python -m benchmarks run
filter-scan --quick``) it measures every cell (no index, BITMAP, BTREE x 1%, 10%, 50%) against
lance.torch's LanceDataset, prints the table and writes its section of filter_scan.md between the
markers, keeping the rest of that file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.slow
def test_peer_filters_measures_every_cell_and_writes_only_its_section(tmp_path: Path) -> None:
    results = tmp_path / "filter_scan.md"
    results.write_text("# Filter scan\n\nkept text\n")
    args = ["run", "filter-scan", "--quick", "--cache-dir", str(tmp_path), "--out", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=280, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for text in (done.stdout, results.read_text()):
        for index in ("none", "BITMAP", "BTREE"):
            for filter in ("label < 1", "label < 10", "label < 50"):
                row = rf"^\| {index} \| `{filter}` \(\d+%\) \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \| [0-9.]+ \|"
                assert re.search(row, text, re.M), (index, filter)
    written = results.read_text()
    assert written.startswith("# Filter scan\n") and "kept text" in written
    assert written.count("<!-- peer-filters:start -->") == 1 and "Command: `" in written
    assert "## Filtered reads against lance.torch" in written
