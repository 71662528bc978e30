"""Raw inputs for the prepare tests, written with real encoders: a class folder of small PNG/JPEG
images, WebDataset tar shards, Parquet files and a Hugging Face ``save_to_disk`` folder laid out
as ``datasets`` lays it out (Arrow IPC stream files, ``state.json``, ``dataset_info.json``)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CLASSES = ("cat", "dog", "fox")


def image_bytes(i: int, fmt: str = "PNG") -> bytes:
    """A small solid image whose colour encodes ``i``."""
    out = io.BytesIO()
    Image.new("RGB", (8 + i % 3, 6), ((i * 37) % 256, (i * 91) % 256, 7)).save(out, format=fmt)
    return out.getvalue()


def image_folder(root: Path, per_class: int = 4, bad: tuple[str, ...] = ()) -> Path:
    """``root/<class>/<n>.png|jpg`` for `CLASSES`; the relative paths in ``bad`` hold garbage."""
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            fmt, ext = ("PNG", "png") if n % 2 == 0 else ("JPEG", "jpg")
            (root / name / f"{n:03d}.{ext}").write_bytes(image_bytes(c * 100 + n, fmt))
    for path in bad:
        (root / path).write_bytes(b"\x89PNG this is not an image")
    return root


def tar_shards(root: Path, shards: int = 3, per_shard: int = 5) -> Path:
    """``root/shard-<k>.tar``: samples ``s<k>-<n>`` with ``.jpg`` and ``.cls`` (and ``.seg.png`` on even n)."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        with tarfile.open(root / f"shard-{k:02d}.tar", "w") as tar:
            for n in range(per_shard):
                members = {"jpg": image_bytes(k * 10 + n, "JPEG"), "cls": str(n % 3).encode()}
                if n % 2 == 0:
                    members["seg.png"] = image_bytes(n)
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"s{k}-{n:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root


def table(start: int, rows: int) -> pa.Table:
    return pa.table({"x": pa.array(range(start, start + rows), pa.int64()), "text": [f"t{i}" for i in range(rows)]})


def parquet_files(root: Path, files: int = 3, rows: int = 7) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        pq.write_table(table(k * rows, rows), root / f"part-{k}.parquet")
    return root


def hf_folder(root: Path, files: int = 2, rows: int = 9) -> Path:
    """A ``Dataset.save_to_disk`` folder: ``data-0000k-of-0000n.arrow`` IPC streams and the two JSON files."""
    root.mkdir(parents=True, exist_ok=True)
    features = {"x": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}
    names = [f"data-{k:05d}-of-{files:05d}.arrow" for k in range(files)]
    for k, name in enumerate(names):
        data = table(k * rows, rows)
        data = data.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
        with pa.OSFile(str(root / name), "wb") as sink, pa.ipc.new_stream(sink, data.schema) as writer:
            for batch in data.to_batches(max_chunksize=4):
                writer.write_batch(batch)
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "abc", "_split": "train"}
    (root / "state.json").write_text(json.dumps(state))
    (root / "dataset_info.json").write_text(json.dumps({"features": features}))
    return root
