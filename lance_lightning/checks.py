"""The one validator for configuration values: integers and choices.

Guarantees: a value that fails a check raises `ConfigError` naming the parameter, the value and
the fix; ``bool`` never passes as an integer (YAML ``true`` is not 1).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from lance_lightning.errors import ConfigError


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    param: str, value: Any, minimum: int | None, fix: str, *, problem: str | None = None, optional: bool = False
) -> Any:
    """``value`` if it is an integer (``>= minimum`` when given; ``None`` when ``optional``), else `ConfigError`."""
    if optional and value is None:
        return value
    if not is_int(value) or (minimum is not None and value < minimum):
        if problem is None:
            problem = "must be an integer" if minimum is None else f"must be an integer >= {minimum}"
        raise ConfigError(param, value, problem, fix)
    return value


def check_choice(param: str, value: Any, choices: Collection[Any], problem: str, fix: str) -> Any:
    """``value`` if it is one of ``choices``, else `ConfigError`."""
    if value not in choices:
        raise ConfigError(param, value, problem, fix)
    return value
