"""lance-lightning: a PyTorch Lightning DataModule for Lance datasets.

Planned reads (scan or take, by shuffle strategy and filter selectivity), equal shards on every
rank and worker, exact O(1) mid-epoch resume from Lightning checkpoints.

Names are imported on first use, so DataLoader worker processes that only need the readers
never pay for importing Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BufferShuffle": "lance_lightning.strategies",
    "ConfigError": "lance_lightning.errors",
    "CursorMismatchError": "lance_lightning.errors",
    "DataReadError": "lance_lightning.retry",
    "DataCursorCheckpoint": "lance_lightning.callbacks",
    "DataLoadingMonitor": "lance_lightning.callbacks",
    "FilterRead": "lance_lightning.strategies",
    "LanceDataLoader": "lance_lightning.loader",
    "LanceDataModule": "lance_lightning.datamodule",
    "LanceIterableDataset": "lance_lightning.dataset",
    "LanceMapDataset": "lance_lightning.dataset",
    "LanceSource": "lance_lightning.source",
    "MaterializedView": "lance_lightning.materialize",
    "NoShuffle": "lance_lightning.strategies",
    "NullValueError": "lance_lightning.convert",
    "PinnedSource": "lance_lightning.source",
    "RetryPolicy": "lance_lightning.retry",
    "RowShuffle": "lance_lightning.strategies",
    "ShardShuffle": "lance_lightning.strategies",
    "ShuffleStrategy": "lance_lightning.strategies",
    "UnsupportedColumnError": "lance_lightning.convert",
    "WorkerDiedError": "lance_lightning.workers",
    "pin_source": "lance_lightning.source",
    "to_torch_batch": "lance_lightning.convert",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lance_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
