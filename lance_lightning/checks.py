"""The one validator for configuration values: integers, positive numbers, choices and credentials.

Guarantees: a value that fails a check raises `ConfigError` naming the parameter, the value and
the fix; ``bool`` never passes as an integer (YAML ``true`` is not 1); `check_not_redacted`
refuses options that hold the `REDACTED` placeholder (a saved config or checkpoint reused as is)
and says to pass credentials through the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from typing import Any

from lance_lightning.errors import ConfigError
from lance_lightning.redaction import REDACTED


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


def check_positive_number(param: str, value: Any, fix: str, *, optional: bool = False) -> Any:
    """``value`` if it is a finite number > 0 (``None`` when ``optional``), else `ConfigError`
    (``inf``, ``nan``, 0, negatives, ``bool`` and strings are refused)."""
    if optional and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        problem = "must be a finite number > 0" + (", or null" if optional else "")
        raise ConfigError(param, value, problem, fix)
    return value


def check_choice(param: str, value: Any, choices: Collection[Any], problem: str, fix: str) -> Any:
    """``value`` if it is one of ``choices``, else `ConfigError`."""
    if value not in choices:
        raise ConfigError(param, value, problem, fix)
    return value


def check_not_redacted(param: str, options: Mapping[str, Any] | None) -> None:
    """Raise `ConfigError` if ``options`` hold the `REDACTED` placeholder instead of a credential."""
    for key, value in (options or {}).items():
        if value == REDACTED:
            raise ConfigError(
                f"{param}.{key}",
                REDACTED,
                "this is the placeholder that saved configs and checkpoints hold "
                "in place of a secret, not the secret itself",
                "pass credentials through the environment (e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
                "AWS_SESSION_TOKEN) or a credentials profile and drop the key from storage_options, or give the "
                "real value on the command line (docs/distributed.md, 'Data on object stores')",
            )


#: The values an on/off environment switch takes.
SWITCH_ON, SWITCH_OFF = ("on", "1", "true", "yes", ""), ("off", "0", "false", "no")


def env_switch(name: str) -> bool:
    """The on/off environment variable ``name`` (on when unset); `ConfigError` naming it otherwise."""
    value = os.environ.get(name, "on").strip().lower()
    if value in SWITCH_OFF:
        return False
    if value not in SWITCH_ON:
        raise ConfigError(name, value, "must be on or off", f"set {name}=on or {name}=off")
    return True
