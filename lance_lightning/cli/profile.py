"""``lance-lightning profile``: run only the data pipeline of a training config and report on it.

Usage::

    lance-lightning profile --config configs/quickstart.yaml [--batches 200] [--split train]
                            [--data.num_workers 2 ...]

Guarantees:
- Reads the same YAML as ``lance-lightning fit``: ``data:`` builds the `LanceDataModule` exactly
  as LightningCLI would (same types, same overrides on the command line); ``trainer``, ``model``,
  ``optimizer``, ``lr_scheduler``, ``seed_everything`` and ``ckpt_path`` are accepted and ignored,
  so no model is built and no accelerator is touched.
- Iterates ``--batches`` batches of one split as one rank (rank 0 of 1; epochs follow each other
  as in training), with a progress bar on stderr, then prints the loader-only report
  (`lance_lightning.metrics.report`) on stdout: the bottleneck among storage, decode, convert and workers,
  the numbers, and the first thing to change.
- Worker processes it started are shut down before it returns.
- ``--help`` lists the profiler's own options and imports no Lightning; the data module's
  options are those of ``lance-lightning fit --help``.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import STAGE_OF_SPLIT

#: Top-level keys of LightningCLI configs that the profiler accepts and ignores.
_IGNORED_DICTS = ("trainer", "model", "optimizer", "lr_scheduler")
_IGNORED_VALUES = ("seed_everything", "ckpt_path")


def build_parser(data_options: bool = True) -> Any:
    """The profile parser; without ``data_options`` ``data:`` is one mapping (no Lightning import)."""
    from typing import Optional

    from jsonargparse import ActionConfigFile, ArgumentParser

    from lance_lightning.cli.parser import OneScreenParser
    from lance_lightning.vocabulary import Split

    class ProfileParser(OneScreenParser, ArgumentParser):
        """Redacted dumps, one-screen errors."""

    parser = ProfileParser(
        prog="lance-lightning profile",
        description="Run only the data pipeline of a training config for N batches and report what limits it.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a lance-lightning fit config (YAML)")
    parser.add_argument("--batches", type=int, default=200, help="batches to read (epochs follow each other)")
    parser.add_argument("--split", type=Split, default="train", help="which split's loader to run")
    parser.add_argument("--progress", type=bool, default=True, help="show a progress bar on stderr")
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
    for key in _IGNORED_DICTS:
        parser.add_argument(f"--{key}", type=Optional[dict], default=None, help="ignored (no model is run)")
    for key in _IGNORED_VALUES:
        parser.add_argument(f"--{key}", type=Optional[Any], default=None, help="ignored (no model is run)")
    return parser


def run_profile(
    datamodule: Any, split: str = "train", batches: int = 200, *, progress: bool = True, out: TextIO | None = None
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
    try:
        datamodule = instantiate(cfg).data
        run_profile(datamodule, cfg.split, cfg.batches, progress=cfg.progress)
    except ConfigError as error:
        print(f"lance-lightning profile: error: {error}", file=sys.stderr)
        return 2
    return 0


def _shutdown_workers(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
