"""Images stored as Lance blob v2 columns: detected at setup, read with ``read_blobs``, decoded by
`DecodeImage` exactly as inline binary images, in a real ``Trainer.fit`` and across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
import torch
from lance.blob import blob_array, blob_field

from lance_lightning import LanceDataModule, LanceSource, NoShuffle, RowShuffle
from lance_lightning.source import pin_source
from lance_lightning.transforms import DecodeImage
from tests.harness import assert_exact, fit, run_resume
from tests.helpers import ImageRecordingModel, make_table
from tests.images import jpeg, noise

ROWS = 96


def write_blob_dataset(path: Path, rows: int = ROWS, fragment_rows: int = 40) -> tuple[str, list[bytes]]:
    """`tests.helpers.make_table` columns plus ``image``: a distinct noise JPEG per row, stored as a
    blob v2 column (format 2.2). Returns the URI and the rows' JPEG bytes."""
    images = [jpeg(noise(3, 12, 10, seed=i)) for i in range(rows)]
    table = make_table(rows)
    schema = table.schema.append(blob_field("image"))
    table = table.append_column(schema.field("image"), blob_array(images))
    lance.write_dataset(table, str(path), data_storage_version="2.2", max_rows_per_file=fragment_rows)
    return str(path), images


def reference(images: list[bytes]) -> torch.Tensor:
    """Every row's CPU decode of its original bytes."""
    return DecodeImage(normalize=False)({"image": images})["image"]


def test_blob_columns_are_detected_at_setup(tmp_path: Path) -> None:
    uri, _ = write_blob_dataset(tmp_path / "blobs.lance", 8)
    assert isinstance(lance.dataset(uri).schema.field("image").type, pa.ExtensionType)  # a blob v2 column
    assert pin_source(LanceSource(uri), "train").blob_columns == ("image",)
    assert pin_source(LanceSource(uri, columns=["id", "x"]), "train").blob_columns == ()


@pytest.mark.parametrize("shuffle", [NoShuffle(), RowShuffle(seed=5, clump_rows=4)], ids=["none", "row"])
def test_fit_decodes_every_blob_row_like_its_bytes(
    tmp_path: Path, shuffle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, images = write_blob_dataset(tmp_path / "blobs.lance")
    calls: list[int] = []
    real = lance.LanceDataset.read_blobs

    def counted(self: lance.LanceDataset, column: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs["indices"]))
        return real(self, column, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "read_blobs", counted)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x", "image", "label"]),
        batch_size=16,
        shuffle=shuffle,
        transform=DecodeImage(normalize=False),
        reader_threads=2,
    )
    model = fit(tmp_path, dm, name="blobs", model=ImageRecordingModel())
    want = reference(images)
    seen = [i for step in model.seen for i in step]
    assert sorted(seen) == list(range(ROWS))  # every row once
    for ids, batch in zip(model.seen, model.images):
        assert torch.equal(batch, want[ids])
    assert sum(calls) == ROWS and len(calls) < ROWS // 16  # planned reads: one call per read group


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["none", "row:2"])
def test_resume_on_blob_images_is_exact(tmp_path: Path, shuffle: str) -> None:
    uri, _ = write_blob_dataset(tmp_path / "blobs.lance")
    k = 2
    a, b, c = run_resume(
        tmp_path,
        uri,
        shuffle,
        None,
        k=k,
        transform=DecodeImage(size=8),
        source=LanceSource(uri, columns=["id", "x", "image"]),
    )
    assert_exact(a.seen, b.seen, c.seen, k)
    assert sorted(i for step in c.seen for i in step) == list(range(ROWS))
