"""The command line's parsers show errors on one screen and never print a credential.

Guarantees: `OneScreenParser` (a mixin of every jsonargparse parser of the command) redacts the
configs it saves or prints; a parser error names the bad key in a few redacted lines, without the
usage dump, exit status 2 (union errors made short by `lance_lightning.cli.parse_errors`).
"""

from __future__ import annotations

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
