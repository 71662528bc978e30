"""Lightning callbacks: the data cursor in checkpoints."""

from lance_lightning.callbacks.cursor import DataCursorCheckpoint

__all__ = ["DataCursorCheckpoint"]
