"""The harness's peer cells stay runnable: ours (waiting for its workers, as the peers suite runs it)
and pylance's ``lance.torch`` in the peers' own environment, on a tiny table, each in a fresh
process: rows/s, the ratio to the best peer, shuffle quality and the first epoch's check. It skips,
saying why, when the peers' environment cannot be made here (``uv`` missing, or the package
registry out of reach). LitData, LanceDB and MosaicML convert or open their data for minutes on a
loaded machine: they run in ``python -m benchmarks run peers --quick``, not here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


def peers_python() -> Path:
    """The peers' interpreter, made by the harness's own `ensure_peers` (skips when it cannot be)."""
    from benchmarks.harness import runner

    if shutil.which("uv") is None and not runner.PEER_PYTHON.exists():
        pytest.skip("the peers' environment needs `uv`, which is not on PATH")
    try:
        runner.ensure_peers(runner.PEER_PYTHON)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the peers' environment could not be made offline here (uv pip install failed: {exc})")
    return runner.PEER_PYTHON


@pytest.mark.timeout(600)
def test_ours_and_lance_torch_cells_compare_on_the_same_rows(tmp_path: Path) -> None:
    python = peers_python()
    out = tmp_path / "peers.md"
    args = ["run", "scan/ours-waited,lance.torch/3k/0", "--seconds", "0.3", "--peer-python", str(python)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--cache-dir", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    for workload, quality in (("scan", r"0\.[0-9]+"),):
        ours = re.escape(f"{workload}/ours-waited/3k/0/local")
        peer = re.escape(f"{workload}/lance.torch/3k/0/local")
        row = rf"\| [0-9,]+ \| [0-9.]+ \| [0-9.]+ \|  \| [0-9.]+ \| {quality} \|"  # no second loader
        assert re.search(rf"^\| `{ours}` \|[^|]+\|[^|]+{row}.* \| ok[^|]* \|$", text, re.M), workload
        assert re.search(rf"^\| `{peer}` \|[^|]+\|[^|]+\| [0-9,]+ \| 1\.00 \(best peer\) \|", text, re.M), workload
    assert "pylance " in text and "- Every cell ran." in text
