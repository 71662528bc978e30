"""Batch transforms.

Guarantees: a batch transform is a callable ``transform(batch) -> batch`` on a
``dict[str, Any]`` mapping column name to a torch tensor (numeric columns),
``list[str]`` (strings) or ``list[bytes]`` (binary columns). Every transform
here returns a new dict, replaces only the keys it documents, and is picklable
and free of shared mutable state, so it may run on worker threads or processes.
"""

from lance_lightning.transforms.image import DecodeImage, ImageDecodeError

__all__ = ["DecodeImage", "ImageDecodeError"]
