"""Issue #50, defect 1: every column after a blob column reads back as the input had it, in every
unit, whatever the pool and however many units are written after the dataset exists.

Before the fix, a unit written once the staging dataset existed was written in Lance's overwrite
mode, which numbers the fields anew (the blob column as a plain leaf): its fragment listed the field
ids ``[0,1,2,3,4]`` where the dataset's files list ``[0,1,4,5,6]``, so ``label`` was read from
``path``'s data. The oracle here is the input files themselves (their bytes, their folder names).
"""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lance_lightning.errors import ConfigError
from lance_lightning.source import Prepare
from lance_lightning.write import prepare
from lance_lightning.write.folders import VIDEO_FOLDER
from lance_lightning.write.shards import BLOB_BYTES
from tests.helpers import stop_prepare_after

CLASS_FOLDERS = {"videofolder": ".mp4", "audiofolder": ".wav"}


def class_folder(root: Path, ext: str, classes: int = 2, per_class: int = 3, size: int = 3000) -> list[dict]:
    """``root/c<k>/f<n><ext>`` of about ``size`` distinct bytes; the rows an exact prepare holds (the oracle)."""
    rows = []
    for k in range(classes):
        (root / f"c{k}").mkdir(parents=True)
        for n in range(per_class):
            data = bytes([k, n]) * (size // 2) + f"{k}/{n}".encode()
            (root / f"c{k}" / f"f{n}{ext}").write_bytes(data)
            path = f"c{k}/f{n}{ext}"
            rows.append({"blob": data, "label": k, "label_name": f"c{k}", "path": path})
    return [{"id": i, **row} for i, row in enumerate(rows)]


def blob_shards(root: Path, shards: int = 3, per_shard: int = 2) -> list[dict]:
    """Tar shards whose ``.mp4`` members average `BLOB_BYTES` (so stored as blobs), with a small
    ``.cls`` before and a ``.txt`` after them in column order; the oracle rows."""
    root.mkdir(parents=True)
    rows = []
    for k in range(shards):
        with tarfile.open(root / f"shard-{k}.tar", "w") as tar:
            for n in range(per_shard):
                key = f"s{k}-{n}"
                members = {"cls": str(n).encode(), "mp4": bytes([k, n]) * (BLOB_BYTES // 2), "txt": key.encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                decoded = {"cls": n, "txt": key}  # as WebDataset decodes .cls and .txt
                rows.append({"key": key, "shard": f"shard-{k}.tar", **members, **decoded})
    return [{"id": i, **row} for i, row in enumerate(rows)]


def read_all(uri: Path) -> list[dict]:
    """Every column of every row, blob columns as their bytes."""
    return lance.dataset(str(uri)).to_table(blob_handling="all_binary").to_pylist()


def _expected(fmt: str, tmp_path: Path) -> tuple[Path, list[dict]]:
    if fmt == "webdataset":
        return tmp_path / "in", blob_shards(tmp_path / "in")
    rows = class_folder(tmp_path / "in", CLASS_FOLDERS[fmt])
    column = "video" if fmt == "videofolder" else "audio"
    return tmp_path / "in", [{"id": r["id"], column: r["blob"], **{k: r[k] for k in r if k in _META}} for r in rows]


_META = ("label", "label_name", "path")


@pytest.mark.parametrize("fmt", ["videofolder", "audiofolder", "webdataset"])
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_every_unit_reads_back_as_the_input_after_a_blob_column(tmp_path: Path, fmt: str, pool: str) -> None:
    root, expected = _expected(fmt, tmp_path)
    spec = Prepare(fmt, str(root), unit_files=1, workers=1, pool=pool, probe_media=False)  # more units than 2 x workers
    report = prepare(spec, str(tmp_path / "out.lance"), progress=False)
    assert report.units > 2 and report.skipped_count == 0
    got = read_all(tmp_path / "out.lance")
    assert got == [{name: row[name] for name in got[0]} for row in expected]
    fields = {
        tuple(f.fields) for fr in lance.dataset(str(tmp_path / "out.lance")).get_fragments() for f in fr.metadata.files
    }
    assert len(fields) == 1  # every fragment numbered as the dataset


def test_a_unit_written_after_the_dataset_exists_resumes_to_the_input(tmp_path: Path, monkeypatch) -> None:
    root, expected = _expected("videofolder", tmp_path)
    spec = Prepare("videofolder", str(root), unit_files=2, workers=1, probe_media=False)
    stop_prepare_after(monkeypatch, spec, str(tmp_path / "out.lance"), 1)
    report = prepare(spec, str(tmp_path / "out.lance"), progress=False)  # every unit now written into the dataset
    assert (report.status, report.units_adopted) == ("resumed", 1)
    assert read_all(tmp_path / "out.lance") == expected


def test_a_partial_output_with_misnumbered_fragments_is_refused(tmp_path: Path, monkeypatch) -> None:
    """A partial output left by the old writer (fragments numbered two ways) is named, not extended."""
    from lance import LanceOperation, Transaction
    from lance.fragment import write_fragments

    root, _ = _expected("videofolder", tmp_path)
    spec = Prepare("videofolder", str(root), unit_files=2, workers=1, probe_media=False)
    partial = tmp_path / "out.lance.partial"

    stop_prepare_after(monkeypatch, spec, str(tmp_path / "out.lance"), 1)
    dataset = lance.dataset(str(partial))
    # what the old writer did for a later unit: Lance's overwrite mode against the existing dataset
    survey = dataclasses.replace(VIDEO_FOLDER, probe=False).survey(str(root), "skip")  # as spec: bytes only
    table = pa.table(
        {"id": [9], "video": [b"x"], "label": [0], "label_name": ["c"], "path": ["p"]}, schema=survey.schema
    )
    written = write_fragments(table, str(partial), schema=survey.schema, return_transaction=True, mode="overwrite")
    props = dataset.get_transactions(recent_transactions=1)[0].transaction_properties
    props = {**props, "lance_lightning.prepare.unit": "1"}
    lance.LanceDataset.commit(
        str(partial),
        Transaction(dataset.version, LanceOperation.Append(written.operation.fragments), transaction_properties=props),
    )
    with pytest.raises(ConfigError, match="numbered two ways") as error:
        prepare(spec, str(tmp_path / "out.lance"), progress=False)
    assert error.value.param == "output" and "delete it" in error.value.fix


@pytest.mark.slow
def test_ray_tasks_write_every_unit_as_the_input_after_a_blob_column(tmp_path: Path) -> None:
    """``pool="ray"`` goes through the same `DatasetWriter.write_unit`: both blob layouts (a class
    folder, a WebDataset blob extension) on a local 2-CPU Ray instance read back as their input."""
    # Under `uv run`, Ray workers would get a uv environment of their own, without Ray: on one
    # machine they must use this interpreter (as in tests/scenarios/test_ray.py). Read at import.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for fmt in ("videofolder", "webdataset"):
            root, expected = _expected(fmt, tmp_path / fmt)
            spec = Prepare(fmt, str(root), unit_files=1, workers=1, pool="ray", probe_media=False)
            assert prepare(spec, str(tmp_path / fmt / "out.lance"), progress=False).units > 2
            got = read_all(tmp_path / fmt / "out.lance")
            assert got == [{name: row[name] for name in got[0]} for row in expected]
    finally:
        ray.shutdown()
