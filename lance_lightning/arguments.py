"""The data module's constructor arguments: checked before anything is built, and turned into
each split's planning settings.

Guarantees:
- `check_arguments` raises `ConfigError` naming the parameter, its value and a fix for the first
  argument of `LanceDataModule` that cannot work (a count out of range, a transform that is not
  callable, a source of the wrong type, a worker start method that is not fork-safe, a
  setting a mixture does not support), in the order the parameters are listed; it builds,
  plans and opens nothing. `check_fill_nulls` refuses null fills for columns no split reads.
- `split_settings` is how each split is planned besides its source: the train split by
  ``shuffle``, ``batch_size`` and ``drop_last``; the others in storage order, by
  ``eval_batch_size``, never dropping (predict not padded either).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError
from lance_lightning.load.loader import check_start_method
from lance_lightning.materialize.view import MaterializedView
from lance_lightning.media.samplers import ClipSampler
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.plan.packing import TokenPacking
from lance_lightning.plan.strategies import FilterRead, NoShuffle, ShuffleStrategy
from lance_lightning.produce.badrows import BadRowPolicy, RaiseOnBadRow, check_packed_policy
from lance_lightning.source import LanceSource
from lance_lightning.vocabulary import Split

#: The data module's count arguments and their least values.
_AT_LEAST = {
    "batch_size": 1,
    "eval_batch_size": 1,
    "prefetch_groups": 1,
    "prefetch_batches": 1,
    "take_group_bytes": 1,
    "prefetch_factor": 1,
    "num_workers": 0,
    "device_ahead": 0,
    "reader_threads": 0,
}


def check_arguments(sources: Mapping[Split, Any], arguments: Mapping[str, Any]) -> None:
    """Raise `ConfigError` for the first of the data module's ``arguments`` (by name) that cannot
    work (see the module docstring); ``sources``: each split's source."""
    for name, minimum in _AT_LEAST.items():
        value = arguments[name] if name != "eval_batch_size" else arguments[name] or 1  # None: batch_size's
        check_int(name, value, minimum, f"set `{name}` to {minimum} or more")
    for name in ("transform", "device_transform"):
        value = arguments[name]
        if value is not None and not callable(value):
            raise ConfigError(
                name,
                value,
                "is not callable",
                "pass a callable batch -> batch, e.g. lance_lightning.transforms.DecodeImage(...), or None",
            )
    bad_rows, pin_memory = arguments["bad_rows"], arguments["pin_memory"]
    if bad_rows is not None and not isinstance(bad_rows, BadRowPolicy):
        raise ConfigError(
            "bad_rows",
            bad_rows,
            "is not a bad-row policy",
            "pass lance_lightning.produce.badrows.RaiseOnBadRow() or ReplaceBadRow(seed=0)",
        )
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise ConfigError("pin_memory", pin_memory, "must be true, false or null (auto)", "set pin_memory: null")
    for split, source in sources.items():
        if source is not None and not isinstance(
            source, (LanceSource, LanceMixture) if split == "train" else LanceSource
        ):
            raise ConfigError(split, source, "is not a LanceSource", "pass LanceSource(uri=...) or a mapping in YAML")
    check_start_method(arguments["multiprocessing_context"], arguments["num_workers"])
    if isinstance(sources.get("train"), LanceMixture):
        _check_mixture_settings(arguments["materialize"], bad_rows)


def _check_mixture_settings(materialize: MaterializedView | None, bad_rows: BadRowPolicy | None) -> None:
    """Refuse data module settings a mixture does not support (yet)."""
    if materialize is not None:
        raise ConfigError("materialize", materialize, "a mixture's sources are read in place", "drop `materialize`")
    if bad_rows is not None and type(bad_rows) is not RaiseOnBadRow:
        raise ConfigError(
            "bad_rows", bad_rows, "a mixture cannot replace bad rows yet", "use RaiseOnBadRow (the default)"
        )


def split_settings(
    split: str,
    shuffle: ShuffleStrategy,
    filter_read: FilterRead,
    batch_size: int,
    eval_batch_size: int,
    drop_last: bool,
    packing: TokenPacking | None,
    clips: ClipSampler | None = None,
) -> SplitSettings:
    """How ``split`` is planned besides its source (see the module docstring)."""
    if split == "train":
        return SplitSettings(shuffle, filter_read, batch_size, drop_last, packing=packing, clips=clips)
    # predict runs no collective per step: its ranks may end a batch apart, so it is not padded
    pad = split != "predict"
    return SplitSettings(NoShuffle(), filter_read, eval_batch_size, False, pad=pad, packing=packing, clips=clips)


def check_units(bad_rows: BadRowPolicy, packing: TokenPacking | None, clips: Any) -> ClipSampler | None:
    """``clips`` when it is a clip sampler (or ``None``); `ConfigError` otherwise, with packing, or
    for `ReplaceBadRow` with packing (`check_packed_policy`)."""
    check_packed_policy(bad_rows, packing)
    if clips is not None and not isinstance(clips, ClipSampler):
        raise ConfigError(
            "clips", clips, "is not a clip sampler", "pass lance_lightning.VideoClips(...) or AudioClips(...)"
        )
    if clips is not None and packing is not None:
        raise ConfigError("clips", clips, "cannot be combined with packing (a unit is a clip or a window)", "set one")
    return clips


def check_fill_nulls(fill_nulls: Mapping[str, Any], plans: Mapping[Split, Plan]) -> None:
    """Raise `ConfigError` when ``fill_nulls`` names a column that none of ``plans`` reads."""
    columns = {c for plan in plans.values() for c in plan.source.columns}
    unknown = sorted(set(fill_nulls) - columns)
    if unknown and plans:
        raise ConfigError(
            "fill_nulls",
            fill_nulls,
            f"column(s) {unknown} are not read by any split",
            f"name only read columns: {sorted(columns)}",
        )
