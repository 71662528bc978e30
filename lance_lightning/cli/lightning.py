"""The Trainer subcommands of ``lance-lightning`` (fit, validate, test, predict): LightningCLI, made safe.

Guarantees:
- ``config.yaml`` is written into the run's folder (the log directory) only: a run with no logger
  and no ``trainer.default_root_dir`` (a predict with ``logger: false``) writes none, never into
  the current directory.
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
  and the command that resumes the run, with every credential it gives redacted (pass those
  through the environment to resume). It runs as printed from the directory the fit was started
  in: the words that started the fit (``uv run [its options] lance-lightning`` when ``uv run``
  started it, found from the parent process's command line; else ``lance-lightning``, or the
  script's path or ``python -m lance_lightning.cli`` when ``lance-lightning`` is not on ``PATH``),
  the fit's arguments as given, and the checkpoint's path relative to that directory when it
  lies inside it (else absolute). The final checkpoint is written with ``weights_only`` set
  explicitly (the ``ModelCheckpoint``'s ``save_weights_only``), so Lightning logs nothing about it.
- A ``fit --ckpt_path`` that trains nothing because the checkpoint's run is complete (its
  ``max_epochs`` or ``max_steps`` is reached; Lightning's own decision, read after it restored
  the checkpoint) says so: which limit, the epochs and steps the run trained, and the command
  that trains on with a higher limit. It writes no checkpoint and leaves no new logger version
  folder (one the fit's loggers created is removed), exit status 0.
- A ``ModelCheckpoint`` with ``save_last`` holds the final state of a finished fit in its last
  checkpoint, even when ``every_n_train_steps`` does not divide the number of steps.
- A fit refuses (before training) to write into a checkpoint directory that holds an earlier
  run's checkpoints without a version counter, unless it resumes with ``--ckpt_path``.
- Every subcommand checks ``--ckpt_path`` and its output directories before the trainer starts
  (`lance_lightning.preflight`): a missing, damaged or edited checkpoint, or a directory it cannot
  write, is one `ConfigError` naming it.
- A subcommand that Lightning stops on SIGTERM exits with status 143, after the checkpoint that
  ``OnExceptionCheckpoint`` writes (`lance_lightning.lifetime.exit_on_sigterm`), on every rank; a
  fit that received SIGTERM where Lightning no longer stops (after its last step, e.g. during the
  replay probe's last step or another ``on_train_end`` hook) exits with status 143 too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from lance_lightning.cli.parser import OneScreenParser
from lance_lightning.errors import ConfigError
from lance_lightning.launch import launched_with, shown_path
from lance_lightning.lifetime import SIGTERM_EXIT_STATUS, exit_on_sigterm
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
        self._log_folders = {root: _entries(root) for root in _logger_roots(self.trainer)}
        self._train_started = _TrainStarted()
        self.trainer.callbacks.append(self._train_started)  # type: ignore[attr-defined]  # set by Lightning's connector

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
        if trainer.ckpt_path and not self._train_started.started and not trainer.interrupted:
            self._nothing_trained(str(trainer.ckpt_path))
        else:
            callback = next(iter(_model_checkpoints(trainer)), None)
            if callback is not None and callback.save_last is True and not trainer.interrupted:
                last = callback.last_model_path or callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
                # the final state (a collective); its kind set, so that Lightning does not log the default
                trainer.save_checkpoint(last, weights_only=callback.save_weights_only)
                callback.last_model_path = last
            if trainer.is_global_zero:
                logs = os.path.abspath(log_dir) if log_dir is not None else None  # (SaveConfigCallback needs one)
                print(f"logs: {logs}\ncheckpoints: {callback.dirpath if callback else None}")
                latest = callback.last_model_path or callback.best_model_path if callback is not None else ""
                if latest:
                    print(f"resume with: {resume_command(self._command, latest)}")
        if trainer.received_sigterm:  # after Lightning's last check (the last step, on_train_end hooks)
            raise SystemExit(SIGTERM_EXIT_STATUS)

    def _nothing_trained(self, checkpoint: str) -> None:
        """The fit resumed a complete run and trained nothing: say so (rank 0), write nothing, remove
        the logger version folders this fit created."""
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        for root, before in self._log_folders.items():
            _remove_new_log_folder(root, before, trainer)
        loop = trainer.fit_loop
        # Lightning types `_Progress.current` as the base tracker; the fit loop's epoch tracker counts ``processed``.
        epochs, steps = loop.epoch_progress.current.processed, trainer.global_step  # type: ignore[attr-defined]
        reached, raised = [], []
        if loop.max_steps != -1 and steps >= loop.max_steps:
            per_epoch = trainer.num_training_batches
            more = per_epoch if isinstance(per_epoch, int) and per_epoch > 0 else loop.max_steps
            reached.append(f"max_steps={loop.max_steps}")
            raised.append(f"--trainer.max_steps={loop.max_steps + more}")
        if loop.max_epochs not in (None, -1) and epochs >= loop.max_epochs:
            reached.append(f"max_epochs={loop.max_epochs}")
            raised.append(f"--trainer.max_epochs={epochs + 1}")
        if not reached and trainer.limit_train_batches == 0:
            reached.append("limit_train_batches=0")
        shown = shown_path(checkpoint)
        if raised:
            why = " and ".join(reached)
            done = f"the run in {shown} is complete: it trained {steps} step(s) in {epochs} epoch(s), and {why} "
            done += "is reached" if len(reached) == 1 else "are reached"
        else:
            done = f"the fit resumed from {shown} trained no step ({', '.join(reached) or 'stopped before its first'})"
        print(f"nothing to train: {done}. No checkpoint or log was written.")
        if raised:
            command = resume_command(self._command, checkpoint, extra=raised)
            print(f"to train on, raise the limit, e.g.: {command}")


#: What the data module builds for these arguments when they are None.
_POLICY_DEFAULTS = {
    "shuffle": "lance_lightning.NoShuffle",
    "filter_read": "lance_lightning.FilterRead",
    "bad_rows": "lance_lightning.produce.badrows.RaiseOnBadRow",
    "retry": "lance_lightning.RetryPolicy",
}


def resume_command(argv: list[str] | None, checkpoint: str, extra: list[str] | None = None) -> str:
    """The command line that continues the run of ``argv`` (``extra`` arguments added) from
    ``checkpoint``, its credentials redacted, to run from the current directory (see the module docstring)."""
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
    program = launched_with(sys.argv[1:] if argv == sys.argv[1:] else None)
    words = [*redact_command(program), *redact_command(kept), *(extra or []), "--ckpt_path", shown_path(checkpoint)]
    return shlex.join(words)


class RunFolderConfig(SaveConfigCallback):
    """Lightning's ``config.yaml`` in the run's folder, and nowhere else: a run with no logger and no
    ``trainer.default_root_dir`` has no folder of its own (Lightning's would be the current
    directory), so nothing is written."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.logger is None and self.config.get("trainer.default_root_dir") is None:
            self.already_saved = True
        super().setup(trainer, pl_module, stage)


