"""The harness's gpu study stays runnable without a GPU: its CPU smoke run (``python -m benchmarks
run gpu --set device=cpu``) goes through the decode and fit sections and writes the report; asked
for CUDA where there is none, or given a variant or sizes it cannot use, it refuses in one line
(exit status 2) and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


def gpu(tmp_path: Path, *sets: str, timeout: float = 300) -> subprocess.CompletedProcess:
    args = ["run", "gpu", "--cache-dir", str(tmp_path), "--out", str(tmp_path / "gpu.md")]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    done = gpu(tmp_path)
    assert done.returncode == 2 and "needs a CUDA device" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gpu.md").exists()


@pytest.mark.slow
def test_cpu_smoke_run_writes_every_section(tmp_path: Path) -> None:
    sets = ("device=cpu", "rows=24", "steps=3", "variants=cpu=0.5+threads=2+prio", "model2=true")
    done = gpu(tmp_path, *sets, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "gpu.md").read_text()
    assert text.startswith("# GPU: decode") and "Command: `uv run python -m benchmarks run gpu" in text
    assert "Device: CPU (smoke run, no GPU)" in text
    assert "| 16x16 |" in text and "| 32x32 |" in text  # decode rows, both backends measured
    assert text.count("| Lance (RowShuffle, decode on the device, `device_ahead=2`) |") == 2  # both models
    assert "(`device_ahead=0`) |" in text and text.count("| batches already on the device |") == 2
    assert (
        text.count("(`cpu=0.5+threads=2+prio`) |") == 2
        and "## ResNet-18 fit, bf16 mixed precision, batch 8, 16x16" in text
    )
    assert "Copies: skipped (they need CUDA)." in text


@pytest.mark.parametrize("variant", ["cpu", "cpu=x", "threads=1.5", "prio=1", "fast"])
def test_a_variant_it_cannot_read_is_refused(tmp_path: Path, variant: str) -> None:
    done = gpu(tmp_path, "device=cpu", f"variants={variant}")
    assert done.returncode == 2 and "a variant is cpu=F" in done.stderr
    assert not (tmp_path / "gpu.md").exists()


def test_rows_too_few_for_the_steps_is_refused(tmp_path: Path) -> None:
    done = gpu(tmp_path, "device=cpu", "rows=8", "steps=3")
    assert done.returncode == 2 and "one epoch must hold the 3 steps of 8 images" in done.stderr
    assert not (tmp_path / "gpu.md").exists()
