"""What each run of a scenario must train: the documented layout of the reference run's sequences.

Guarantees (computed from the reference sequences and the scenario alone, never from the run checked):
- `layout` splits a data epoch's sequence from a unit on into global steps as docs/concepts.md
  documents: global step ``i`` takes units ``[start + i*W*B, start + (i+1)*W*B)``, rank ``r`` the
  ``r``-th slice of ``B``; the tail is dropped with ``drop_last``, else split across ranks.
- `fresh_plans` gives a run from the start one `EpochPlan` per trainer epoch, each reading its
  data epoch whole; ``limit_train_batches`` cuts each epoch (`epoch_plan`).
- `resumed_plans` continues the data exactly where a checkpoint's batches end: in the same epoch
  when Lightning resumes mid-epoch; when Lightning counts an epoch it stopped as finished
  (``max_steps``, ``max_time``), the next trainer epoch reads the rest of that data epoch, then
  every later epoch is whole.
- `batches` lists a run's expected `Batch`es (where each sits, which optimizer steps it ends, what
  the cursor says after it); `until_max_steps` cuts them where ``max_steps`` stops the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

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
class EpochPlan:
    """What one trainer epoch of a run reads: data epoch, where it starts, its steps and its length."""

    trainer_epoch: int
    data_epoch: int
    first_batch: int  # Lightning's batch index of the first batch this run trains in the epoch
    start: int
    steps: list[Step]
    length: int  # the epoch's batches as Lightning counts them (restored ones included, limit applied)
    rows: int  # units in the data epoch's sequence
    step_rows: int

    @property
    def trained(self) -> list[Step]:
        return self.steps[: max(0, self.length - self.first_batch)]

    def consumed(self, done: int) -> int:
        """Units of the data epoch consumed once ``done`` of this plan's steps were trained."""
        return self.rows if done >= len(self.steps) else self.start + done * self.step_rows


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


def epoch_plan(
    seqs: list[list[int]],
    trainer_epoch: int,
    data_epoch: int,
    first: int,
    start: int,
    topology: Topology,
    scenario: Scenario,
    restarted: bool = False,
) -> EpochPlan:
    """``restarted``: the epoch a resumed fit restarts in. Lightning's restarting epoch loop takes a
    batch before it checks its end (it waits for a validation run), so an epoch restarted at an
    index ``limit_train_batches`` already reached still trains one batch."""
    seq = seqs[data_epoch]
    steps = layout(seq, start, topology.world_size, topology.batch_size, scenario.drop_last)
    length = first + len(steps)
    if scenario.loop.limit_train_batches is not None:
        length = min(length, scenario.loop.limit_train_batches)
        if restarted and first > 0 and length <= first:
            length = first + min(1, len(steps))
    return EpochPlan(
        trainer_epoch, data_epoch, first, start, steps, length, len(seq), topology.world_size * topology.batch_size
    )


def batches(plans: Iterator[EpochPlan], accumulate: int) -> Iterator[Batch]:
    for plan in plans:
        trained = plan.trained
        for done, step in enumerate(trained, start=1):
            idx = plan.first_batch + done - 1
            yield Batch(
                plan.trainer_epoch,
                idx,
                plan.data_epoch,
                step,
                plan.consumed(done),
                plan.rows,
                (idx + 1) % accumulate == 0 or idx + 1 == plan.length,
                idx + 1 == plan.length,
            )


def fresh_plans(seqs: list[list[int]], scenario: Scenario, topology: Topology, epochs: int) -> Iterator[EpochPlan]:
    for epoch in range(epochs):
        yield epoch_plan(seqs, epoch, epoch, 0, 0, topology, scenario)


def resumed_plans(
    seqs: list[list[int]],
    scenario: Scenario,
    topology: Topology,
    after: Batch | None,
    resumed_at: tuple[int, int],
    epochs: int,
) -> Iterator[EpochPlan]:
    """The plans of a run resumed after batch ``after`` of the stopped run, where Lightning resumes
    at trainer epoch and batch index ``resumed_at``, up to trainer epoch ``epochs`` (excluded)."""
    epoch, batch_idx = resumed_at
    rest = []
    if after is not None:
        seq = seqs[after.data_epoch]
        rest = layout(seq, after.consumed, topology.world_size, topology.batch_size, scenario.drop_last)
    if after is None:
        data_epoch, first, start = epoch, 0, 0
    elif epoch == after.trainer_epoch:  # mid-epoch: continue at the same unit
        data_epoch, first, start = after.data_epoch, batch_idx, after.consumed
    elif after.last_of_epoch or not rest:  # the epoch ended (or nothing of it makes a step): the next one
        data_epoch, first, start = after.data_epoch + 1, batch_idx, 0
    else:  # Lightning counted an epoch it stopped as finished: its rest comes first
        data_epoch, first, start = after.data_epoch, batch_idx, after.consumed
    # (The first trainer epoch that reads continues the data, whichever trainer epoch it is.)
    restarted = after is not None
    while epoch < epochs:
        yield epoch_plan(seqs, epoch, data_epoch, first, start, topology, scenario, restarted)
        epoch, data_epoch, first, start, restarted = epoch + 1, data_epoch + 1, 0, 0, False


def until_max_steps(expected: Iterator[Batch], max_steps: int | None, global_step: int = 0) -> list[Batch]:
    out = []
    for batch in expected:
        if max_steps is not None and global_step >= max_steps:
            break
        out.append(batch)
        global_step += batch.optimizer_step
    return out
