"""The command line's parsers show errors on one screen and never print a credential.

Guarantees: `OneScreenParser` (a mixin of every jsonargparse parser of the command) redacts the
configs it saves or prints; a parser error names the bad key in a few redacted lines, without the
usage dump, exit status 2 (union errors made short by `lance_lightning.cli.parse_errors`). The
tools that take ``--storage-option KEY=VALUE`` (`add_storage_options`) read them one way
(`storage_options`): a malformed item ends the command with one line and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lance_lightning.cli.parse_errors import shorten
from lance_lightning.redaction import command_secrets, redact_config, redact_text


class OneScreenParser:
    """Mixin for jsonargparse parsers: dumps (saved and printed configs) have their credentials
    redacted; an error is a few redacted lines naming the key, exit status 2, without the usage."""

    def dump(self, cfg: Any, *args: Any, **kwargs: Any) -> str:
        return super().dump(redact_config(cfg), *args, **kwargs)  # type: ignore[misc]

    def error(self, message: str, ex: Exception | None = None) -> Any:
        # jsonargparse quotes a bad value without its key: mask what the command line gave as credentials.
        message = shorten(redact_text(message, command_secrets(getattr(self, "args", None) or [])))
        if not self.exit_on_error:  # type: ignore[attr-defined]  # an inner parse jsonargparse retries
            super().error(message, ex)  # type: ignore[misc]
        prog = self.prog.replace(" [options]", "")  # type: ignore[attr-defined]
        sys.stderr.write(
            f"{prog}: error: {message.strip()}\n"
            f"(all options: {prog} --help; one class's options: --data.<key>.help CLASS)\n"
        )
        sys.exit(2)


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """``--storage-option KEY=VALUE``, repeatable, on a tool's parser."""
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an object-store option for Lance, e.g. aws_endpoint=http://... (repeatable)",
    )


def storage_options(command: str, items: list[str]) -> dict[str, str]:
    """The ``--storage-option`` items of ``lance-lightning COMMAND`` as a mapping; a malformed item
    prints one line and raises ``SystemExit(2)``."""
    options: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            print(f"lance-lightning {command}: error: --storage-option {item!r} must be KEY=VALUE", file=sys.stderr)
            raise SystemExit(2)
        key, value = item.split("=", 1)
        options[key.strip()] = value
    return options
