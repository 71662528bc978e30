"""Lightning callbacks: the data cursor counting finished training steps, and the data loading monitor (with its
compute-floor replay probe, `lance_lightning.callbacks.replay`)."""

from lance_lightning.callbacks.finished_steps import DataCursorCheckpoint
from lance_lightning.callbacks.monitor import DataLoadingMonitor

__all__ = ["DataCursorCheckpoint", "DataLoadingMonitor"]
