"""The harness's video study stays runnable: its quick run (``python -m benchmarks run video
--quick``) measures every section on tiny videos (bytes
per clip local and from S3, the read path's costs per read-ahead, the decode split, clips/s against
both baselines, memory over epochs) and writes its table to the file it is given, leaving
results/video.md alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "video.md"


pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.slow
@pytest.mark.timeout(600)  # under a minute alone; minutes on 2 cores shared with other runs
def test_quick_run_writes_every_section_to_its_out_file(tmp_path: Path) -> None:
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    out = tmp_path / "video.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "run",
            "video",
            "--quick",
            "--cache-dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Video clips") and "QUICK smoke run" in text and "Command: `" in text
    for heading in ("## 1. Bytes per clip", "## 2. Where", "## 3. Clips/s", "## 4. Resident memory"):
        assert heading in text, heading
    number = r"[0-9][0-9,]*\.[0-9]+"
    for videos in ("short", "long"):
        for where, reader in (("local", "this loader, first epoch"), ("S3 \\+20 ms", "this loader, epoch 1")):
            row = rf"^\| {videos} \| {where} \| {reader} \| 0 \| {number} \| {number} \| {number} \| {number} \|"
            assert re.search(row, text, re.M), (videos, where, reader)
        assert re.search(rf"^\| {videos} \| 0 \| plain DataLoader: whole blob per clip .* \| {number} \|", text, re.M)
        assert re.search(rf"^\| {videos} \| 0 \| plain DataLoader: MP4 files on disk .* \| {number} \|", text, re.M)
    assert re.search(r"^\| long \(4\) \| 0 \| 3 \| \d+ / \d+ / \d+ \|", text, re.M)  # RSS after each epoch
    assert ("TorchCodec could not be measured here" in text) or ("TorchCodec's `VideoDecoder` works here" in text)
    assert (RESULTS.read_bytes() if RESULTS.exists() else None) == before
