"""Read planning, pure: from a surveyed source, a filter and a strategy to a `ReadPlan`.

Guarantees:
- No I/O: `plan_reads` only combines a `Survey` (`lance_lightning.plan.survey` does the setup I/O)
  with the strategy, the filter policy and the batch settings.
- A filter is evaluated once, at setup, in one streaming scan (the filter projected over the
  columns it reads; a scalar index answers it on large tables), into a compact row set
  (`lance_lightning.plan.rowset`: runs of ranges or a bitmap with rank/select, whichever is
  smaller; no array of positions). Every rank and worker then shards the same exact row set, so
  batch counts are equal by construction.
- One plan per process and O(1) orders: the epoch order is a keyed bijection computed per batch
  (`lance_lightning.plan.order`), so neither ``explain`` nor a reader nor a worker builds
  anything of the dataset's size; workers receive the row set inside the pickled plan (in shared
  memory: `lance_lightning.load.shared`).
- The read method follows the table in the docs: scans for storage-ordered, shard and buffer
  plans; ``take`` for row shuffles and for filters that match less than ``take_below`` of rows.
- A `ReadPlan` is picklable and holds plain data (and the row set's few arrays): it is what
  DataLoader workers receive. It answers the `Plan` contract (`lance_lightning.plan.contract`)
  with its own values, no placeholder; ``matches``, ``documents`` and ``row_positions`` are its
  own (one source's rows), read by the stages that check the kind.
- `plan_reads` is called by the planning entry only (`lance_lightning.plan.split.plan_split`).
- ``explain`` says in words which plan was chosen and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lance_lightning.errors import ConfigError
from lance_lightning.plan.clips import ClipUnits
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.order import EpochOrder
from lance_lightning.plan.packing import DocumentIndex
from lance_lightning.plan.rowset import RowSet, select_runs
from lance_lightning.plan.strategies import FilterRead, ShuffleStrategy
from lance_lightning.source import PinnedSource

ReadMethod = Literal["scan", "take"]


@dataclass(frozen=True)
class Survey:
    """What setup measured of a pinned source (`lance_lightning.plan.survey`): the plan's only input from I/O."""

    matched_rows: int
    matches: RowSet | None
    row_bytes: int
    #: With packing: the matching documents' stream offsets (``matched_rows`` then counts windows).
    documents: DocumentIndex | None = None
    #: With a clip sampler: the matching media rows and clips per row (``matched_rows`` counts clips).
    clips: ClipUnits | None = None
    #: The scalar indexes Lance answered the filter's match count with ("the BITMAP index on label").
    counted_by: str | None = None


