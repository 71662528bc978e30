"""Batch transforms.

Guarantees: a batch transform is a callable ``transform(batch) -> batch`` on a
``dict[str, Any]`` mapping column name to a torch tensor (numeric columns),
a `lance_lightning.produce.convert.Ragged` (variable-length numeric lists, and binary
columns as uint8 rows) or ``list[str]`` (strings). Every transform
here returns a new dict, replaces only the keys it documents, works on the
whole batch at once (no per-row Python loop where a batched call exists), and is
picklable and free of shared mutable state, so it may run on reader threads,
worker processes or both. A row a transform cannot handle raises a
`lance_lightning.produce.badrows.RowError` naming its index in the batch and the column.

Random transforms (`RandomFlip`, `RandomCrop`, `MaskTokens`, or your own with `RowRandom`)
draw per row from ``(seed, epoch, position of the row in the epoch order)``, which the batch's
row identity carries (``LanceDataModule(row_identity=...)``): the draws do not depend on the
thread, worker, rank or batch size, and a resumed run repeats them.

Host-side transforms go in ``LanceDataModule(transform=...)``; transforms that
run on the accelerator after the batch is copied there (`DeviceAugment`,
``DecodeImage(device="cuda")``) go in ``LanceDataModule(device_transform=...)``.
"""

from lance_lightning.transforms.augment import DeviceAugment
from lance_lightning.transforms.compose import Compose
from lance_lightning.transforms.image import DecodeImage, ImageDecodeError
from lance_lightning.transforms.random import MaskTokens, RandomCrop, RandomFlip, RowRandom
from lance_lightning.transforms.tokens import TokenWindows

__all__ = [
    "Compose",
    "DecodeImage",
    "DeviceAugment",
    "ImageDecodeError",
    "MaskTokens",
    "RandomCrop",
    "RandomFlip",
    "RowRandom",
    "TokenWindows",
]
