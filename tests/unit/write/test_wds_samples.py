"""WebDataset samples (`lance_lightning.write.shards`): a tar member without an extension has no sample
key, so it is skipped by name (never a row), and the samples around it keep all their members."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import lance

from lance_lightning.source import Prepare
from lance_lightning.write import prepare


def _shard(path: Path, members: list[tuple[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_member_without_an_extension_is_skipped_by_name_and_the_samples_stay_whole(tmp_path: Path) -> None:
    members = [("a.cls", b"0"), ("a.bin", b"x"), ("README", b"notes"), ("a.json", b"{}"), ("b.cls", b"1")]
    _shard(tmp_path / "in" / "shard-00.tar", members + [("b.bin", b"y")])
    report = prepare(Prepare("webdataset", str(tmp_path / "in")), str(tmp_path / "out.lance"), progress=False)
    got = lance.dataset(str(tmp_path / "out.lance")).to_table()
    assert got["key"].to_pylist() == ["a", "b"]
    assert got["cls"].to_pylist() == [0, 1]
    assert got["bin"].to_pylist() == [b"x", b"y"]
    assert got["json"].to_pylist()[0] is not None and got["json"].to_pylist()[1] is None
    assert [tuple(s) for s in report.skipped] == [("shard-00.tar:README", "has no extension, so no sample key")]