class _TrainStarted(Callback):
    """Whether the fit started training (Lightning skips it when a restored run's limits are reached)."""

    def __init__(self) -> None:
        self.started = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.started = True


def _logger_roots(trainer: Any) -> list[str]:
    """The folders in which the trainer's loggers make their version folders."""
    roots = [getattr(logger, "root_dir", None) for logger in trainer.loggers]
    return [str(root) for root in roots if root and "://" not in str(root)]


def _entries(folder: str) -> set[str] | None:
    """The names in ``folder``, or None when it does not exist."""
    return set(os.listdir(folder)) if os.path.isdir(folder) else None


def _remove_new_log_folder(root: str, before: set[str] | None, trainer: Any) -> None:
    """Remove what the fit's loggers made under ``root``: ``root`` itself when it did not exist
    before the fit, else the loggers' version folders that did not."""
    if before is None:
        shutil.rmtree(root, ignore_errors=True)
        return
    for logger in trainer.loggers:
        log_dir = getattr(logger, "log_dir", None)
        if log_dir and os.path.dirname(os.path.abspath(log_dir)) == os.path.abspath(root):
            if os.path.basename(log_dir) not in before:
                shutil.rmtree(log_dir, ignore_errors=True)


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
            save_config_callback=RunFolderConfig,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": description, "prog": "lance-lightning"},
            args=args,
            command=args,
        )
