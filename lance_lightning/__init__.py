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
    "BadRowError": "lance_lightning.errors",
    "BufferShuffle": "lance_lightning.plan.strategies",
    "ConfigError": "lance_lightning.errors",
    "CursorMismatchError": "lance_lightning.errors",
    "AudioClips": "lance_lightning.media.samplers",
    "DataReadError": "lance_lightning.errors",
    "DataCursorCheckpoint": "lance_lightning.callbacks",
    "DataLoadingMonitor": "lance_lightning.callbacks",
    "FilterRead": "lance_lightning.plan.strategies",
    "LanceDataLoader": "lance_lightning.load.loader",
    "LanceDataModule": "lance_lightning.datamodule",
    "LanceIterableDataset": "lance_lightning.load.dataset",
    "LanceMapDataset": "lance_lightning.load.dataset",
    "LanceMixture": "lance_lightning.plan.mixture",
    "LancePredictionWriter": "lance_lightning.write.predictions",
    "LanceSource": "lance_lightning.source",
    "MaterializedView": "lance_lightning.materialize.view",
    "NoShuffle": "lance_lightning.plan.strategies",
    "NullValueError": "lance_lightning.errors",
    "PinnedSource": "lance_lightning.source",
    "Prepare": "lance_lightning.source",
    "Ragged": "lance_lightning.produce.convert",
    "RaiseOnBadRow": "lance_lightning.produce.badrows",
    "ReplaceBadRow": "lance_lightning.produce.badrows",
    "RemoteCache": "lance_lightning.materialize.cache",
    "RetryPolicy": "lance_lightning.read.retry",
    "RowError": "lance_lightning.errors",
    "RowShuffle": "lance_lightning.plan.strategies",
    "ShardShuffle": "lance_lightning.plan.strategies",
    "ShuffleStrategy": "lance_lightning.plan.strategies",
    "TokenPacking": "lance_lightning.plan.packing",
    "VideoClips": "lance_lightning.media.samplers",
    "UnsupportedColumnError": "lance_lightning.errors",
    "WorkerDiedError": "lance_lightning.errors",
    "exit_on_sigterm": "lance_lightning.lifetime",
    "pin_source": "lance_lightning.source",
    "to_torch_batch": "lance_lightning.produce.convert",
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
