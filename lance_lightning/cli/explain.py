"""``lance-lightning explain``: the plan of each split of a training config, without training.

Usage::

    lance-lightning explain --config configs/quickstart.yaml [--split train] [--world_size 8]

Guarantees:
- Reads the same YAML as ``lance-lightning fit``: ``data:`` builds the `LanceDataModule` exactly
  as LightningCLI would (same types, same overrides on the command line); ``trainer``, ``model``,
  ``optimizer``, ``lr_scheduler``, ``seed_everything`` and ``ckpt_path`` are accepted and ignored
  (no model is built, no accelerator touched, nothing written).
- Prints `LanceDataModule.explain` for ``--split`` (every configured split when not given), in
  train, val, test, predict order: the version pinned (and the tag or time that named it), rows,
  selectivity, strategy, the read and batches per rank, as ``fit`` prints it before training.
- The ranks planned for are ``--world_size``, else the config's ``trainer.devices`` times
  ``trainer.num_nodes`` where both are integers, else 1.
- A `ConfigError` ends the command as it ends ``fit`` (a few lines, exit status 1); a parser error
  is exit status 2.
"""

from __future__ import annotations

from typing import Any

from lance_lightning.cli.profile import build_parser
from lance_lightning.errors import ConfigError
from lance_lightning.vocabulary import SPLITS


def main(args: list[str]) -> int:
    """``lance-lightning explain ...``; returns the exit status."""
    from typing import Optional

    from lance_lightning.vocabulary import Split

    parser = build_parser(
        data_options=not {"-h", "--help"} & set(args),
        prog="lance-lightning explain",
        description="Print the plan of each split of a fit config (version, rows, strategy, batches per rank).",
        profile_options=False,
    )
    parser.add_argument("--split", type=Optional[Split], default=None, help="one split (default: every one)")
    parser.add_argument("--world_size", type=Optional[int], default=None, help="ranks to plan for")
    cfg = parser.parse_args(args)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    datamodule = instantiate(cfg).data
    configured = [split for split in SPLITS if datamodule.sources.get(split) is not None]
    if cfg.split is not None and cfg.split not in configured:
        raise ConfigError(
            "split", cfg.split, "that split is not configured", f"configure `data.{cfg.split}` or pick {configured}"
        )
    world_size = cfg.world_size or _config_world_size(cfg.trainer)
    if world_size < 1:
        raise ConfigError("world_size", world_size, "needs at least one rank", "give --world_size 1 or more")
    for split in [cfg.split] if cfg.split else configured:
        print(datamodule.explain(split, world_size), flush=True)
    return 0


def _config_world_size(trainer: dict[str, Any] | None) -> int:
    devices, nodes = (trainer or {}).get("devices"), (trainer or {}).get("num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) and devices > 0 else 1
