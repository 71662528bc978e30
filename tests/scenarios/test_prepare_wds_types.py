"""``lance-lightning prepare --format webdataset`` types members as WebDataset users read them
(issue #52): ``cls``/``cls2``/``index`` int64, ``txt`` string, ``json`` a struct (same keys) or a
string, other extensions bytes; a member that does not fit keeps its column binary, noted in the
report. Shards written with Python's tarfile the way webdataset's ``ShardWriter`` writes them; the
oracle decodes the input bytes as ``webdataset.autodecode``'s basic handlers do."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import lance
import pytest

from tests.helpers import run_cli_process

REPO_ROOT = Path(__file__).resolve().parents[2]


def shard_writer(root: Path, samples: list[dict[str, bytes]], per_shard: int) -> None:
    """``root/shard-%06d.tar`` as ``webdataset.ShardWriter(pattern, maxcount=per_shard)`` writes
    them: each sample's members ``<__key__>.<ext>`` in sorted extension order, mode 0o444, uname
    and gname ``bigdata``."""
    root.mkdir(parents=True)
    for start in range(0, len(samples), per_shard):
        with tarfile.open(root / f"shard-{start // per_shard:06d}.tar", "w") as tar:
            for sample in samples[start : start + per_shard]:
                for ext in sorted(k for k in sample if k != "__key__"):
                    info = tarfile.TarInfo(f"{sample['__key__'].decode()}.{ext}")
                    info.size, info.mode, info.mtime = len(sample[ext]), 0o444, time.time()
                    info.uname = info.gname = "bigdata"
                    tar.addfile(info, io.BytesIO(sample[ext]))


def webdataset_decode(ext: str, data: bytes) -> object:
    """webdataset.autodecode.basichandlers, restated (without the package)."""
    last = ext.rsplit(".", 1)[-1]
    if last in ("cls", "cls2", "class", "count", "index", "inx"):
        return int(data)
    if last in ("txt", "text", "transcript"):
        return data.decode("utf-8")
    if last in ("json", "jsn"):
        return json.loads(data)
    return data


def _samples(n: int) -> list[dict[str, bytes]]:
    out = []
    for i in range(n):
        sample = {
            "__key__": f"sample{i:06d}".encode(),
            "cls": f"{i % 7}".encode() if i % 5 else f" {-(i * 1000003)}\n".encode(),
            "index": str(i).encode(),
            "txt": f"caption {i}: café ☕ {'x' * (i % 4)}".encode(),
            "json": json.dumps({"w": 32 + i, "h": 24.5 if i % 3 else 24, "tags": [f"t{i}"], "src": None}).encode(),
            "jpg": bytes([i % 256]) * (10 + i),
        }
        if i % 2 == 0:
            sample["cls2"] = str(i * 10).encode()
        out.append(sample)
    return out


def _prepare(root: Path, out: Path, *extra: str) -> str:
    code, output = run_cli_process(
        ["prepare", "--format", "webdataset", "--input", str(root), "--output", str(out), *extra], REPO_ROOT
    )
    assert code == 0, output[-3000:]
    return output


@pytest.mark.slow
def test_members_are_typed_as_webdataset_reads_them_then_fit_reads_cls_as_int64(tmp_path: Path) -> None:
    samples = _samples(25)
    shard_writer(tmp_path / "shards", samples, per_shard=4)  # 7 shards
    out = tmp_path / "out.lance"
    _prepare(tmp_path / "shards", out, "--unit-files", "2", "--workers", "2")  # 4 units on 2 threads
    table = lance.dataset(str(out)).to_table()
    types = {field.name: str(field.type) for field in table.schema}
    assert types["cls"] == types["cls2"] == types["index"] == "int64", types
    assert types["txt"] == "large_string" and types["jpg"] == "large_binary", types
    assert types["json"].startswith("struct<"), types
    rows = table.to_pylist()
    assert len(rows) == len(samples)
    for i, (row, sample) in enumerate(zip(rows, samples)):
        assert row["id"] == i and row["key"] == sample["__key__"].decode()
        for ext in ("cls", "cls2", "index", "txt", "json", "jpg"):
            want = webdataset_decode(ext, sample[ext]) if ext in sample else None
            assert row[ext] == want, (i, ext, row[ext], want)

    import lightning as L
    import torch

    from lance_lightning.datamodule import LanceDataModule
    from lance_lightning.source import LanceSource

    seen: list[torch.Tensor] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            seen.append(batch["cls"])
            return (self.w * batch["cls"].float()).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    module = LanceDataModule(train=LanceSource(str(out), columns=["cls", "index"]), batch_size=5)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Model(), datamodule=module)
    assert all(t.dtype == torch.int64 for t in seen)
    assert sorted(torch.cat(seen).tolist()) == sorted(int(s["cls"]) for s in samples)


@pytest.mark.slow
def test_a_member_that_does_not_fit_keeps_its_column_binary_and_the_report_says_why(tmp_path: Path) -> None:
    samples = _samples(9)
    samples[6]["cls"] = b"cat"  # not an integer: WebDataset would give None; prepare keeps the bytes
    samples[3]["json"] = b'{"other": 1}'  # other keys: a string column, not a struct
    samples[5]["txt"] = b"\xff\xfe not utf-8"
    shard_writer(tmp_path / "shards", samples, per_shard=3)
    out = tmp_path / "out.lance"
    output = _prepare(tmp_path / "shards", out, "--unit-files", "1", "--workers", "2")
    assert "note: column `cls` kept as bytes, not integers: shard-000002.tar:sample000006.cls is b'cat'" in output
    assert "note: column `txt` kept as bytes, not UTF-8 text: shard-000001.tar:sample000005.txt" in output
    table = lance.dataset(str(out)).to_table()
    assert str(table.schema.field("cls").type) == str(table.schema.field("txt").type) == "large_binary"
    assert str(table.schema.field("json").type) == "large_string"
    assert str(table.schema.field("index").type) == "int64"
    for row, sample in zip(table.to_pylist(), samples):
        assert row["cls"] == sample["cls"] and row["txt"] == sample["txt"]
        assert row["json"] == sample["json"].decode() and json.loads(row["json"]) == json.loads(sample["json"])
