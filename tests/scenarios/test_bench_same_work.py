"""The harness's JPEG cells do the same work in every loader: ours decodes a batch to the uint8
images the peers' cells make with TorchCodec's batched decoder (`benchmarks.harness.loaders.decode_jpegs`),
not to the float images ``DecodeImage`` makes by default (a quarter more CPU per row)."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa
import torch

from benchmarks.harness.loaders import build, decode_jpegs
from benchmarks.harness.registry import WORKLOADS
from tests.images import jpeg, noise


def test_ours_jpeg_cell_gives_the_peers_uint8_images_of_the_same_rows(tmp_path: Path) -> None:
    rows = 300
    uri = str(tmp_path / "images.lance")
    blobs = [jpeg(noise(3, 16, 16, seed=i)) for i in range(rows)]
    lance.write_dataset(
        pa.table({"id": pa.array(range(rows), pa.int64()), "image": pa.array(blobs, pa.binary()), "label": [0] * rows}),
        uri,
    )
    batch = next(iter(build("ours", WORKLOADS["jpeg"], 0, {"uri": uri, "table_rows": rows})))
    ids = batch["id"].tolist()
    expected = decode_jpegs([blobs[i] for i in ids])
    assert batch["image"].dtype == torch.uint8 == expected.dtype
    assert torch.equal(batch["image"], expected)
