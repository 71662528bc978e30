"""Each input format prepares to the columns, ids and bytes its docstring promises, from real files;
the result does not depend on the number of workers or the unit size."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lance_lightning.source import Prepare
from lance_lightning.write import prepare
from lance_lightning.write.units import Item, plan_units
from tests.unit.write.inputs import CLASSES, hf_folder, image_folder, parquet_files, table, tar_shards


def _read(uri: str | Path) -> pa.Table:
    return lance.dataset(str(uri)).to_table()


def test_imagefolder_columns_ids_labels_and_bytes(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=3)
    report = prepare(Prepare("imagefolder", str(root), unit_files=4), str(tmp_path / "out.lance"), progress=False)
    got = _read(tmp_path / "out.lance")
    assert got.schema.names == ["id", "image", "label", "label_name", "path"]
    assert got["id"].to_pylist() == list(range(9))
    assert got["label"].to_pylist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert got["label_name"].to_pylist() == [c for c in CLASSES for _ in range(3)]
    for path, image in zip(got["path"].to_pylist(), got["image"].to_pylist()):
        assert (root / path).read_bytes() == image
    assert (report.status, report.rows, report.units, report.skipped_count) == ("prepared", 9, 3, 0)
    assert len(lance.dataset(str(tmp_path / "out.lance")).get_fragments()) == 3  # one fragment per unit
    assert not (tmp_path / "out.lance.partial").exists()


def test_a_corrupt_image_is_skipped_listed_and_keeps_the_other_ids(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=2, bad=("cat/001x.png",))
    report = prepare(Prepare("imagefolder", str(root)), str(tmp_path / "out.lance"), progress=False)
    got = _read(tmp_path / "out.lance")
    assert got["id"].to_pylist() == [0, 1, 3, 4, 5, 6]  # cat/001x.png was id 2
    assert report.skipped == [("cat/001x.png", "is not a readable image (cannot identify image file)")]
    assert "skipped cat/001x.png: is not a readable image" in report.text()


def test_webdataset_groups_members_by_key_one_column_per_extension(tmp_path: Path) -> None:
    root = tar_shards(tmp_path / "in", shards=2, per_shard=3)
    prepare(Prepare("webdataset", str(root)), str(tmp_path / "out.lance"), progress=False)
    got = _read(tmp_path / "out.lance")
    assert got.schema.names == ["id", "key", "shard", "cls", "jpg", "seg_png"]
    assert got["id"].to_pylist() == list(range(6))
    assert got["key"].to_pylist() == ["s0-000", "s0-001", "s0-002", "s1-000", "s1-001", "s1-002"]
    assert got["shard"].to_pylist()[2:4] == ["shard-00.tar", "shard-01.tar"]
    assert got["cls"].to_pylist() == [0, 1, 2] * 2  # int64, as WebDataset decodes .cls
    assert [v is None for v in got["seg_png"].to_pylist()] == [False, True, False] * 2
    with tarfile.open(root / "shard-01.tar") as tar:
        assert got["jpg"][4].as_py() == tar.extractfile("s1-001.jpg").read()


def test_webdataset_reads_one_tar_file(tmp_path: Path) -> None:
    root = tar_shards(tmp_path / "in", shards=1, per_shard=4)
    prepare(Prepare("webdataset", str(root / "shard-00.tar")), str(tmp_path / "out.lance"), progress=False)
    assert _read(tmp_path / "out.lance")["shard"].to_pylist() == ["shard-00.tar"] * 4


def test_parquet_folder_and_file(tmp_path: Path) -> None:
    root = parquet_files(tmp_path / "in", files=3, rows=5)
    prepare(Prepare("parquet", str(root), unit_files=2), str(tmp_path / "a.lance"), progress=False)
    got = _read(tmp_path / "a.lance")
    assert got["id"].to_pylist() == list(range(15))
    assert got.drop_columns(["id"]).to_pylist() == [row for k in range(3) for row in table(k * 5, 5).to_pylist()]
    prepare(Prepare("parquet", str(root / "part-1.parquet")), str(tmp_path / "b.lance"), progress=False)
    assert _read(tmp_path / "b.lance")["x"].to_pylist() == list(range(5, 10))


def test_hf_save_to_disk_folder_read_without_datasets(tmp_path: Path) -> None:
    root = hf_folder(tmp_path / "in", files=2, rows=9)
    prepare(Prepare("hf", str(root)), str(tmp_path / "out.lance"), progress=False)
    dataset = lance.dataset(str(tmp_path / "out.lance"))
    got = dataset.to_table()
    assert got["id"].to_pylist() == list(range(18)) and got["x"].to_pylist() == list(range(18))
    assert got["text"].to_pylist()[:2] == ["t0", "t1"]
    assert b"huggingface" in (dataset.schema.metadata or {})


@pytest.mark.parametrize(
    ("format_", "column", "suffix"), [("videofolder", "video", "mp4"), ("audiofolder", "audio", "wav")]
)
def test_media_folders_store_blobs(tmp_path: Path, format_: str, column: str, suffix: str) -> None:
    payloads = {f"{c}/{n}.{suffix}": bytes([n]) * (1000 + n) + c.encode() for c in ("a", "b") for n in range(3)}
    for path, data in payloads.items():
        (tmp_path / "in" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / path).write_bytes(data)
    prepare(Prepare(format_, str(tmp_path / "in"), probe_media=False), str(tmp_path / "out.lance"), progress=False)
    dataset = lance.dataset(str(tmp_path / "out.lance"))
    assert "blob" in str(dataset.schema.field(column).type)
    paths = dataset.to_table(columns=["path"])["path"].to_pylist()
    blobs = dataset.take_blobs(column, indices=list(range(len(paths))))
    assert [blob.read() for blob in blobs] == [payloads[p] for p in paths]


def test_the_result_does_not_depend_on_workers_or_unit_size(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=5)
    tables = []
    for i, (workers, unit_files, pool) in enumerate([(1, 100, "threads"), (3, 2, "threads"), (2, 1, "processes")]):
        out = tmp_path / f"out{i}.lance"
        spec = Prepare("imagefolder", str(root), workers=workers, unit_files=unit_files, pool=pool)
        report = prepare(spec, str(out), progress=False)
        tables.append(_read(out))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    assert "on 2 processes" in report.text()


def test_units_cut_by_files_and_bytes_and_ids_follow_the_input() -> None:
    items = [Item(f"f{i}", size, rows) for i, (size, rows) in enumerate([(10, 1), (10, 2), (500, 3), (10, 1), (10, 1)])]
    units = plan_units(items, unit_files=2, unit_bytes=100)
    assert [[item.path for item in unit.items] for unit in units] == [["f0", "f1"], ["f2"], ["f3", "f4"]]
    assert [unit.first_id for unit in units] == [0, 3, 6]


def test_webdataset_stores_large_members_as_blobs_and_small_ones_plain(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    videos = [bytes([n]) * ((1 << 20) + n) for n in range(2)]
    with tarfile.open(tmp_path / "in" / "a.tar", "w") as tar:
        for n, video in enumerate(videos):
            for ext, data in (("mp4", video), ("txt", b"caption %d" % n), ("bin", b"x" * n)):
                info = tarfile.TarInfo(f"clip{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    prepare(Prepare("webdataset", str(tmp_path / "in")), str(tmp_path / "out.lance"), progress=False)
    dataset = lance.dataset(str(tmp_path / "out.lance"))
    assert "blob" in str(dataset.schema.field("mp4").type) and dataset.schema.field("bin").type == pa.large_binary()
    assert dataset.schema.field("txt").type == pa.large_string()  # as WebDataset decodes .txt
    assert [blob.read() for blob in dataset.take_blobs("mp4", indices=[0, 1])] == videos


def test_every_format_the_spec_accepts_has_a_reader() -> None:
    from lance_lightning.source import PREPARE_FORMATS
    from lance_lightning.write import FORMATS

    assert tuple(FORMATS) == PREPARE_FORMATS
