"""Redaction of credentials in object-store options: one rule, used wherever options could leak.

Guarantees:
- `is_secret_key` decides, from the normalized key name alone, whether a ``storage_options`` key
  holds a credential: access keys and key ids, secret keys, session/SAS/bearer tokens,
  passwords, account keys, client secrets, service-account JSON or keys, private keys, API keys.
- `redact_options` returns a copy of one options mapping with every secret value replaced by
  `REDACTED`; `redact_config` does so for every ``storage_options`` mapping nested anywhere in a
  config (dicts, lists, jsonargparse/argparse namespaces), leaving everything else as it is.
  Neither ever changes its input, so the live objects still pass the real values to Lance.
- `redact_text` masks ``key: value`` / ``'key': 'value'`` / ``key=value`` pairs with a secret
  key in free text (parser messages, logs).
- `check_not_redacted` refuses options that hold the `REDACTED` placeholder (a saved config or
  checkpoint reused as is) with a `ConfigError` saying to pass credentials through the environment.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

#: What a saved config, a repr or a message shows in place of a secret value.
REDACTED = "<redacted>"

#: Fragments of a normalized key (lowercase, alphanumeric only) that mark it as a credential.
_SECRET_FRAGMENTS = (
    "secret",
    "password",
    "passwd",
    "token",
    "accesskey",
    "accountkey",
    "masterkey",
    "serviceaccount",
    "credential",
    "privatekey",
    "apikey",
    "keyid",
    "signature",
)
#: Whole words (between ``_``, ``-``, ``.``) that mark a key as a credential.
_SECRET_WORDS = ("key", "sas")
_OPTIONS_KEY = "storage_options"


def is_secret_key(key: str) -> bool:
    """Whether an object-store option named ``key`` holds a credential (by its name alone)."""
    words = re.split(r"[^a-z0-9]+", str(key).lower())
    name = "".join(words)
    return any(word in words for word in _SECRET_WORDS) or any(part in name for part in _SECRET_FRAGMENTS)


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A copy of ``options`` with every secret value replaced by `REDACTED`."""
    if options is None:
        return None
    return {
        key: REDACTED if is_secret_key(key) and value not in (None, "") else value for key, value in options.items()
    }


def redact_config(value: Any) -> Any:
    """A copy of ``value`` with every nested ``storage_options`` mapping redacted."""
    if isinstance(value, argparse.Namespace):
        return type(value)(**{key: _redact_entry(key, item) for key, item in vars(value).items()})
    if isinstance(value, Mapping):
        return {key: _redact_entry(key, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_config(item) for item in value)
    return value


def _redact_entry(key: Any, value: Any) -> Any:
    if str(key).split(".")[-1] == _OPTIONS_KEY and isinstance(value, Mapping):
        return redact_options(value)
    return redact_config(value)


# 'key': 'value' (reprs), "key": "value" (JSON), key: value (YAML), key=value (command lines).
_PAIR = re.compile(
    r"""(?P<key>['"]?(?P<name>[A-Za-z0-9_.\-]+)['"]?\s*(?::|=)\s*)"""
    r"""(?P<value>'[^']*'|"[^"]*"|[^\s,;{}\[\]'"]+)"""
)


def redact_text(text: str) -> str:
    """``text`` with the value of every secret-looking ``key: value`` pair masked."""

    def mask(match: re.Match) -> str:
        if not is_secret_key(match.group("name")):
            return match.group(0)
        value = match.group("value")
        quote = value[0] if value[:1] in ("'", '"') else ""
        return f"{match.group('key')}{quote}{REDACTED}{quote}"

    return _PAIR.sub(mask, text)


def check_not_redacted(param: str, options: Mapping[str, Any] | None) -> None:
    """Raise `ConfigError` if ``options`` hold the `REDACTED` placeholder instead of a credential."""
    from lance_lightning.errors import ConfigError

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
