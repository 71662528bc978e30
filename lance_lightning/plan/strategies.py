"""Shuffle strategies and the filter read policy, chosen in YAML by ``class_path``.

Guarantees:
- Each strategy is a small typed class whose arguments are validated in ``__init__``
  (a `ConfigError` names the argument, the value and the fix).
- ``describe()`` returns plain types only; it feeds plan identities and checkpointed cursors.
- A strategy only shapes the epoch order (see `lance_lightning.plan.order`); it never does I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from lance_lightning.checks import check_choice, check_int
from lance_lightning.errors import ConfigError


def _positive(name: str, value: int) -> int:
    return check_int(name, value, 1, f"set `{name}` to 1 or more", problem="must be a positive integer")


def _seed(value: int) -> int:
    return check_int("seed", value, 0, "set `seed` to e.g. 0", problem="must be a non-negative integer")


class ShuffleStrategy:
    """Base class. The epoch order is built from *units*: contiguous runs of matching rows.

    Units are permuted per epoch when ``permute_units`` is set; rows inside a unit stay in storage
    order unless ``shuffle_within_unit`` is set; ``window_rows`` adds a windowed row shuffle on top.
    ``reads_by_take`` says the order scatters rows so widely that they are read with ``take``,
    whatever the filter (the planner asks the strategy; no module checks its class).
    """

    seed: int = 0
    permute_units: bool = False
    shuffle_within_unit: bool = False
    window_rows: int | None = None
    reads_by_take: bool = False

    def unit_rows(self, matched_rows: int) -> int:
        raise NotImplementedError

    def take_reason(self, filtered: bool) -> str:
        """Why a ``reads_by_take`` strategy reads with take (shown in the plan's summary)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"strategy": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.describe().items() if k != "strategy")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShuffleStrategy) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.describe().items())))


class NoShuffle(ShuffleStrategy):
    """Storage order, every epoch. Reads are sequential scans."""

    def __init__(self) -> None:
        self.seed = 0

    def unit_rows(self, matched_rows: int) -> int:
        return max(1, matched_rows)


class ShardShuffle(ShuffleStrategy):
    """Shards of ``shard_rows`` contiguous rows, read in a new shuffled order every epoch.

    Shard size is independent of Lance fragment size: shards are offset/limit ranges. Rows inside a
    shard come in storage order unless ``shuffle_within_shard`` is set. Reads run at scan speed.
    Batches are not mixed: with shards of a multiple of the batch size every batch comes from one
    shard (on label-sorted data, the per-batch label entropy of storage order: 0.145 of a perfect
    shuffle's, benchmarks/results/shuffle_quality.md). A short last shard comes at the end of each
    epoch, and shard boundaries move by a per-epoch offset (see `lance_lightning.plan.order`). Use
    `BufferShuffle` or `RowShuffle` when batches must mix.

    Args:
        shard_rows: Rows per shard. The default 8192 reads at scan speed; smaller shards reorder
            the epoch at a finer grain (batches still come from one shard each) but cost more per
            row (1024-row shards read at 0.6–1.2 of a raw scan, benchmarks/README.md).
        seed: Base seed; the order depends on (seed, epoch) only.
        shuffle_within_shard: Also permute rows inside each shard.
    """

    def __init__(self, shard_rows: int = 8192, seed: int = 0, shuffle_within_shard: bool = False) -> None:
        self.shard_rows = _positive("shard_rows", shard_rows)
        self.seed = _seed(seed)
        self.shuffle_within_shard = bool(shuffle_within_shard)
        self.permute_units = True
        self.shuffle_within_unit = self.shuffle_within_shard

    def unit_rows(self, matched_rows: int) -> int:
        return self.shard_rows

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": "ShardShuffle",
            "shard_rows": self.shard_rows,
            "seed": self.seed,
            "shuffle_within_shard": self.shuffle_within_shard,
        }


