"""The ``lance-lightning`` command: LightningCLI with `LanceDataModule` as the data module.

Guarantees:
- ``lance-lightning fit|validate|test|predict --config X.yaml`` builds any LightningModule given
  by ``class_path`` and a `LanceDataModule` from ``data:`` (`lance_lightning.cli.lightning`);
  modules in the current directory (e.g. ``examples.digits``) resolve as with ``python -m``.
- ``lance-lightning profile --config X.yaml`` runs only the config's data pipeline and prints the
  data loading report (`lance_lightning.cli.profile`); ``lance-lightning materialize`` copies a
  source to a local view (`lance_lightning.cli.materialize`).
- Start-up imports only what the subcommand needs: ``lance-lightning --help``, ``materialize``,
  ``holds`` and ``prepare`` never import Lightning or torch.
- ``lance-lightning holds URI`` lists (or releases) the version holds of fits (`lance_lightning.cli.holds`);
  ``lance-lightning prepare`` converts raw files to a Lance dataset (`lance_lightning.cli.prepare`).
- Every module of the command is in this folder; `main` dispatches (`lance_lightning.cli.main`).
- Parser errors (`lance_lightning.cli.parser.OneScreenParser`) name the bad key in a few lines, without the usage dump,
  exit status 2; configs the parsers save or print have their credentials redacted.
- An error of lance_lightning's own (a `ConfigError`, a data or cursor error) ends the command
  with a few lines on stderr (what, the parameter, the value, the fix) and exit status 1; the
  full traceback is printed when the environment sets ``LANCE_LIGHTNING_TRACEBACK=1``. Any other
  error is re-raised. Credentials (`lance_lightning.redaction`) never appear in these lines, in
  parser errors or in a traceback: the messages of the error and of its causes are redacted
  first, including every credential value the command line or its config files give.
- A Trainer subcommand stopped by SIGTERM exits with status 143 (128 + SIGTERM), after Lightning's
  ``on_exception`` checkpoint, never 0: a scheduler sees that the run did not finish.
"""

from __future__ import annotations

from typing import Any

from lance_lightning.cli.main import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:  # `lance_lightning.cli.LanceLightningCLI` without importing Lightning eagerly
    if name == "LanceLightningCLI":
        from lance_lightning.cli.lightning import LanceLightningCLI

        return LanceLightningCLI
    raise AttributeError(f"module 'lance_lightning.cli' has no attribute {name!r}")
