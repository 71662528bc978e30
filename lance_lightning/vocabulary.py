"""The words every stage shares: splits, Lightning stages, and what a batch is.

Guarantees: each is defined here once; no other module spells the split/stage mapping or the
batch type again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

#: A split of the data module: each has its own source, plan and loader.
Split = Literal["train", "val", "test", "predict"]
SPLITS: tuple[Split, ...] = ("train", "val", "test", "predict")

#: The Lightning stage that reads each split.
STAGE_OF_SPLIT: dict[Split, str] = {"train": "fit", "val": "validate", "test": "test", "predict": "predict"}

#: The splits each Lightning stage reads (``fit`` validates too).
SPLITS_OF_STAGE: dict[str, tuple[Split, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
}

#: The Lightning stages, in the order a run goes through them.
STAGES: tuple[str, ...] = tuple(SPLITS_OF_STAGE)

#: The input formats `lance_lightning.source.Prepare` (and ``lance-lightning prepare``) read
#: (`lance_lightning.write`); here, without Lance, so the command's parser imports nothing heavy.
PREPARE_FORMATS = ("imagefolder", "webdataset", "parquet", "hf", "videofolder", "audiofolder")

#: A converted batch: column name -> tensor (or `Ragged` / list for variable-length columns).
Batch = dict[str, Any]

#: The column a `LanceMixture` batch adds: each row's source index (int64).
MIXTURE_SOURCE = "source"

#: Row identity (`lance_lightning.produce.identity`, ``LanceDataModule(row_identity=...)``): keys a
#: batch gains, each an int64 tensor with one entry per row. ``_rowaddr``: the row's address in the
#: pinned version (``fragment_id << 32 | offset``, Lance's ``_rowaddr``); ``_rowid``: Lance's
#: ``_rowid`` (the stable row id when the dataset has stable row ids, else the address);
#: ``_position``: the row's index in the epoch's order (independent of rank, worker, batch size and
#: resume); ``_epoch``: the data epoch.
ROW_ADDRESS = "_rowaddr"
ROW_ID = "_rowid"
EPOCH_POSITION = "_position"
EPOCH = "_epoch"
IDENTITY_KEYS: tuple[str, ...] = (ROW_ADDRESS, ROW_ID, EPOCH_POSITION, EPOCH)
#: Column names Lance reserves for its system columns: a dataset cannot have a column of these names.
LANCE_RESERVED_COLUMNS: tuple[str, ...] = (
    ROW_ID,
    ROW_ADDRESS,
    "_rowoffset",
    "_row_created_at_version",
    "_row_last_updated_at_version",
)
#: A clip's dataset row (its position in the pinned version), in batches of clips (`lance_lightning.read.clips`).
CLIP_ROW = "_clip_row"
#: The splits with row identity when ``row_identity`` is not set: predict only.
DEFAULT_IDENTITY_SPLITS: tuple[Split, ...] = ("predict",)

#: A transform takes a converted batch; it may return any type (a dict, a tuple, a tensor...).
BatchTransform = Callable[[Batch], Any]


class Shipment(NamedTuple):
    """A finished batch with what travels beside it (never inside it) from the dataset to the loader.

    ``stats``: the stage totals a worker process measured since its previous batch (else None).
    ``positions``: the dataset positions of the batch's rows (an int64 tensor), when a device
    transform applies the bad-row policy (else None).
    """

    batch: Any
    stats: dict[str, float] | None
    positions: Any
