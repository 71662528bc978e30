"""benchmarks/bench_peers.py stays runnable: its quick run measures every cell (4 workloads x 0 and 2
workers x ours and the three peers) on small tables and writes its table to the file it is given,
leaving results/peers.md alone. It skips, saying why, when the peers' environment cannot be made
here (``uv`` missing, or the package registry out of reach)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_peers.py"
RESULTS = ROOT / "benchmarks" / "results" / "peers.md"

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


def peers_python() -> Path:
    """The peers' interpreter, made by the benchmark's own `ensure_peers` (skips when it cannot be)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_peers
    finally:
        sys.path.remove(str(SCRIPT.parent))
    python = bench_peers.PEERS_VENV / "bin" / "python"
    if shutil.which("uv") is None:
        pytest.skip("the peers' environment needs `uv`, which is not on PATH")
    try:
        bench_peers.ensure_peers(python)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the peers' environment could not be made offline here (uv pip install failed: {exc})")
    return python


@pytest.mark.slow
@pytest.mark.timeout(1800)  # every cell a fresh process, peers included: about 12 minutes on 2 loaded cores
def test_quick_run_measures_every_cell(tmp_path: Path) -> None:
    python = peers_python()
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    out = tmp_path / "peers.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--peer-python", str(python)]
        + ["--cache-dir", str(tmp_path / "cache"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# lance-lightning against its peers") and "Command: `" in text
    number = r"[0-9][0-9,]*"
    for workload in ("sequential scan", "row shuffle", "filter", "shuffled JPEG decode"):
        for workers in (0, 2):
            cells = rf"\| {number} \| [0-9.]+ \| [0-9.]+ \| ok[^|]* \|"
            row = rf"^\| \(\d\) {workload}[^|]* \| {workers} \| lance-lightning [^|]* {cells}"
            assert re.search(row, text, re.M), (workload, workers)
    assert text.count("**pass**") + text.count("**miss**") == 4
    assert (RESULTS.read_bytes() if RESULTS.exists() else None) == before
