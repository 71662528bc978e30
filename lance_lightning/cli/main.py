"""``lance-lightning``'s dispatch: a subcommand to its module, and lance_lightning's errors as a few lines.

Guarantees:
- Start-up imports only what the subcommand needs: ``lance-lightning --help``, ``materialize``,
  ``holds`` and ``prepare`` never import Lightning or torch.
- An error of lance_lightning's own (a `ConfigError`, a data or cursor error) ends the command
  with a few lines on stderr (what, the parameter, the value, the fix) and exit status 1; the
  full traceback is printed when the environment sets ``LANCE_LIGHTNING_TRACEBACK=1``. Any other
  error is re-raised. Credentials (`lance_lightning.redaction`) never appear in these lines or in
  a traceback: the messages of the error and of its causes are redacted first, including every
  credential value the command line or its config files give.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from lance_lightning.errors import ConfigError
from lance_lightning.redaction import command_secrets, redact_config, redact_exception, redact_text

#: Set to 1 to print the full traceback of an error instead of its few lines.
TRACEBACK_ENV = "LANCE_LIGHTNING_TRACEBACK"
#: Subcommands that are not Trainer stages: name -> "module:function(argv) -> exit status".
_TOOLS = {
    "profile": "lance_lightning.cli.profile:main",
    "materialize": "lance_lightning.cli.materialize:materialize_main",
    "holds": "lance_lightning.cli.holds:holds_main",
    "prepare": "lance_lightning.cli.prepare:prepare_main",
    "explain": "lance_lightning.cli.explain:main",
}
#: LightningCLI's subcommands (`lance_lightning.cli.lightning`).
_STAGES = ("fit", "validate", "test", "predict")
_DESCRIPTION = (
    "Train with a LanceDataModule. Also: `lance-lightning profile --config X.yaml [--batches N] "
    "[--split train]` runs only the data pipeline of a config and reports what limits it; "
    "`lance-lightning materialize --uri URI --out-dir DIR` copies a source to a local view once; "
    "`lance-lightning holds URI [--release]` lists (or removes) the tags that hold versions fits train on; "
    "`lance-lightning prepare --format F --input PATH --output URI` converts raw files to a Lance dataset; "
    "`lance-lightning explain --config X.yaml [--split S] [--world_size N]` prints each split's plan."
)
_HELP = f"""usage: lance-lightning [-h] {{{",".join([*_STAGES, *_TOOLS])}}} ...

{_DESCRIPTION}

subcommands (each takes --config X.yaml and --help):
  fit          Runs the full optimization routine.
  validate     Perform one evaluation epoch over the validation set.
  test         Perform one evaluation epoch over the test set.
  predict      Run inference on your data.
  profile      Run only the data pipeline of a config for N batches and report what limits it.
  materialize  Copy a (remote) Lance dataset to a local materialized view, once.
  holds        List (or --release) the Lance tags holding the versions fits train on.
  prepare      Convert raw files (image folders, tar shards, Parquet, HF) to a Lance dataset, resumably.
  explain      Print the plan of each split of a config (version, rows, strategy, batches per rank).

Errors print a few lines; set {TRACEBACK_ENV}=1 for the full traceback.
"""


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lance-lightning``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print(_HELP, end="")
        return
    if not argv[0].startswith("-") and argv[0] not in (*_STAGES, *_TOOLS):
        choices = ", ".join([*_STAGES, *_TOOLS])
        print(f"lance-lightning: error: {argv[0]!r} is not a subcommand (choose from {choices})", file=sys.stderr)
        sys.exit(2)
    try:
        if argv[0] in _TOOLS:
            module, function = _TOOLS[argv[0]].split(":")
            code = getattr(importlib.import_module(module), function)(argv[1:])
        else:
            from lance_lightning.cli.lightning import run

            run(args, _DESCRIPTION)
            code = 0
    except Exception as error:  # noqa: BLE001 - only our own errors are shortened, others re-raise redacted
        known = command_secrets(argv)
        redact_exception(error, known)
        ours = _our_error(error)
        if ours is None or os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(error_lines(argv[0], ours, known), file=sys.stderr)
        code = 1
    if code:
        sys.exit(code)


def _our_error(error: BaseException) -> BaseException | None:
    """The error of lance_lightning's own type, or bad-argument error raised by its code, that
    ``error`` is or was caused by (jsonargparse wraps what a constructor raised); else None."""
    seen: BaseException | None = error
    while seen is not None:
        frame = seen.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        raised_in = frame.tb_frame.f_code.co_filename if frame is not None else ""
        if type(seen).__module__.split(".")[0] == "lance_lightning" or (
            isinstance(seen, (ValueError, TypeError)) and raised_in.startswith(_PACKAGE_DIR)
        ):
            return seen
        seen = seen.__cause__
    return None


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def error_lines(command: str, error: BaseException, known: Iterable[str] = ()) -> str:
    """A lance_lightning error as a few lines: what, the parameter, the value, the fix; credentials
    (and the ``known`` credential values) redacted."""
    prefix = f"lance-lightning {command}: error"
    if isinstance(error, ConfigError):
        value = repr(redact_config({error.param.rsplit(".", 1)[-1]: error.value}).popitem()[1])
        if len(value) > 300:
            value = value[:300] + " ..."
        text = f"{prefix}: {error.problem}\n  parameter: {error.param}\n  value:     {value}\n  fix:       {error.fix}"
    else:
        text = f"{prefix}: {type(error).__name__}: {error}"
    return redact_text(text, known) + f"\n  (set {TRACEBACK_ENV}=1 for the full traceback)"
