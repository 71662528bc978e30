"""Lightning callbacks: the data cursor in checkpoints, and the data loading monitor (with its
compute-floor replay probe, `lance_lightning.callbacks.replay`)."""

from lance_lightning.callbacks.checkpoint import DataCursorCheckpoint
from lance_lightning.callbacks.monitor import DataLoadingMonitor

__all__ = ["DataCursorCheckpoint", "DataLoadingMonitor"]