class RowShuffle(ShuffleStrategy):
    """A global permutation of the (filtered) rows every epoch, read with ``take``.

    Args:
        seed: Base seed; the order depends on (seed, epoch) only.
        clump_rows: Permute contiguous clumps of this many rows instead of single rows. Clumps of
            64 read several times faster than single rows but mix less: on label-sorted data a
            batch of 256 holds 5 clumps (0.35 of a perfect shuffle's label entropy; clumps of 8:
            0.74). Clumps suit data whose storage order is already random.
    """

    reads_by_take = True

    def __init__(self, seed: int = 0, clump_rows: int = 1) -> None:
        self.seed = _seed(seed)
        self.clump_rows = _positive("clump_rows", clump_rows)
        self.permute_units = True

    def unit_rows(self, matched_rows: int) -> int:
        return self.clump_rows

    def take_reason(self, filtered: bool) -> str:
        if filtered:
            return "a row shuffle takes the permuted matching rows"
        return f"a row shuffle reads permuted clumps of {self.clump_rows} row(s)"

    def describe(self) -> dict[str, Any]:
        return {"strategy": "RowShuffle", "seed": self.seed, "clump_rows": self.clump_rows}


#: `BufferShuffle`'s shard size when the buffer holds at least 4 such shards.
DEFAULT_BUFFER_SHARD_ROWS = 1024


class BufferShuffle(ShuffleStrategy):
    """Shuffled shard order plus a shuffle buffer of ``buffer_rows`` rows.

    Consecutive windows of ``buffer_rows`` rows of the shard-shuffled order are permuted. Each
    window is read with range scans by a background thread while the previous one is being
    trained on, so shuffling overlaps the step (as in Petastorm's asynchronous shuffling).
    Memory is bounded by two windows per reader.

    Args:
        buffer_rows: Rows mixed together; larger mixes more shards, costs memory.
        seed: Base seed; the order depends on (seed, epoch) only.
        shard_rows: Rows per shard feeding the buffer, at most ``buffer_rows``. Default:
            ``min(1024, buffer_rows // 4)``, so that the buffer mixes at least 4 shards.
    """

    def __init__(self, buffer_rows: int = 16384, seed: int = 0, shard_rows: int | None = None) -> None:
        self.buffer_rows = _positive("buffer_rows", buffer_rows)
        self.seed = _seed(seed)
        if shard_rows is None:
            shard_rows = min(DEFAULT_BUFFER_SHARD_ROWS, max(1, self.buffer_rows // 4))
        self.shard_rows = _positive("shard_rows", shard_rows)
        if self.shard_rows > self.buffer_rows:
            raise ConfigError(
                "shard_rows",
                shard_rows,
                f"is larger than buffer_rows={buffer_rows}, so the buffer mixes nothing",
                f"set `shard_rows` to at most `buffer_rows` ({buffer_rows}); "
                f"{max(1, self.buffer_rows // 4)} or less mixes at least 4 shards, or omit it",
            )
        self.permute_units = True
        self.window_rows = self.buffer_rows

    def unit_rows(self, matched_rows: int) -> int:
        return self.shard_rows

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": "BufferShuffle",
            "buffer_rows": self.buffer_rows,
            "seed": self.seed,
            "shard_rows": self.shard_rows,
        }


class FilterRead:
    """How a filtered split is read: scan with the filter, or take the matching rows.

    Args:
        method: ``"auto"`` picks by selectivity, ``"scan"`` or ``"take"`` force one.
        take_below: With ``auto``, take when fewer than this fraction of rows match. A random take
            costs about 30 scanned rows, so below a few percent taking is cheaper.
    """

    def __init__(self, method: Literal["auto", "scan", "take"] = "auto", take_below: float = 0.05) -> None:
        check_choice(
            "method", method, ("auto", "scan", "take"), "unknown filter read method", 'use "auto", "scan" or "take"'
        )
        if isinstance(take_below, bool) or not isinstance(take_below, (int, float)) or not 0.0 <= take_below <= 1.0:
            raise ConfigError("take_below", take_below, "must be a fraction in [0, 1]", "e.g. take_below=0.05")
        self.method = method
        self.take_below = float(take_below)

    def describe(self) -> dict[str, Any]:
        return {"method": self.method, "take_below": self.take_below}

    def __repr__(self) -> str:
        return "FilterRead(" + ", ".join(f"{k}={v!r}" for k, v in self.describe().items()) + ")"

    def choose(self, selectivity: float) -> Literal["scan", "take"]:
        if self.method != "auto":
            return self.method
        return "take" if selectivity < self.take_below else "scan"
