"""The Trainer subcommands of ``lance-lightning`` (fit, validate, test, predict): LightningCLI, made safe.

Guarantees:
- Every config this CLI writes or prints (``config.yaml`` in the log directory, ``--print_config``,
  the hyperparameters stored in checkpoints and ``hparams.yaml``, all made by the parser's
  ``dump``) has its credentials redacted (`lance_lightning.redaction`: secret ``storage_options``
  values, URL userinfo); the objects that run get the real values.
- A parser error is a few lines on stderr (what is wrong with which key, redacted, and where to
  find the options), exit status 2, without the usage dump; a value given for ``data.train`` is
  judged as the type it was meant as (`lance_lightning.cli.parse_errors`), and a mixture's mistake
  names the field inside it (``data.train.weights[0]``), exit status 1.
- At the end of ``fit`` every rank takes part in the collective calls (log directory, final
  checkpoint), so a DDP run ends with status 0; rank 0 prints where the logs and checkpoints are
  and the exact command that resumes the run, with every credential it gives redacted (pass those
  through the environment to resume).
- A ``ModelCheckpoint`` with ``save_last`` holds the final state of a finished fit in its last
  checkpoint, even when ``every_n_train_steps`` does not divide the number of steps.
- A fit refuses (before training) to write into a checkpoint directory that holds an earlier
  run's checkpoints without a version counter, unless it resumes with ``--ckpt_path``.
- Every subcommand checks ``--ckpt_path`` and its output directories before the trainer starts
  (`lance_lightning.preflight`): a missing, damaged or edited checkpoint, or a directory it cannot
  write, is one `ConfigError` naming it.
- A subcommand that Lightning stops on SIGTERM exits with status 143, after the checkpoint that
  ``OnExceptionCheckpoint`` writes (`lance_lightning.lifetime.exit_on_sigterm`), on every rank.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lance_lightning.cli.parser import OneScreenParser
from lance_lightning.errors import ConfigError
from lance_lightning.lifetime import exit_on_sigterm
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.preflight import check_checkpoint_file, check_writable
from lance_lightning.redaction import redact_command


class RedactingParser(OneScreenParser, LightningArgumentParser):
    """LightningCLI's parser with redacted dumps and one-screen errors (`OneScreenParser`)."""


class LanceLightningCLI(LightningCLI):
    """LightningCLI that redacts credentials, ends DDP runs cleanly and says how to resume."""

    def __init__(self, *args: Any, command: list[str] | None = None, **kwargs: Any) -> None:
        self._command = command
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The data module's policy defaults are None (built in __init__); show what runs instead.
        parser.set_defaults({f"data.{name}": {"class_path": path} for name, path in _POLICY_DEFAULTS.items()})

    def before_instantiate_classes(self) -> None:
        """A mixture given by ``class_path`` is checked here, so that its mistake is its own
        `ConfigError` naming the field inside it (``data.train.weights[0]``), not one line of a
        union error listing every type ``train`` may have."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        train = config.get("data.train")
        if not isinstance(train, Namespace) or not str(train.get("class_path", "")).endswith(".LanceMixture"):
            return
        arguments = train.get("init_args")
        try:
            LanceMixture(**(arguments.as_dict() if isinstance(arguments, Namespace) else dict(arguments or {})))
        except ConfigError as error:
            raise ConfigError(f"data.train.{error.param}", error.value, error.problem, error.fix) from None

    def before_fit(self) -> None:
        self._preflight()
        if self.config_init[self.subcommand].get("ckpt_path") is None:
            for callback in _model_checkpoints(self.trainer):
                _refuse_overwriting(callback)

    def before_validate(self) -> None:
        self._preflight()

    def before_test(self) -> None:
        self._preflight()

    def before_predict(self) -> None:
        self._preflight()

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse, then check ``--ckpt_path`` before Lightning itself loads the file (for its
        hyperparameters, before any hook of ours)."""
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:
            check_checkpoint_file(self.config[subcommand].get("ckpt_path"))

    def _preflight(self) -> None:
        """The output directories, checked before the trainer starts."""
        trainer = self.trainer
        check_writable(trainer.default_root_dir, "trainer.default_root_dir")
        for logger in trainer.loggers:
            check_writable(getattr(logger, "root_dir", None), "trainer.logger")
        for callback in _model_checkpoints(trainer):
            check_writable(callback.dirpath, "ModelCheckpoint.dirpath")

    def after_fit(self) -> None:
        trainer = self.trainer
        log_dir = trainer.log_dir  # a collective: every rank must call it
        callback = next(iter(_model_checkpoints(trainer)), None)
        if callback is not None and callback.save_last is True and not trainer.interrupted:
            last = callback.last_model_path or callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
            trainer.save_checkpoint(last)  # the final state: also a collective
            callback.last_model_path = last
        if not trainer.is_global_zero:
            return
        print(f"logs: {os.path.abspath(log_dir)}\ncheckpoints: {callback.dirpath if callback else None}")
        latest = callback.last_model_path or callback.best_model_path if callback is not None else ""
        if latest:
            print(f"resume with: {resume_command(self._command, latest)}")


#: What the data module builds for these arguments when they are None.
_POLICY_DEFAULTS = {
    "shuffle": "lance_lightning.NoShuffle",
    "filter_read": "lance_lightning.FilterRead",
    "bad_rows": "lance_lightning.produce.badrows.RaiseOnBadRow",
    "retry": "lance_lightning.RetryPolicy",
}


def resume_command(argv: list[str] | None, checkpoint: str) -> str:
    """The command line that continues the run of ``argv`` from ``checkpoint``, its credentials redacted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join(["lance-lightning", *redact_command(kept), "--ckpt_path", os.path.abspath(checkpoint)])


def _model_checkpoints(trainer: Any) -> list[ModelCheckpoint]:
    """The trainer's ``ModelCheckpoint``s (not other `Checkpoint`s, e.g. ``OnExceptionCheckpoint``)."""
    return [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]


def _refuse_overwriting(callback: ModelCheckpoint) -> None:
    if callback.dirpath is None or callback._enable_version_counter:
        return
    directory = Path(callback.dirpath)
    earlier = sorted(p.name for p in directory.glob("*.ckpt")) if directory.is_dir() else []
    if earlier:
        raise ConfigError(
            "ModelCheckpoint.dirpath",
            str(directory),
            f"holds checkpoints of an earlier run ({', '.join(earlier[:3])}{', ...' if len(earlier) > 3 else ''}) "
            "that this run would overwrite",
            "continue that run with --ckpt_path <its last.ckpt>, remove or move the directory to start over, or "
            "leave dirpath unset so every run writes to its own <log_dir>/version_N/checkpoints",
        )


def run(args: list[str] | None, description: str) -> None:
    """``lance-lightning fit|validate|test|predict ...`` (``args`` as after the program name)."""
    from lance_lightning.datamodule import LanceDataModule

    with exit_on_sigterm():
        LanceLightningCLI(
            datamodule_class=LanceDataModule,
            subclass_mode_model=True,
            parser_class=RedactingParser,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": description},
            args=args,
            command=args,
        )
