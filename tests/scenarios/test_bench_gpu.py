"""benchmarks/bench_gpu.py stays runnable without a GPU: its CPU smoke run goes through the decode
and fit sections and writes the report; asked for CUDA where there is none, it refuses clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


pytestmark = pytest.mark.soak  # a benchmark smoke run: `uv run pytest -m soak`


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "gpu.md")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "needs a CUDA device" in done.stderr
    assert not (tmp_path / "gpu.md").exists()


@pytest.mark.slow
def test_cpu_smoke_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu.md"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--rows",
            "24",
            "--steps",
            "3",
            "--out",
            str(out),
            "--data-dir",
            str(tmp_path),
            "--variants",
            "cpu=0.5+threads=2+prio",
            "--model2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert "device: CPU (smoke run, no GPU)" in text
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
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--variants", variant, "--out", str(tmp_path / "gpu.md")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "a variant is cpu=F" in done.stderr


def test_rows_too_few_for_the_steps_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--rows",
            "8",
            "--steps",
            "3",
            "--out",
            str(tmp_path / "gpu.md"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "--rows=8" in done.stderr
