"""Reading a mixture plan's batches: positions grouped by source, taken, put back in order.

Guarantees:
- `MixtureReader` has `PlanReader`'s interface (``layout``, ``groups``, ``read_group``), so the
  producer, the dataset and the loader treat a mixture as any plan.
- A read group costs one Lance ``take`` per source it draws from (rows by dataset position, as
  a take plan reads; with packing, the documents the source's windows span, as `PackedReader`
  reads them); the samples are then put back in the batches' order, and each batch gets a
  ``source`` column (int64): the index of the source each sample came from.
- A batch spec's positions are the samples' units in their own sources: dataset positions of rows,
  window indices with packing, clip units with a clip sampler (each source's clips decoded by its
  `ClipReader`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lance_lightning.plan.mixture_plan import MixturePlan, plain_table
from lance_lightning.read.clips import ClipReader
from lance_lightning.read.lance_io import read_positions
from lance_lightning.read.packed import PackedReader
from lance_lightning.read.reader import (
    TAKE_GROUP_BATCHES,
    BatchSpec,
    read_batch_rows,
)
from lance_lightning.read.retry import DEFAULT_POLICY, RetryPolicy
from lance_lightning.vocabulary import MIXTURE_SOURCE


@dataclass(frozen=True)
class MixtureSpec(BatchSpec):
    """A batch of a mixture: its rows' dataset positions and the index of each row's source."""

    sources: np.ndarray


class MixtureReader:
    """Reads one rank's batches of one epoch of a `MixturePlan`."""

    def __init__(
        self,
        plan: MixturePlan,
        epoch: int,
        world_size: int,
        rank: int,
        start: int,
        retry: RetryPolicy = DEFAULT_POLICY,
        bad_rows: Any = None,
    ) -> None:
        self.plan = plan
        self.epoch = epoch
        self.retry = retry
        self.rank = rank
        self.layout = plan.layout(world_size, start)
        self.batch_rows = read_batch_rows(plan.row_bytes)
        #: Packed sources' window readers (the mixture's units are then windows).
        self.windows: dict[int, PackedReader | ClipReader] = {
            j: PackedReader(source, epoch, 1, 0, 0, retry=retry) for j, source in enumerate(plan.plans) if source.packed
        }
        #: Clipped sources' clip readers (the mixture's units are then clips).
        self.windows.update(
            (j, ClipReader(source, epoch, 1, 0, 0, retry=retry, bad_rows=bad_rows))
            for j, source in enumerate(plan.plans)
            if source.clipped
        )

    def specs(self, steps: list[int]) -> list[MixtureSpec]:
        seqs = [self.layout.batch_rows(self.rank, step) for step in steps]
        source, rows = self.plan.units(self.epoch, np.concatenate(seqs))
        bounds = np.cumsum([len(seq) for seq in seqs])[:-1]
        return [
            MixtureSpec(step, where, which)
            for step, where, which in zip(steps, np.split(rows, bounds), np.split(source, bounds))
        ]

    def groups(self, steps: Iterable[int]) -> Iterator[list[MixtureSpec]]:
        group: list[int] = []
        for step in steps:
            group.append(step)
            if len(group) >= TAKE_GROUP_BATCHES:
                yield self.specs(group)
                group = []
        if group:
            yield self.specs(group)

    def read_group(self, group: list[MixtureSpec]) -> list[tuple[int, pa.Table]]:
        """Every batch of ``group``: one take per source drawn, then rows put back in order."""
        positions = np.concatenate([spec.positions for spec in group])
        source = np.concatenate([spec.sources for spec in group])
        tables, index = [], np.empty(len(positions), dtype=np.int64)
        offset = 0
        for j, plan in enumerate(self.plan.plans):
            mine = np.flatnonzero(source == j)
            if not len(mine):
                continue
            if j in self.windows:  # packed or clipped: the units are windows or clips
                table = self.windows[j].read_units(positions[mine])
                index[mine] = offset + np.arange(len(mine))
            else:
                wanted, inverse = np.unique(positions[mine], return_inverse=True)
                table = read_positions(
                    plan.source, wanted, scan_mode=False, retry=self.retry, batch_rows=self.batch_rows
                )
                index[mine] = offset + inverse
            tables.append(plain_table(table.replace_schema_metadata(None)))
            offset += table.num_rows
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        table = table.take(pa.array(index)).append_column(MIXTURE_SOURCE, pa.array(source, pa.int64()))
        bounds = np.cumsum([0, *(len(spec.positions) for spec in group)])
        return [(spec.step, table.slice(int(a), int(b - a))) for spec, a, b in zip(group, bounds[:-1], bounds[1:])]
