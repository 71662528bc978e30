"""Small frictions of ``lance-lightning prepare`` (issue #52), through the CLI in a subprocess: no
Lance "No existing dataset ... it will be created" warning in the progress bar, "1 unit" (not
"1 units"), no ``OUT.lock`` left beside a finished dataset, and the report's dataset size counting
the blob files beside the data files, and the encoding each binary column got (and why)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import lance
import pytest

from tests.unit.write.inputs import image_folder

REPO_ROOT = Path(__file__).resolve().parents[2]


def _prepare(fmt: str, root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LANCE_LOG"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    args = ["prepare", "--format", fmt, "--input", str(root), "--output", str(out), *extra]
    run = subprocess.run(
        [sys.executable, "-m", "lance_lightning.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def _size(nbytes: float) -> str:
    """The report's size format, restated."""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"


@pytest.mark.parametrize("units", [1, 3])
def test_a_fresh_prepare_prints_no_lance_warning_says_1_unit_and_leaves_no_lock(tmp_path: Path, units: int) -> None:
    root = image_folder(tmp_path / "in", per_class=2)  # 6 images in 3 classes
    out = tmp_path / "out.lance"
    run = _prepare("imagefolder", root, out, "--unit-files", "6" if units == 1 else "2", "--workers", "2")
    assert "No existing dataset" not in run.stderr and "WARN" not in run.stderr, run.stderr
    assert "prepare" in run.stderr  # the progress bar itself is still there
    assert (f"6 rows in {units} unit{'s' if units > 1 else ''}, ") in run.stdout, run.stdout
    assert "0 files skipped" in run.stdout and "1 units" not in run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.lance"]  # no out.lance.lock, no .partial
    assert lance.dataset(str(out)).count_rows() == 6
    again = _prepare("imagefolder", root, out, "--unit-files", "6" if units == 1 else "2")
    assert "already complete" in again.stdout and not Path(f"{out}.lock").exists()


def test_the_report_counts_blob_files_and_says_which_encoding_each_column_got(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with tarfile.open(tmp_path / "in" / "a.tar", "w") as tar:
        for n in range(3):
            for ext, data in (("mp4", bytes([n]) * ((1 << 20) + n)), ("cls", b"%d" % n), ("jpg", b"j" * 4096)):
                info = tarfile.TarInfo(f"clip{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out.lance"
    run = _prepare("webdataset", tmp_path / "in", out, "--quiet")
    run = _prepare("webdataset", tmp_path / "in", tmp_path / "two.lance")
    on_disk = sum(p.stat().st_size for p in (tmp_path / "two.lance" / "data").rglob("*") if p.is_file())
    assert on_disk > 3 << 20  # the blobs' bytes are in files beside the data file
    assert f"-> dataset {_size(on_disk)}," in run.stdout, (run.stdout, on_disk)
    # which encoding each binary column got, as the dataset reports it, and why
    stored = lance.dataset(str(tmp_path / "two.lance")).schema
    assert "blob.v2" in str(stored.field("mp4").type) and str(stored.field("jpg").type) == "large_binary"
    assert (
        f"note: column `mp4` stored as Lance blobs ({stored.field('mp4').type}): its members average 1,024 KiB, "
        "at least 1 MiB (benchmarks/results/blob_encoding.md)"
    ) in run.stdout, run.stdout
    assert "note: column `jpg` stored inline (large_binary): its members average 4 KiB, under 1 MiB" in run.stdout
