"""lance-lightning: a PyTorch Lightning DataModule for Lance datasets.

Planned reads (scan or take, by shuffle strategy and filter selectivity), equal shards on every
rank and worker, exact O(1) mid-epoch resume from Lightning checkpoints.
"""

from lance_lightning.callbacks import DataCursorCheckpoint
from lance_lightning.convert import NullValueError, UnsupportedColumnError, to_torch_batch
from lance_lightning.datamodule import LanceDataModule
from lance_lightning.dataset import LanceIterableDataset, LanceMapDataset
from lance_lightning.errors import ConfigError, CursorMismatchError
from lance_lightning.loader import LanceDataLoader
from lance_lightning.source import LanceSource, PinnedSource, pin_source
from lance_lightning.strategies import BufferShuffle, FilterRead, NoShuffle, RowShuffle, ShardShuffle, ShuffleStrategy

__all__ = [
    "BufferShuffle",
    "ConfigError",
    "CursorMismatchError",
    "DataCursorCheckpoint",
    "FilterRead",
    "LanceDataLoader",
    "LanceDataModule",
    "LanceIterableDataset",
    "LanceMapDataset",
    "LanceSource",
    "NoShuffle",
    "NullValueError",
    "PinnedSource",
    "RowShuffle",
    "ShardShuffle",
    "ShuffleStrategy",
    "UnsupportedColumnError",
    "pin_source",
    "to_torch_batch",
]
