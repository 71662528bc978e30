"""``lance-lightning profile``: run only the data pipeline of a training config and report on it.

Usage::

    lance-lightning profile --config configs/quickstart.yaml [--batches 200] [--split train]
                            [--data.num_workers 2 ...] [--replay 8 [--replay_steps 20]]

Guarantees:
- Reads the same YAML as ``lance-lightning fit``: ``data:`` builds the `LanceDataModule` exactly
  as LightningCLI would (same types, same overrides on the command line). Without ``--replay``,
  ``trainer``, ``model``, ``optimizer``, ``lr_scheduler``, ``seed_everything`` and ``ckpt_path``
  are accepted and ignored, so no model is built and no accelerator is touched.
- Iterates ``--batches`` batches of one split as one rank (rank 0 of 1; epochs follow each other
  as in training), with a progress bar on stderr, then prints the loader-only report
  (`lance_lightning.metrics.report`) on stdout: the bottleneck among storage, decode, convert, other
  and workers, the numbers, and the first thing to change.
- With ``--replay N`` it also builds the model (and optimizer) from the config, as
  ``lance-lightning fit`` would, and fits it for ``--batches`` steps of the train split on one
  device with a `DataLoadingMonitor(replay_batches=N)` (`lance_lightning.callbacks.replay`):
  no validation, no logger, no checkpoints (the config's checkpoint callbacks and monitor are
  left out, its other callbacks kept; ``ckpt_path`` is ignored), nothing written outside a
  temporary directory. Then it prints
  the data loading report with the compute floor: the step with data for free, the real step
  cycle split into compute, the rest of the step and the wait by loader part, and the speed-up.
  A ``--replay`` or ``--replay_steps`` that is not an integer >= 1, a ``--replay`` above
  ``--batches`` or another split is a `ConfigError` before anything is built.
- A `ConfigError` ends the command as it ends ``lance-lightning fit`` (`lance_lightning.cli.main`):
  a few lines (what, the parameter, the value, the fix), exit status 1; a parser error is exit
  status 2. A ``--replay`` fit stopped by SIGTERM (during the fit or the replay) exits with
  status 143, as ``fit`` does.
- Worker processes it started are shut down before it returns.
- ``--help`` lists the profiler's own options and imports no Lightning; the data module's
  options are those of ``lance-lightning fit --help``.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import STAGE_OF_SPLIT, Split

#: Top-level keys of LightningCLI configs that the profiler accepts and ignores.
_IGNORED_DICTS = ("trainer", "model", "optimizer", "lr_scheduler")
_IGNORED_VALUES = ("seed_everything", "ckpt_path")
_IGNORED_HELP = "ignored without --replay (no model is run); with it, as in `lance-lightning fit`"


def build_parser(
    data_options: bool = True,
    *,
    prog: str = "lance-lightning profile",
    description: str = "Run only the data pipeline of a training config for N batches and report what limits "
    "it. With --replay, fit the config's model for N steps instead and add the compute floor to the report.",
    profile_options: bool = True,
) -> Any:
    """The parser of a command that reads a fit config's ``data:`` and ignores its other keys (``profile``,
    ``explain``); without ``data_options`` ``data:`` is one mapping (no Lightning import); without
    ``profile_options`` it has only ``--config`` and the config's keys."""
    from typing import Optional

    from jsonargparse import ActionConfigFile, ArgumentParser

    from lance_lightning.cli.parser import OneScreenParser
    from lance_lightning.vocabulary import Split

    class ProfileParser(OneScreenParser, ArgumentParser):
        """Redacted dumps, one-screen errors."""

    parser = ProfileParser(prog=prog, description=description)
    parser.add_argument("--config", action=ActionConfigFile, help="a lance-lightning fit config (YAML)")
    if profile_options:
        parser.add_argument("--batches", type=int, default=200, help="batches to read (epochs follow each other)")
        parser.add_argument("--split", type=Split, default="train", help="which split's loader to run")
        parser.add_argument("--progress", type=bool, default=True, help="show a progress bar on stderr")
        parser.add_argument(
            "--replay",
            type=Optional[Any],
            default=None,
            help="also build the model and fit --batches steps, then replay this many cached batches: "
            "report the compute floor (the step with data for free)",
        )
        parser.add_argument(
            "--replay_steps",
            type=Optional[Any],
            default=None,
            help="steps to replay (with --replay; default: DataLoadingMonitor's replay_steps, 20)",
        )
    if data_options:
        from lance_lightning.datamodule import LanceDataModule

        parser.add_class_arguments(LanceDataModule, "data")
    else:
        parser.add_argument(
            "--data",
            type=Optional[dict],
            default=None,
            help="the LanceDataModule's arguments, as under `data:` of a fit config; "
            "`lance-lightning fit --help` lists them",
        )
    ignored = _IGNORED_HELP if profile_options else "ignored: no model is built"
    for key in _IGNORED_DICTS:
        parser.add_argument(f"--{key}", type=Optional[dict], default=None, help=ignored)
    for key in _IGNORED_VALUES:
        parser.add_argument(f"--{key}", type=Optional[Any], default=None, help=ignored)
    return parser


