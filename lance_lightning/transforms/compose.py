"""Chaining batch transforms.

Guarantees: `Compose` applies its transforms in the given order, each to the previous one's
output, and is picklable when they are. Columns no transform names pass through untouched, so
numeric columns reach the model exactly as converted (zero-copy tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import Batch

__all__ = ["Compose"]


class Compose:
    """Runs ``transforms`` one after the other on a batch.

    Args:
        transforms: Batch transforms (callables ``batch -> batch``), e.g. `DecodeImage` for the
            images, then `TokenWindows` for a token column. In YAML, a list of ``class_path`` entries.
    """

    def __init__(self, transforms: Sequence[Callable[[Batch], Batch]]) -> None:
        if isinstance(transforms, (str, bytes)) or not isinstance(transforms, Sequence):
            raise ConfigError(
                "transforms", transforms, "must be a list of batch transforms", "pass a list, e.g. [DecodeImage(...)]"
            )
        for i, transform in enumerate(transforms):
            if not callable(transform):
                raise ConfigError(
                    f"transforms[{i}]", transform, "is not callable", "pass callables that take and return a batch dict"
                )
        self.transforms = list(transforms)

    def __call__(self, batch: Batch) -> Batch:
        for transform in self.transforms:
            batch = transform(batch)
        return batch

    def check_schema(self, schema: Any) -> None:
        """Let each transform that can check the read columns' Arrow schema do so (at setup)."""
        for transform in self.transforms:
            check = getattr(transform, "check_schema", None)
            if check is not None:
                check(schema)

    @property
    def releases_gil(self) -> bool:
        """Whether every transform releases the GIL (`lance_lightning.load.race.may_hold_gil`)."""
        return all(getattr(t, "releases_gil", False) for t in self.transforms)

    @property
    def host_columns(self) -> tuple[str, ...]:
        """The columns its transforms read on the host (see `lance_lightning.device.transfer.host_columns`)."""
        return tuple(dict.fromkeys(c for t in self.transforms for c in getattr(t, "host_columns", ())))

    @property
    def blob_files(self) -> tuple[str, ...]:
        """The blob columns its transforms take as file objects (see `lance_lightning.read.blobs`)."""
        return tuple(dict.fromkeys(c for t in self.transforms for c in getattr(t, "blob_files", ())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transforms!r})"
