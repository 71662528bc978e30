"""The benchmark harness (``python -m benchmarks``) in a subprocess, as a reader of the docs runs it:
`list` shows the registry and expands a selector to cell names; `run` measures cells of ours at a
tiny size, each in a fresh process, and writes the table (every cell named, with rows/s, first
batch, reads and memory) and the raw JSON to the file it is given, leaving results/ alone; a
selector naming an unknown part, and ``--record --quick``, are refused in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


def harness(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_list_shows_the_registry_and_expands_a_selector() -> None:
    done = harness("list")
    assert done.returncode == 0, done.stderr
    studies = ("read", "filter-scan", "resume", "metrics", "memory", "materialize", "object-store", "planning")
    for name in ("scan", "jpeg", "ours-waited", "lance.torch", "litdata", "lancedb", "mosaic", "peers", *studies):
        assert re.search(rf"^\s+{re.escape(name)}\s", done.stdout, re.M), name
    done = harness("list", "scan,filter/ours,lance.torch/3k/0,2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        f"{w}/{lo}/3k/{n}/local" for w in ("scan", "filter") for n in (0, 2) for lo in ("ours", "lance.torch")
    ]
    # a peer has no ShardShuffle: the pair is not a cell
    assert harness("list", "shard-shuffle/*/3k").stdout.split() == [
        f"shard-shuffle/{lo}/3k/0/local" for lo in ("ours", "ours-waited", "ours-stock")
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["list", "scan/nope"], "unknown loader 'nope'; known: ours,"),
        (["list", "scan/ours/lots"], "size 'lots'"),
        (["run", "scan/ours/3k/x"], "workers 'x'"),
        (["run", "peers", "--record", "--quick"], "--record with --quick"),
        (["run", "scan/ours", "--record"], "--record writes a suite's result file"),
        (["run", "mixture", "--set", "nope=1"], "--set nope=1: mixture's parameters are batch, batch_size,"),
        (["run", "mixture", "--set", "rows=many"], "--set rows=many: not a value of its type (int)"),
        (["run", "resume", "--record", "--quick"], "--record writes a result of record: not with --quick"),
        (["run", "resume", "scan/ours"], "a study runs alone"),
    ],
)
def test_a_selector_it_cannot_read_is_refused_in_one_line(args: list[str], said: str) -> None:
    done = harness(*args)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(300)
def test_run_measures_each_cell_in_a_fresh_process(tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()}
    out = tmp_path / "cells.md"
    args = ["run", "scan,filter/ours/3k/0", "--seconds", "0.3", "--cache-dir", str(tmp_path), "--out", str(out)]
    done = harness(*args, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert "Command: `uv run python -m benchmarks run scan,filter/ours/3k/0 --seconds 0.3" in text
    number = r"[0-9][0-9,]*(\.[0-9]+)?"
    for cell in ("scan/ours/3k/0/local", "filter/ours/3k/0/local"):
        row = rf"^\| `{re.escape(cell)}` \|[^|]+\|[^|]+\| {number} \|  \| {number} \|  \| {number} \| {number} "
        assert re.search(row + rf"\| {number} \| {number} \| {number} \| \d+ \| ok", text, re.M), cell
    assert "- Every cell ran." in text
    raw = json.loads(out.with_suffix(".json").read_text())
    scan, filtered = (raw["results"][f"{w}/ours/3k/0/local"][0] for w in ("scan", "filter"))
    assert scan["quality"] < 0.7  # storage order: a batch is 256 neighbouring ids of 3,000
    assert filtered["rows_per_s"] > 0 and filtered["read_calls"] > 0 and filtered["check"].startswith("ok")
    assert {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()} == before


@pytest.mark.timeout(400)
def test_a_study_runs_with_its_parameters_and_writes_one_header(tmp_path: Path) -> None:
    """A study (the mixture's) at parameters given with --set: its sections under the harness's
    header (the exact command, a quick run), written where --out says, results/ left alone."""
    before = {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()}
    out = tmp_path / "mixture.md"
    sets = ["--set", "rows=3000", "--set", "batches=2", "--set", "batch_size=64", "--set", "reps=1"]
    args = ["run", "mixture", "--quick", *sets, "--cache-dir", str(tmp_path), "--out", str(out)]
    done = harness(*args, timeout=380)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Mixtures: the position map and reading\n")
    assert f"Command: `uv run python -m benchmarks run mixture --quick {' '.join(sets)}" in text
    assert "QUICK smoke run" in text and "datasets of 3,000 rows each" in text
    assert re.search(r"^\| mixture of 2 sources \(0.7/0.3\), RowShuffle \| [0-9,]+ \|$", text, re.M)
    assert re.search(r"^\| 1,000,000,000 \| 90% \| [0-9,]+ \|$", text, re.M)
    assert {p.name: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()} == before