@dataclass(frozen=True)
class ReadPlan:
    """Everything a reader needs to produce one split's batches for any epoch and topology."""

    split: str
    source: PinnedSource
    strategy: ShuffleStrategy
    method: ReadMethod
    matched_rows: int
    batch_size: int
    drop_last: bool
    reason: str
    #: The filter's matching rows (``None``: every row matches, match ``i`` is row ``i``).
    matches: RowSet | None = field(default=None, repr=False, compare=False)
    #: Estimated Arrow bytes per row of the read columns (sizes read groups; not part of the order).
    row_bytes: int = field(default=1, compare=False)
    #: Pad the tail step so every rank has a batch (see `Layout`); predict plans do not pad.
    pad: bool = True
    #: With packing (`lance_lightning.plan.packing`): the documents' index; the plan's unit is then a
    #: window (``matched_rows`` counts windows, ``matches`` still holds the matching documents).
    documents: DocumentIndex | None = field(default=None, repr=False, compare=False)
    #: What the remote cache did for this split (`lance_lightning.materialize.cache`), for ``explain``.
    cache: str | None = field(default=None, compare=False)
    #: With a clip sampler: clips per matching media row (`lance_lightning.plan.clips`).
    clips: ClipUnits | None = field(default=None, compare=False)
    #: The scalar indexes that answered the filter's count (`Survey.counted_by`), for ``explain``.
    counted_by: str | None = field(default=None, compare=False)

    @property
    def matched_documents(self) -> int:
        """Matching rows of the source (documents with packing, whose sequence counts windows; media
        rows with clips)."""
        if self.clips is not None:
            return self.clips.rows
        return self.matched_rows if self.documents is None else self.documents.documents

    @property
    def selectivity(self) -> float:
        """Matching share of the rows of the source (of the one a local copy stands for)."""
        origin = self.source.stands_for or self.source
        return self.matched_documents / origin.total_rows if origin.total_rows else 0.0

    def order(self, epoch: int) -> EpochOrder:
        return EpochOrder(self.matched_rows, self.strategy, epoch)

    def layout(self, world_size: int, start: int = 0) -> Layout:
        return Layout(start, self.matched_rows - start, world_size, self.batch_size, self.drop_last, self.pad)

    def row_positions(self, matched: np.ndarray) -> np.ndarray:
        """Positions in the pinned dataset version of the given matching-row indices."""
        return matched if self.matches is None else select_runs(self.matches, matched)

    def identity(self) -> dict[str, Any]:
        """Plain description of everything that determines the epoch order (no credentials)."""
        identity = {**self.source.identity(), "shuffle": self.strategy.describe(), "rows": self.matched_rows}
        if self.documents is not None:
            identity["packing"] = self.documents.packing.describe()
        if self.clips is not None:
            identity["clips"] = self.clips.sampler.describe()
        return identity

    @property
    def packed(self) -> bool:
        """Whether the plan's units are packed token windows."""
        return self.documents is not None

    @property
    def clipped(self) -> bool:
        """Whether the plan's units are clips of media rows."""
        return self.clips is not None

    @property
    def sources(self) -> tuple[PinnedSource, ...]:
        """The one source the plan reads."""
        return (self.source,)

    @property
    def unit(self) -> str:
        """What the plan's sequence counts: rows, windows with packing, clips with a clip sampler."""
        if self.clips is not None:
            return "clip"
        return "row" if self.documents is None else "window"

    def _clip_lines(self) -> list[str]:
        if self.clips is None:
            return []
        from lance_lightning.media.decoders import decoder_line  # the decoder's import is checked here

        sampler = self.clips.sampler
        starts = f"random starts (seed {sampler.seed}, new each epoch)" if sampler.starts == "random" else "even starts"
        blob = sampler.column in self.source.blob_columns
        return [
            f"  clips: {self.clips.rows:,} media row(s) x {sampler.per_item} clip(s) = {self.matched_rows:,} clip(s) "
            f"per epoch of column {sampler.column!r}, {starts}; the unit shuffled is the clip",
            f"  clip: {sampler.shape_line()}",
            "  media read: "
            + (
                "byte ranges of each blob (seekable file), headers cached while the file stays open"
                if blob
                else "whole values (not blob-encoded: blob encoding would read only what a clip needs)"
            ),
            f"  decoder: {decoder_line(sampler)}",
        ]

    def _packing_lines(self) -> list[str]:
        index = self.documents
        if index is None:
            return []
        packing = index.packing
        share = index.dropped_tokens / index.tokens if index.tokens else 0.0
        return [
            f"  packing: {index.documents:,} document(s), {index.tokens:,} token(s) of column {packing.column!r}"
            f" -> {self.matched_rows:,} window(s) of {packing.seq_len} (labels {packing.labels!r}, "
            f"eos_id {packing.eos_id}); the unit shuffled is the window",
            f"  tail: {index.dropped_tokens:,} tokens ({share:.2%}) per epoch not trained",
        ]

    def _counted(self) -> str:
        """Which scalar index counted the filter's matches (nothing when a scan counted them)."""
        return f", counted by {self.counted_by}" if self.counted_by else ""

    def explain(self, world_size: int = 1) -> str:
        layout = self.layout(world_size)
        order = self.order(0)
        src = self.source.stands_for or self.source
        lines = [
            f"split '{self.split}': {src.uri} @ {src.version_shown}, columns {list(src.columns)}",
            *([f"  cache: {self.cache}"] if self.cache else []),
            f"  {'rows' if self.documents is None else 'documents'}: {self.matched_documents:,} of {src.total_rows:,}"
            + (
                f" match filter {src.filter!r} (selectivity {self.selectivity:.2%}{self._counted()})"
                if src.filter
                else ""
            ),
            *self._packing_lines(),
            *self._clip_lines(),
            f"  strategy: {self.strategy!r} -> {order.units:,} unit(s) of {order.unit_rows:,} {self.unit}(s)",
            f"  read: {self.method} ({self.reason})",
            f"  batches: {layout.steps:,} per rank x {world_size} rank(s), batch_size {self.batch_size}",
        ]
        if layout.dropped_rows:
            lines.append(
                f"  tail: drop_last skips {layout.dropped_rows:,} {self.unit}(s) per epoch (a new set each epoch "
                "when shuffled)"
            )
        elif layout.repeated_rows:
            lines.append(
                f"  tail: last step split across ranks; {layout.repeated_rows} {self.unit}(s) repeated as padding"
            )
        elif layout.rank_steps(world_size - 1) < layout.steps:
            lines.append(
                f"  tail: last step split across ranks; ranks {layout.tail_rows}..{world_size - 1} have one "
                "batch fewer (not padded: every row is read once)"
            )
        return "\n".join(lines)


