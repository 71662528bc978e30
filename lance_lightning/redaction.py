"""Redaction of credentials: one rule, applied wherever a config, a command line or a message is shown.

The rule: a credential is (1) the value of a ``storage_options`` key whose name marks a credential
(`is_secret_key`), whatever its type, or (2) the userinfo of a URL (``scheme://user:password@host``)
in any string. Nothing else is redacted: column names and other keys and values are shown as is.

Guarantees:
- `is_secret_key` decides, from the normalized key name alone, whether a ``storage_options`` key
  holds a credential: access keys and key ids, secret keys, session/SAS/bearer tokens,
  passwords, account keys, client secrets, service-account JSON or keys, private keys, API keys.
- `redact_config` returns a copy of a config (dicts, lists, argparse/jsonargparse namespaces,
  strings) with every credential replaced: an option's value by `REDACTED`, a URL's userinfo by
  ``scheme://<redacted>@host``; `redact_options` does so for one options mapping and
  `redact_userinfo` for one string. None changes its input, so the live objects still pass the
  real values to Lance.
- `redact_text` applies the rule to free text (messages, reprs, tracebacks): ``storage_options``
  mappings written inline (reprs, JSON, YAML flow), ``storage_options.KEY=value`` settings and URL
  userinfo; and it masks every ``known`` credential value of at least 4 characters wherever it
  appears (parser messages quote a bad value without its key).
- `redact_command` applies the rule to a command line (``--key value`` and ``--key=value``, plain,
  JSON or YAML values); `command_secrets` lists the credential values a command line gives, in its
  arguments or in the config files they name; `secret_values` lists those of a config.
- `redact_exception` redacts the message of an exception and of every exception it was raised
  from, in place, so that a traceback printed afterwards holds no credential.
- It imports nothing of the package, so every module (`lance_lightning.errors` first) may use it.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
#: Known values shorter than this are not masked in free text (they would mask unrelated words).
_SHORTEST_KNOWN = 4
#: ``scheme://userinfo@``: the userinfo runs to the last ``@`` before the host.
_USERINFO = re.compile(r"""([A-Za-z][A-Za-z0-9+.\-]*://)([^\s/?#'"<>,;()\[\]{}\\]+)@""")
#: ``storage_options`` (or ``storage_options.KEY``) followed by ``:`` or ``=``, quoted or not.
_OPTIONS_AT = re.compile(r"""storage_options(?:\.(?P<name>[\w\-]+))?['"]?\s*[:=]\s*""")
#: A ``key: value`` / ``'key': value`` / ``"key": value`` / ``key=value`` pair's key, inside a mapping.
_PAIR_KEY = re.compile(r"""(?P<quote>['"]?)(?P<name>[\w.\-]+)(?P=quote)\s*[:=]\s*""")
_CLOSING = {"[": "]", "{": "}", "(": ")"}
#: Where a bare value ends in a mapping (a command-line setting's value also ends at a blank).
_WORD_END = ",)]}\n"


def is_secret_key(key: str) -> bool:
    """Whether an object-store option named ``key`` holds a credential (by its name alone)."""
    words = re.split(r"[^a-z0-9]+", str(key).lower())
    name = "".join(words)
    return any(word in words for word in _SECRET_WORDS) or any(part in name for part in _SECRET_FRAGMENTS)


def redact_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced: ``scheme://<redacted>@host``."""
    return _USERINFO.sub(rf"\1{REDACTED}@", text)


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A copy of ``options`` with every secret value replaced by `REDACTED` (and URL userinfo)."""
    if options is None:
        return None
    return {
        key: REDACTED if is_secret_key(key) and value not in (None, "") else redact_config(value)
        for key, value in options.items()
    }


def redact_config(value: Any) -> Any:
    """A copy of ``value`` with every nested ``storage_options`` mapping and URL userinfo redacted."""
    if isinstance(value, str):
        return redact_userinfo(value)
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


def secret_values(value: Any) -> set[str]:
    """The credentials in the config ``value`` as text: each scalar of a secret option's value
    and each URL's userinfo (what `redact_config` replaces)."""
    found: set[str] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]  # (item, whether it is a storage_options mapping)
    while stack:
        item, options = stack.pop()
        if isinstance(item, argparse.Namespace):
            item = vars(item)
        if isinstance(item, Mapping):
            for key, sub in item.items():
                if options and is_secret_key(key):
                    found.update(_scalars(sub))
                else:
                    stack.append((sub, str(key).split(".")[-1] == _OPTIONS_KEY))
        elif isinstance(item, (list, tuple)):
            stack.extend((sub, False) for sub in item)
        elif isinstance(item, str):
            found.update(match.group(2) for match in _USERINFO.finditer(item))
    return found


