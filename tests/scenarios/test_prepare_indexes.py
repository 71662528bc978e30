"""``lance-lightning prepare --index`` (issue #52): scalar indexes built in the prepare's completion
(BITMAP up to 1,000 distinct values, else BTREE), a kill between the indexes and the completion
record finished by a rerun, a column that cannot be indexed refused before writing, and explain()
naming the index that counted a filter's matches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_lightning.write.ledger import DONE_KEY
from tests.helpers import run_cli_process

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"


def _parquet(root: Path, files: int = 3, rows: int = 500) -> Path:
    """Files of ``rows`` rows: ``label`` (10 values), ``split`` (train/val), ``code`` (all distinct)."""
    root.mkdir(parents=True)
    for k in range(files):
        start = k * rows
        ids = range(start, start + rows)
        table = pa.table(
            {
                "label": [i % 10 for i in ids],
                "split": ["val" if i % 5 == 0 else "train" for i in ids],
                "code": [f"c{i:06d}" for i in ids],
                "blob": [bytes([i % 256]) for i in ids],
            }
        )
        pq.write_table(table, root / f"part-{k}.parquet")
    return root


def _args(root: Path, out: Path, index: str) -> list[str]:
    return ["prepare", "--format", "parquet", "--input", str(root), "--output", str(out), "--unit-files", "1"] + [
        "--index",
        index,
    ]


def _indexes(out: Path) -> dict[str, str]:
    return {index["fields"][0]: index["type"] for index in lance.dataset(str(out)).list_indices()}


@pytest.mark.slow
def test_indexes_are_built_before_the_record_and_explain_names_the_one_that_counted(tmp_path: Path) -> None:
    root, out = _parquet(tmp_path / "in"), tmp_path / "out.lance"
    code, output = run_cli_process(_args(root, out, "label,split,code"), REPO_ROOT)
    assert code == 0, output[-3000:]
    assert _indexes(out) == {"label": "Bitmap", "split": "Bitmap", "code": "BTree"}  # 1,500 distinct > 1,000
    assert "note: index: BITMAP on label (10 distinct values)" in output
    assert "note: index: BTREE on code (1,500 distinct values)" in output
    dataset = lance.dataset(str(out))
    assert "label_idx" in dataset.scanner(filter="label = 3", columns=[], with_row_id=True).explain_plan()

    from lance_lightning.datamodule import LanceDataModule
    from lance_lightning.source import LanceSource

    module = LanceDataModule(
        train=LanceSource(str(out), columns=["label"], filter="label = 3"),
        val=LanceSource(str(out), columns=["label"], filter="blob = X'05'"),
        batch_size=10,
    )
    module.setup("fit")
    assert "selectivity 10.00%, counted by the BITMAP index on label)" in module.explain("train")
    assert "(selectivity 0.40%)" in module.explain("val")  # counted by a scan: no index named


@pytest.mark.slow
def test_a_kill_between_the_indexes_and_the_record_is_finished_by_a_rerun(tmp_path: Path) -> None:
    root, out = _parquet(tmp_path / "in"), tmp_path / "out.lance"
    killed = subprocess.run(
        [sys.executable, str(KILLER), "index:1", "cli", *_args(root, out, "label,split")[1:]],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    partial = lance.dataset(f"{out}.partial")
    assert DONE_KEY not in partial.config() and [i["name"] for i in partial.list_indices()] == ["label_idx"]
    code, output = run_cli_process(_args(root, out, "label,split"), REPO_ROOT)
    assert code == 0 and "resumed after 3 of 3 units" in output, output[-3000:]
    assert _indexes(out) == {"label": "Bitmap", "split": "Bitmap"}
    assert DONE_KEY in lance.dataset(str(out)).config()
    assert lance.dataset(str(out)).count_rows() == 1500


@pytest.mark.parametrize(
    ("index", "says"),
    [("nope", "is not a column of this prepare's dataset"), ("blob", "is binary, which a scalar index")],
)
def test_a_column_that_cannot_be_indexed_is_refused_before_writing(tmp_path: Path, index: str, says: str) -> None:
    root, out = _parquet(tmp_path / "in", files=1, rows=5), tmp_path / "out.lance"
    code, output = run_cli_process(_args(root, out, f"label,{index}"), REPO_ROOT)
    assert code == 1 and f"error: {says}" in output and "parameter: --index" in output, output
    assert f"value:     '{index}'" in output
    assert len(output.strip().splitlines()) <= 6, output
    assert not out.exists() and not Path(f"{out}.partial").exists()