def run_profile(
    datamodule: Any, split: Split = "train", batches: int = 200, *, progress: bool = True, out: TextIO | None = None
) -> str:
    """Read ``batches`` batches of ``split`` from ``datamodule``; return (and print) the report."""
    from tqdm.auto import tqdm

    from lance_lightning.metrics.report import loader_report

    check_int("batches", batches, 1, "pass e.g. `--batches 200`")
    if datamodule.sources.get(split) is None:
        raise ConfigError(
            split,
            None,
            f"the config has no {split} split to profile",
            f"set `data.{split}` or pass `--split` with a configured split",
        )
    datamodule.setup(STAGE_OF_SPLIT[split])
    loader = getattr(datamodule, f"{split}_dataloader")()
    start = loader.metrics_snapshot()
    bar = tqdm(
        total=batches,
        unit="batch",
        desc=f"profiling {split}",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    done = 0
    try:
        while done < batches:
            before = done
            for _ in loader:
                done += 1
                bar.update(1)
                if done >= batches:
                    break
            if done == before:
                break  # an empty loader
    finally:
        bar.close()
        _shutdown_workers(loader)
    config = loader.describe()
    title = (
        f"Loader-only profile of the {split} split ({config['num_workers']} workers, "
        f"{config['reader_threads']} reader threads, batch_size {config['batch_size']})"
    )
    text = loader_report(loader, start, loader_only=True, title=title)
    print(text, file=out or sys.stdout, flush=True)
    return text


def main(args: list[str]) -> int:
    """``lance-lightning profile ...``; returns the exit status."""
    # --help needs no data module: listing its options would import Lightning (seconds).
    parser = build_parser(data_options=not {"-h", "--help"} & set(args))
    cfg = parser.parse_args(args)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    # A ConfigError reaches `lance_lightning.cli.main`, which prints it as for `fit` (exit status 1).
    if cfg.replay is not None:
        from lance_lightning.lifetime import exit_on_sigterm

        with exit_on_sigterm():
            run_fit_profile(
                _without_own_options(args), cfg.replay, cfg.replay_steps, cfg.batches, cfg.split, cfg.progress
            )
    else:
        run_profile(instantiate(cfg).data, cfg.split, cfg.batches, progress=cfg.progress)
    return 0


def run_fit_profile(
    args: list[str],
    replay: Any,
    replay_steps: Any = None,
    batches: int = 200,
    split: str = "train",
    progress: bool = True,
    *,
    out: TextIO | None = None,
) -> str:
    """Fit the model of the config ``args`` (``lance-lightning fit`` arguments) for ``batches`` steps,
    replay ``replay`` cached batches for ``replay_steps`` steps (None: the monitor's default); return
    (and print) the report."""
    check_int("replay", replay, 1, "pass the number of training batches to cache and replay, e.g. `--replay 8`")
    check_int("replay_steps", replay_steps, 1, "pass the number of steps to replay, e.g. 20", optional=True)
    check_int("batches", batches, 1, "pass e.g. `--batches 50`: the training steps of the fit")
    if replay > batches:
        raise ConfigError(
            "replay",
            replay,
            f"caches more batches than the fit trains (`--batches` {batches})",
            "pass `--replay` <= `--batches`",
        )
    if split != "train":
        raise ConfigError(
            "split",
            split,
            "`--replay` replays training steps: it profiles the train split",
            "drop `--split` or `--replay`",
        )
    import tempfile

    from lance_lightning.callbacks.monitor import DataLoadingMonitor

    steps = {} if replay_steps is None else {"replay_steps": replay_steps}
    monitor = DataLoadingMonitor(report=False, replay_batches=replay, **steps)
    with tempfile.TemporaryDirectory(prefix="lance-lightning-profile-") as root:
        trainer_overrides = {
            "max_steps": batches,
            "max_epochs": -1,
            "max_time": None,
            "devices": 1,
            "num_nodes": 1,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "val_check_interval": 1.0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_model_summary": False,
            "enable_progress_bar": progress,
            "default_root_dir": root,
        }
        cli = _fit_profile_cli(args, monitor, trainer_overrides)
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        finally:
            _shutdown_workers(cli.trainer.train_dataloader)
    header = f"Fit profile of the train split with the model: {batches} training steps, then the replay probe"
    text = header + "\n" + monitor.report()
    print(text, file=out or sys.stdout, flush=True)
    return text


def _fit_profile_cli(args: list[str], monitor: Any, trainer_overrides: dict[str, Any]) -> Any:
    """LightningCLI (``run=False``) building the config's model, data and a trainer with the overrides."""
    from typing import Optional

    from lightning.pytorch.callbacks import Checkpoint

    from lance_lightning.callbacks.monitor import DataLoadingMonitor
    from lance_lightning.cli.lightning import LanceLightningCLI, RedactingParser
    from lance_lightning.datamodule import LanceDataModule

    class FitProfileCLI(LanceLightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            super().add_arguments_to_parser(parser)
            parser.add_argument("--ckpt_path", type=Optional[str], default=None, help="ignored by profile")

        def instantiate_trainer(self, **kwargs: Any) -> Any:
            configured = self.config_init.get("trainer.callbacks") or []
            configured = configured if isinstance(configured, list) else [configured]
            kept = [c for c in configured if not isinstance(c, (Checkpoint, DataLoadingMonitor))]
            return super().instantiate_trainer(**kwargs, **trainer_overrides, callbacks=[*kept, monitor])

    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it sees both argv and args
    try:
        return FitProfileCLI(
            datamodule_class=LanceDataModule,
            subclass_mode_model=True,
            parser_class=RedactingParser,
            save_config_callback=None,
            args=args,
            run=False,
            command=args,
        )
    finally:
        sys.argv = argv


def _without_own_options(args: list[str]) -> list[str]:
    """``args`` without the profiler's own options (what ``lance-lightning fit`` would accept)."""
    own = ("--batches", "--split", "--progress", "--replay", "--replay_steps")
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in own:
            skip = True
        elif not arg.startswith(tuple(f"{name}=" for name in own)):
            kept.append(arg)
    return kept


def _shutdown_workers(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
