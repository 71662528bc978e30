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


class LanceLightningCLI(LightningCLI):
    """LightningCLI that says where a run's logs and checkpoints went."""

    def after_fit(self) -> None:
        trainer = self.trainer
        if trainer.is_global_zero:
            checkpoints = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else None
            print(f"logs: {os.path.abspath(trainer.log_dir)}\ncheckpoints: {checkpoints}")
            if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.last_model_path:
                print(f"resume with: --ckpt_path {trainer.checkpoint_callback.last_model_path}")


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lance-lightning``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    LanceLightningCLI(
        datamodule_class=LanceDataModule,
        subclass_mode_model=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