def plan_reads(split: str, source: PinnedSource, survey: Survey, settings: SplitSettings) -> ReadPlan:
    """The `ReadPlan` of a surveyed source (no I/O). It fits any topology; `check_fits` says
    whether it fits the one it is read with."""
    strategy, filter_read = settings.strategy, settings.filter_read
    if source.filter is None:
        method, reason = _method_without_filter(strategy)
    else:
        matched = survey.matched_rows if survey.documents is None else survey.documents.documents
        matched = matched if survey.clips is None else survey.clips.rows
        method, reason = _method_with_filter(strategy, filter_read, matched / source.total_rows)
    return ReadPlan(
        split,
        source,
        strategy,
        method,
        survey.matched_rows,
        settings.batch_size,
        settings.drop_last,
        reason,
        survey.matches,
        survey.row_bytes,
        settings.pad,
        survey.documents,
        clips=survey.clips,
        counted_by=survey.counted_by,
    )


def _method_without_filter(strategy: ShuffleStrategy) -> tuple[ReadMethod, str]:
    if strategy.reads_by_take:
        return "take", strategy.take_reason(filtered=False)
    return "scan", "contiguous ranges read at scan speed"


def _method_with_filter(strategy: ShuffleStrategy, policy: FilterRead, selectivity: float) -> tuple[ReadMethod, str]:
    if strategy.reads_by_take:
        return "take", strategy.take_reason(filtered=True)
    method = policy.choose(selectivity)
    if policy.method != "auto":
        return method, f"forced by FilterRead(method={policy.method!r})"
    relation = "<" if method == "take" else ">="
    why = "take only the matching rows" if method == "take" else "scan ranges and keep the matching rows"
    return method, f"selectivity {selectivity:.2%} {relation} take_below {policy.take_below:.2%}: {why}"


def check_fits(plan: Plan, world_size: int) -> None:
    """Raise `ConfigError` unless ``plan`` (of any kind) gives every one of
    ``world_size`` ranks a batch: at least a row per rank, and with ``drop_last`` a whole step."""
    split, rows, batch_size, drop_last = plan.split, plan.matched_rows, plan.batch_size, plan.drop_last
    if world_size > rows:
        raise ConfigError(
            "world_size",
            world_size,
            f"split '{split}' has only {rows} row(s), fewer than ranks",
            "use fewer devices/nodes, or more data",
        )
    if drop_last and rows < batch_size * world_size:
        raise ConfigError(
            "batch_size",
            batch_size,
            f"split '{split}' has {rows} row(s), fewer than one step of "
            f"batch_size x world_size = {batch_size * world_size}, so drop_last leaves no batch",
            f"use batch_size <= {rows // world_size}, or drop_last=False",
        )
