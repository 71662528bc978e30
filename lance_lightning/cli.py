"""The ``lance-lightning`` command: LightningCLI with `LanceDataModule` as the data module.

Guarantees: ``lance-lightning fit|validate|test|predict --config X.yaml`` builds any
LightningModule given by ``class_path`` and a `LanceDataModule` from ``data:``; modules in the
current directory (e.g. ``examples.digits``) resolve as with ``python -m``.
"""

from __future__ import annotations

import os
import sys

from lightning.pytorch.cli import LightningCLI

from lance_lightning.datamodule import LanceDataModule


def main(args: list[str] | None = None) -> LightningCLI:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return LightningCLI(
        datamodule_class=LanceDataModule,
        subclass_mode_model=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
