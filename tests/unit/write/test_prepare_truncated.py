"""Issue #50, defect 7: an image cut short at any byte is skipped and listed, a whole one kept.

Before the fix the image check was PIL's ``verify()``, which does not decode a JPEG's scan: a JPEG
cut in half was kept as a good row (and training failed on it). The oracle is the cut itself: a
file made by cutting a whole image short is bad, whatever the decoder makes of it.
"""

from __future__ import annotations

import io
import random
import warnings
from pathlib import Path

import lance
import pytest
from PIL import Image

from lance_lightning.source import Prepare
from lance_lightning.write import prepare
from lance_lightning.write.folders import IMAGE_FOLDER

#: (PIL format, save options, file extension) of every kind checked.
KINDS = [
    ("JPEG", {}, "jpg"),
    ("JPEG", {"progressive": True}, "jpeg"),
    ("PNG", {}, "png"),
    ("WEBP", {}, "webp"),
    ("GIF", {}, "gif"),
    ("BMP", {}, "bmp"),
    ("TIFF", {}, "tif"),
]


def noisy_image(fmt: str, options: dict, seed: int = 0) -> bytes:
    """A 24 x 18 image of random pixels (no run compresses it away), encoded by PIL."""
    rng = random.Random(seed)
    image = Image.new("RGB", (24, 18))
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(24 * 18)])
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize(("fmt", "options", "ext"), KINDS, ids=[f"{k[0]}-{k[2]}" for k in KINDS])
def test_every_cut_of_an_image_is_bad_and_the_whole_one_good(fmt: str, options: dict, ext: str) -> None:
    data = noisy_image(fmt, options)
    assert IMAGE_FOLDER._check(data) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL warns about cut TIFF tags before it fails
        kept = [n for n in range(1, len(data)) if IMAGE_FOLDER._check(data[:n]) is None]
    assert kept == []


def test_prepare_skips_and_lists_cut_images_and_keeps_whole_ones(tmp_path: Path) -> None:
    """Through `prepare`: cuts at a spread of offsets (a JPEG cut in half among them, the reported
    case) and at the last few bytes, of every kind, beside whole images: the report lists every cut
    file, and the rows are exactly the whole files' bytes."""
    whole, cut = {}, set()
    for k, (fmt, options, ext) in enumerate(KINDS):
        data = noisy_image(fmt, options, seed=k)
        (tmp_path / "in" / "whole").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / "whole" / f"{k}.{ext}").write_bytes(data)
        whole[f"whole/{k}.{ext}"] = data
        offsets = sorted(
            {*range(1, len(data), max(1, len(data) // 16)), len(data) // 2, *range(len(data) - 6, len(data))}
        )
        (tmp_path / "in" / "cut").mkdir(exist_ok=True)
        for n in offsets:
            (tmp_path / "in" / "cut" / f"{k}-{n:05d}.{ext}").write_bytes(data[:n])
            cut.add(f"cut/{k}-{n:05d}.{ext}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = prepare(Prepare("imagefolder", str(tmp_path / "in")), str(tmp_path / "out.lance"), progress=False)
    assert {path for path, _ in report.skipped} == cut and report.skipped_count == len(cut)
    assert all("is not a readable image" in reason for _, reason in report.skipped)
    rows = lance.dataset(str(tmp_path / "out.lance")).to_table(columns=["path", "image"]).to_pylist()
    assert {row["path"]: row["image"] for row in rows} == whole
