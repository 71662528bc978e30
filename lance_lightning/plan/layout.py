"""How an epoch's sequence is split into batches across ranks and DataLoader workers.

Guarantees:
- Every rank gets exactly ``steps`` batches, so DDP never waits on a rank that ran out.
- Global step ``i`` consumes sequence rows ``[start + i*W*B, start + (i+1)*W*B)``; rank ``r``
  takes the ``r``-th slice of ``B`` rows. So the rows consumed after any number of steps are a
  prefix of the remaining sequence, whatever the world size: a cursor is one integer, and a run
  can resume on another world size by starting a new layout at that integer.
- Worker ``w`` of ``K`` produces the rank's batches ``w, w+K, ...``; the DataLoader hands them out
  round-robin, so the rank's batch order does not depend on ``K``.
- Tail (rows that do not fill a whole step): with ``drop_last`` they are skipped (fewer than
  ``W*B`` rows per epoch); otherwise one more, smaller step splits them as evenly as possible
  across ranks, and a rank left with none repeats one tail row (fewer than ``W`` repeated rows).
  Without ``pad`` (predict: no collective runs per step) a rank left with none has one batch
  fewer instead, so every row is read exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Each round of worker runs at an epoch's start is this many times longer than the last (up to
#: the run length): a few more, smaller reads, for first batches after one batch's work.
RUN_RAMP = 4


@dataclass(frozen=True)
class Layout:
    """The batches of the sequence rows ``[start, start + rows)`` for ``world_size`` ranks."""

    start: int
    rows: int
    world_size: int
    batch_size: int
    drop_last: bool
    pad: bool = True

    @property
    def step_rows(self) -> int:
        return self.world_size * self.batch_size

    @property
    def full_steps(self) -> int:
        return self.rows // self.step_rows

    @property
    def tail_rows(self) -> int:
        return self.rows - self.full_steps * self.step_rows

    @property
    def steps(self) -> int:
        """Batches per rank."""
        return self.full_steps + (1 if self.tail_rows and not self.drop_last else 0)

    def rank_steps(self, rank: int) -> int:
        """Batches of rank ``rank``: ``steps``, less the tail step of an unpadded rank without tail rows."""
        if not self.pad and self.steps > self.full_steps and rank >= self.tail_rows:
            return self.full_steps
        return self.steps

    @property
    def dropped_rows(self) -> int:
        return self.tail_rows if self.drop_last else 0

    @property
    def repeated_rows(self) -> int:
        if not self.pad or not self.tail_rows or self.drop_last:
            return 0
        return max(0, self.world_size - self.tail_rows)

    def rows_after(self, steps: int) -> int:
        """Sequence rows consumed (from ``start``) once every rank has taken ``steps`` batches."""
        if steps >= self.steps:
            return self.rows
        return steps * self.step_rows

    def batch_rows(self, rank: int, step: int) -> np.ndarray:
        """Sequence positions of rank ``rank``'s batch at step ``step``."""
        if not 0 <= step < self.rank_steps(rank):
            raise IndexError(f"step {step} is outside [0, {self.rank_steps(rank)}) of rank {rank}")
        base = self.start + step * self.step_rows
        if step < self.full_steps:
            first = base + rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        share, extra = divmod(self.tail_rows, self.world_size)
        first = base + rank * share + min(rank, extra)
        size = share + (1 if rank < extra else 0)
        if size == 0:
            return np.array([base + rank % self.tail_rows], dtype=np.int64)
        return np.arange(first, first + size, dtype=np.int64)

    def batch_len(self, rank: int, step: int) -> int:
        """``len(self.batch_rows(rank, step))``, without building the positions of a full step."""
        return self.batch_size if 0 <= step < self.full_steps else len(self.batch_rows(rank, step))

    def worker_steps(
        self, worker: int, num_workers: int, rank: int = 0, chunk: int = 1, ramp: bool = False
    ) -> list[range]:
        """Rank ``rank``'s batch indices produced by DataLoader worker ``worker`` of ``num_workers``:
        runs of ``chunk`` consecutive steps, worker ``w`` taking runs ``w, w + num_workers, ...``
        (with ``chunk=1``, steps ``w, w + num_workers, ...``). With ``ramp``, the first runs grow
        to ``chunk`` (1 step, then `RUN_RAMP` times more for each round of the workers), so an
        epoch's first batches arrive after one batch's work, not a whole run's."""
        steps, workers = self.rank_steps(rank), max(1, num_workers)
        runs, first, index = [], 0, 0
        while ramp and first < steps and (length := min(chunk, RUN_RAMP ** (index // workers))) < chunk:
            if index % workers == worker:
                runs.append(range(first, min(first + length, steps)))
            first, index = first + length, index + 1
        start = first + (worker - index) % workers * chunk  # whole runs, round-robin from run `index`
        return runs + [range(s, min(s + chunk, steps)) for s in range(start, steps, workers * chunk)]
