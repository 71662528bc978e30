"""What each run of a scenario must train: the user's intent, laid out from the reference sequences.

Written from what a user asks of Lightning's loop, independently of the package (nothing here reads
the run checked, the package's cursor or its own description of what it will train) and of
Lightning's epoch bookkeeping after a restart:

- `layout` splits a data epoch's sequence from a unit on into global steps as docs/concepts.md
  documents: global step ``i`` takes units ``[start + i*W*B, start + (i+1)*W*B)``, rank ``r`` the
  ``r``-th slice of ``B``; the tail is dropped with ``drop_last``, else split across ranks.
- The uninterrupted run: trainer epoch ``e`` reads data epoch ``e``, in that epoch's own order,
  from its first unit. ``limit_train_batches`` as a count ``L`` trains the first ``min(L, n)`` of
  an epoch's ``n`` batches, as a fraction ``f`` the first ``int(n * f)`` (`epoch_cap`).
  ``max_epochs`` E promises data epochs ``0..E-1``, each so limited; ``max_steps`` S the batches up
  to the S-th optimizer step (an optimizer step ends every ``accumulate_grad_batches``-th batch of
  an epoch and its last batch: Lightning's documented accumulation).
- A resumed run continues that same sequence after the batches its checkpoint had trained (the
  checkpoint's ``contract.batches``): nothing lost, nothing repeated, whichever writer wrote the
  checkpoint (periodic, ``last.ckpt``, epoch end, on exception or SIGTERM, ``save_checkpoint``
  after fit) and whatever stopped the run that wrote it. So a checkpoint written after
  ``max_steps`` or ``max_time`` cut data epoch ``e`` short continues inside epoch ``e`` (trainer
  epoch ``e``, batch index where the cut left it), and the rest of that epoch is trained whenever
  the resumed ``max_epochs`` covers epoch ``e`` (`after`, `intent`). On another topology the rest
  of the epoch is laid out from the unit reached; the resumed epoch's batch count is the batches
  trained before plus those of the rest, limited as above.
- `intent` lists a run's `Batch`es (where each sits, which optimizer steps it ends, what the
  cursor says after it) and each trainer epoch's batch count as Lightning must take it (``caps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tests.contract.scenario import Scenario, Topology

Step = list[list[int]]  # one global step: each rank's units


def layout(seq: list[int], start: int, world_size: int, batch_size: int, drop_last: bool) -> list[Step]:
    """The documented layout of ``seq[start:]`` (docs/concepts.md, "Layout: ranks, workers and the tail")."""
    rest, per_step = seq[start:], world_size * batch_size
    full = len(rest) // per_step
    steps = [
        [rest[i * per_step + r * batch_size : i * per_step + (r + 1) * batch_size] for r in range(world_size)]
        for i in range(full)
    ]
    tail = rest[full * per_step :]
    if tail and not drop_last:
        share, extra = divmod(len(tail), world_size)
        bounds = np.cumsum([0] + [share + (1 if r < extra else 0) for r in range(world_size)])
        steps.append([tail[bounds[r] : bounds[r + 1]] for r in range(world_size)])
    return steps


@dataclass
class Batch:
    """One expected batch: where it sits and what the cursor says after it."""

    trainer_epoch: int
    batch_idx: int
    data_epoch: int
    step: Step
    consumed: int
    rows: int
    optimizer_step: bool
    last_of_epoch: bool


@dataclass(frozen=True)
class Position:
    """Where a run starts: data epoch ``epoch``, ``consumed`` units of it trained, in ``done`` batches."""

    epoch: int = 0
    consumed: int = 0
    done: int = 0


@dataclass
class Intent:
    """A run's expected batches, and each trainer epoch's batch count as Lightning must take it."""

    batches: list[Batch] = field(default_factory=list)
    caps: dict[int, int] = field(default_factory=dict)


def epoch_cap(batches: int, limit: int | float | None) -> int:
    """How many of an epoch's ``batches`` ``limit_train_batches`` lets train."""
    if limit is None:
        return batches
    if isinstance(limit, float):
        return int(batches * limit)
    return min(batches, limit)


def after(batch: Batch | None) -> Position:
    """Where the data continues after ``batch`` (None: from the start): the next epoch after the
    last batch its limit lets an epoch train, else the rest of the same data epoch."""
    if batch is None:
        return Position()
    if batch.last_of_epoch:
        return Position(batch.data_epoch + 1)
    return Position(batch.data_epoch, batch.consumed, batch.batch_idx + 1)


def intent(
    seqs: list[list[int]],
    scenario: Scenario,
    topology: Topology,
    start: Position,
    max_epochs: int,
    max_steps: int | None = None,
    global_step: int = 0,
) -> Intent:
    """The batches a run on ``topology`` trains from ``start`` up to data epoch ``max_epochs``
    (excluded) or optimizer step ``max_steps`` (``global_step`` already taken), in order."""
    out = Intent()
    accumulate, per_step = scenario.loop.accumulate, topology.world_size * topology.batch_size
    for epoch in range(start.epoch, max_epochs):
        first, begin = (start.done, start.consumed) if epoch == start.epoch else (0, 0)
        seq = seqs[epoch]
        steps = layout(seq, begin, topology.world_size, topology.batch_size, scenario.drop_last)
        cap = epoch_cap(first + len(steps), scenario.loop.limit_train_batches)
        out.caps[epoch] = cap
        for i, step in enumerate(steps[: max(0, cap - first)]):
            if max_steps is not None and global_step >= max_steps:
                return out
            idx = first + i
            consumed = len(seq) if i + 1 >= len(steps) else begin + (i + 1) * per_step
            optimizer_step = (idx + 1) % accumulate == 0 or idx + 1 == cap
            out.batches.append(Batch(epoch, idx, epoch, step, consumed, len(seq), optimizer_step, idx + 1 == cap))
            global_step += optimizer_step
        if max_steps is not None and global_step >= max_steps:
            return out
    return out
