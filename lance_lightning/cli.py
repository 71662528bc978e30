"""The ``lance-lightning`` command: LightningCLI with `LanceDataModule` as the data module.

Guarantees: ``lance-lightning fit|validate|test|predict --config X.yaml`` builds any
LightningModule given by ``class_path`` and a `LanceDataModule` from ``data:``; modules in the
current directory (e.g. ``examples.digits``) resolve as with ``python -m``.
``lance-lightning profile --config X.yaml`` runs only the config's data pipeline and prints the
data loading report (see `lance_lightning.profile`); ``lance-lightning materialize`` copies a
source to a local view (see `lance_lightning.materialize`).
"""

from __future__ import annotations

import importlib
import os
import sys

from typing import Any

from lightning.pytorch.cli import LightningCLI

from lance_lightning.datamodule import LanceDataModule


class LanceLightningCLI(LightningCLI):
    """LightningCLI that says where a run's logs and checkpoints went."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The data module's policy defaults are None (built in __init__); show what runs instead.
        parser.set_defaults({f"data.{name}": {"class_path": path} for name, path in _POLICY_DEFAULTS.items()})

    def after_fit(self) -> None:
        trainer = self.trainer
        if trainer.is_global_zero:
            checkpoints = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else None
            print(f"logs: {os.path.abspath(trainer.log_dir)}\ncheckpoints: {checkpoints}")
            if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.last_model_path:
                print(f"resume with: --ckpt_path {trainer.checkpoint_callback.last_model_path}")


#: What the data module builds for these arguments when they are None.
_POLICY_DEFAULTS = {"shuffle": "lance_lightning.NoShuffle", "filter_read": "lance_lightning.FilterRead",
                    "bad_rows": "lance_lightning.badrows.RaiseOnBadRow", "retry": "lance_lightning.RetryPolicy"}

_DESCRIPTION = (
    "Train with a LanceDataModule. Also: `lance-lightning profile --config X.yaml [--batches N] "
    "[--split train]` runs only the data pipeline of a config and reports what limits it; "
    "`lance-lightning materialize --uri URI --out-dir DIR` copies a source to a local view once."
)
#: Subcommands that are not Trainer stages: name -> "module:function(argv) -> exit status".
_TOOLS = {"profile": "lance_lightning.profile:main", "materialize": "lance_lightning.materialize_cli:materialize_main"}


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lance-lightning``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] and argv[0] in _TOOLS:
        module, function = _TOOLS[argv[0]].split(":")
        code = getattr(importlib.import_module(module), function)(argv[1:])
        if code:
            sys.exit(code)
        return
    LanceLightningCLI(
        datamodule_class=LanceDataModule,
        subclass_mode_model=True,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": _DESCRIPTION},
        args=args,
    )


if __name__ == "__main__":
    main()