def _scalars(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _scalars(item)]
    return [] if value is None or isinstance(value, bool) or value == "" else [str(value)]


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every credential masked: by the rule, and each ``known`` value (module docstring)."""
    text = _redact_inline_options(redact_userinfo(text))
    for value in sorted({v for v in known if len(v) >= _SHORTEST_KNOWN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def _redact_inline_options(text: str) -> str:
    """``text`` with the secret values of inline ``storage_options`` mappings and settings masked."""
    parts, done = [], 0
    for match in _OPTIONS_AT.finditer(text):
        start, name = match.end(), match.group("name")
        if match.start() < done or (name is None and not text.startswith("{", start)):
            continue
        if name is not None and not is_secret_key(name):
            continue
        end = _value_end(text, start, _WORD_END + " \t")  # a setting's bare value is one word
        value = text[start:end]
        parts += [text[done:start], _redact_mapping(value) if name is None else _masked(value)]
        done = end
    return "".join(parts) + text[done:]


def _redact_mapping(text: str) -> str:
    """The mapping written in ``text`` (from its ``{``) with the values of its secret keys masked."""
    parts, done = [], 0
    while (key := _PAIR_KEY.search(text, done)) is not None:
        end = _value_end(text, key.end())
        value = text[key.end() : end]
        parts += [text[done : key.end()], _masked(value) if is_secret_key(key.group("name")) else value]
        done = max(end, key.end())
    return "".join(parts) + text[done:]


def _value_end(text: str, start: int, word_end: str = _WORD_END) -> int:
    """Where the value that starts at ``text[start]`` ends: a quoted string, a bracketed value
    (nesting and quotes respected), or a bare word up to a character of ``word_end``."""
    closers: list[str] = []
    quote = ""
    at = start
    while at < len(text):
        char = text[at]
        if quote:
            if char == "\\":
                at += 1
            elif char == quote:
                quote = ""
                if not closers:
                    return at + 1
        elif char in "'\"" and (at == start or closers):
            quote = char
        elif char in _CLOSING and (at == start or closers):
            closers.append(_CLOSING[char])
        elif closers and char == closers[-1]:
            closers.pop()
            if not closers:
                return at + 1
        elif not closers and char in word_end:
            break
        at += 1
    while at > start and text[at - 1].isspace():
        at -= 1
    return at


def _masked(value: str) -> str:
    if value in ("", "None", "null", "''", '""'):
        return value  # nothing to hide, as in `redact_options`
    quote = value[0] if len(value) > 1 and value[0] in "'\"" and value[-1] == value[0] else ""
    return f"{quote}{REDACTED}{quote}"


def redact_command(argv: Sequence[str]) -> list[str]:
    """``argv`` with every credential it gives redacted, in ``--key value`` and ``--key=value`` forms."""
    shown = []
    for arg, key, value in _settings(argv):
        if key is None:
            shown.append(redact_userinfo(arg))
        else:
            path = key.lstrip("-").split(".")
            redacted = redact_text(value, secret_values(_nested(path, _parsed(value))))
            if _OPTIONS_KEY in path[:-1] and is_secret_key(path[-1]) and value.strip():
                redacted = REDACTED
            elif path[-1] == _OPTIONS_KEY and value.lstrip().startswith("{"):
                redacted = _redact_mapping(redacted)
            shown.append(redacted if arg == value else f"{key}={redacted}")
    return shown


def command_secrets(argv: Sequence[str]) -> set[str]:
    """The credential values ``argv`` gives: in its ``--key value`` settings and in the YAML or JSON
    config files it names (``--config X.yaml``, ``--data data.yaml``)."""
    found: set[str] = set()
    for _, key, value in _settings(argv):
        if key is not None:
            found |= secret_values(_nested(key.lstrip("-").split("."), _parsed(value, files=True)))
    return found


def _settings(argv: Sequence[str]) -> Iterator[tuple[str, str | None, str]]:
    """Each argument with the ``--key`` it gives a value to and that value (``None`` and the argument
    for the others): ``--key=value``, or ``--key`` then ``value``."""
    key = None
    for arg in argv:
        if key is not None and not arg.startswith("--"):
            yield arg, key, arg
        elif arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            yield arg, name, value
        else:
            yield arg, None, arg
        key = arg if arg.startswith("--") and "=" not in arg else None


def _parsed(value: str, files: bool = False) -> Any:
    """``value`` as the parser reads it (YAML; a config file's content with ``files``), else as is."""
    import yaml

    try:
        if files and os.path.splitext(value)[1] in (".yaml", ".yml", ".json") and os.path.isfile(value):
            with open(value) as file:
                value = file.read()
        return yaml.safe_load(value)
    except (OSError, ValueError, yaml.YAMLError):
        return value


def _nested(path: list[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def redact_exception(error: BaseException | None, known: Iterable[str] = ()) -> None:
    """Apply `redact_text` to the messages of ``error`` and of the errors it was raised from, in place."""
    known = tuple(known)
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.args and all(isinstance(arg, str) for arg in error.args):
            error.args = tuple(redact_text(arg, known) for arg in error.args)
        error = error.__cause__ or error.__context__
