"""Errors that say what is wrong and how to fix it.

Guarantees: every configuration error raised by lance_lightning names the parameter, shows the
value that was given and says what would fix it, so it can be acted on without reading code.
Credentials in a value (``storage_options`` anywhere inside it) are shown redacted.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A parameter has a value that cannot work. Raised in the main process, before training."""

    def __init__(self, param: str, value: Any, problem: str, fix: str) -> None:
        from lance_lightning.redaction import redact_config

        self.param = param
        self.value = value
        self.problem = problem
        self.fix = fix
        shown = redact_config({param.rsplit(".", 1)[-1]: value}).popitem()[1]
        super().__init__(f"`{param}`={shown!r}: {problem}. Fix: {fix}")


class CursorMismatchError(ValueError):
    """A checkpointed data cursor does not belong to the current read plan."""

    def __init__(self, field: str, saved: Any, current: Any) -> None:
        self.field = field
        super().__init__(
            f"data cursor mismatch on `{field}`: the checkpoint has {saved!r}, the current plan has "
            f"{current!r}. Resuming would not be exact. Restore the original setting to resume, or "
            "start a fresh data epoch on purpose with `LanceDataModule(resume_data=False)`."
        )
