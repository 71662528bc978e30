"""Every exception lance_lightning raises, in one place: errors that say what is wrong and how to fix it.

Guarantees: every configuration error raised by lance_lightning names the parameter, shows the
value that was given and says what would fix it, so it can be acted on without reading code.
Credentials in its message (``storage_options`` anywhere inside the value, URL userinfo) are
shown redacted (`lance_lightning.redaction`).
Every exception here pickles with its fields (``__reduce__``), so one raised in a DataLoader worker
process reaches the training process whole: the same type, message and attributes.
"""

from __future__ import annotations

from typing import Any

from lance_lightning.redaction import redact_config, redact_text


class ConfigError(ValueError):
    """A parameter has a value that cannot work. Raised in the main process, before training."""

    def __init__(self, param: str, value: Any, problem: str, fix: str) -> None:
        self.param = param
        self.value = value
        self.problem = problem
        self.fix = fix
        shown = redact_config({param.rsplit(".", 1)[-1]: value}).popitem()[1]
        super().__init__(redact_text(f"`{param}`={shown!r}: {problem}. Fix: {fix}"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.param, self.value, self.problem, self.fix))


class CursorMismatchError(ValueError):
    """A checkpointed data cursor does not belong to the current read plan."""

    def __init__(self, field: str, saved: Any, current: Any) -> None:
        self.field = field
        self.saved, self.current = saved, current
        if field == "format":
            cause = (
                "The checkpoint was written by another lance-lightning version, whose data order differs: "
                "resuming exactly needs that version"
            )
        elif field.endswith(".data"):
            cause = (
                "The dataset at that path was written again since the checkpoint (its data files differ): "
                "resuming would read other rows"
            )
        else:
            cause = "Resuming would not be exact. Restore the original setting to resume"
        super().__init__(
            f"data cursor mismatch on `{field}`: the checkpoint has {saved!r}, the current plan has "
            f"{current!r}. {cause}, or start a fresh data epoch on purpose with "
            "`LanceDataModule(resume_data=False)`."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.saved, self.current))


class RowError(ValueError):
    """Raised by a transform: row ``index`` of the batch cannot be transformed in ``column``."""

    def __init__(self, column: str, index: int, reason: str) -> None:
        self.column = column
        self.index = index
        self.reason = reason
        super().__init__(f"column {column!r}: row {index} of the batch: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.column, self.index, self.reason))


class BadMedia(Exception):
    """The media cannot give the asked-for clip; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,))


class BadRowError(ValueError):
    """A dataset row could not be transformed. Names the row position, id value and column."""

    def __init__(
        self, message: str, position: int | None = None, column: str | None = None, row_id: Any = None
    ) -> None:
        super().__init__(message)
        self.position = position
        self.column = column
        self.row_id = row_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.position, self.column, self.row_id))


class NullValueError(ValueError):
    """A column of the batch holds nulls and no fill value was given for it."""


class UnsupportedColumnError(TypeError):
    """A column's Arrow type has no tensor or list form in a training batch."""


class WorkerDiedError(RuntimeError):
    """A DataLoader worker process died mid-epoch; names its pid and how it died (``exitcodes``, as
    `multiprocessing` gives them: minus the signal's number for a worker killed by a signal)."""

    def __init__(self, message: str, pids: list[int], exitcodes: list[int] | None = None) -> None:
        super().__init__(message)
        self.pids = pids
        self.exitcodes = exitcodes if exitcodes is not None else []

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.pids, self.exitcodes))


class DataReadError(RuntimeError):
    """A read failed for good: it names the URI, version and rows, and chains the cause."""

    def __init__(
        self, message: str, *, uri: str, version: int | None, what: str, attempts: int, transient: bool
    ) -> None:
        super().__init__(message)
        self.uri = uri
        self.version = version
        self.what = what
        self.attempts = attempts
        self.transient = transient

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {"uri": self.uri, "version": self.version, "what": self.what}
        return (_rebuild_read_error, (str(self), fields, self.attempts, self.transient))


def _rebuild_read_error(message: str, fields: dict[str, Any], attempts: int, transient: bool) -> DataReadError:
    return DataReadError(message, attempts=attempts, transient=transient, **fields)


class MaterializeError(RuntimeError):
    """A view could not be made (e.g. the disk is full); no view or manifest was left behind."""


class ImageDecodeError(RowError):
    """A row's bytes could not be decoded as an image.

    Attributes:
        column: the batch column being decoded.
        index: the row's position within the batch (not the dataset row id; the
            bad-row policy maps it to the dataset row).
    """

    def __init__(self, column: str, index: int, reason: str) -> None:
        super().__init__(column, index, reason)
        self.args = (f"column {column!r}: row {index} of the batch could not be decoded as an image: {reason}",)
