"""The train split's live cursor: which data epoch is read, from where, and what a checkpoint saves.

Guarantees:
- `CursorTracker` holds the data position of the epoch being read (its data epoch and `Layout`)
  apart from Lightning's loop counters there (``loop``: `lance_lightning.cursor.loop.LoopCounters`);
  ``state()`` joins them into the dict of `lance_lightning.cursor.position` that the data module
  saves, its one copy per checkpoint.
- It never holds a topology: its caller passes the loader's (world size, rank) to each question,
  so the cursor and the batches cannot disagree about it.
- Only consumed batches count: the loader reports yields from the main process (the loader has a
  length, so Lightning does not fetch ahead), `DataCursorCheckpoint` reports the batches whose
  training step ended, and a batch handed out whose step has not ended (a checkpoint written on an
  exception, e.g. by ``OnExceptionCheckpoint``) is not counted (``in_flight``: the trainer's count).
- Trainer epoch ``e`` reads data epoch ``e``: a restore resumes the saved epoch at
  ``rows_consumed`` where the trainer resumes inside it, and any later trainer epoch reads its own
  data epoch from its first unit. A checkpoint that Lightning wrote after a stop cut an epoch short
  (``max_steps``, ``max_time``, ``should_stop``: fewer ``steps`` than ``epoch_steps``) resumes
  inside that epoch too: the data module rewrites its loop state to the one Lightning saves inside
  an epoch (`lance_lightning.cursor.loop`). Nothing is skipped, nothing read twice.
- Restore is strict (`lance_lightning.cursor.position.check_state`). Seeking is O(1): nothing is
  replayed. With ``resume=False`` a saved state is not checked: the epoch it names restarts at its
  first unit (Lightning still counts the steps trained before).
- ``length(epoch, ...)`` is what iterating trainer epoch ``epoch`` yields: a whole epoch, or the
  rest of a restored one; ``first_index`` the trainer's batch index of its first batch (the steps
  trained before a restored state). Lightning stops an epoch at ``len(loader)`` (scaled by
  ``limit_train_batches``), so a trainer's loader reports their sum: the whole epoch's batches
  whenever the topology is the one the state was saved with.
- Pure: no I/O, and no Lightning (DataLoader workers import it).
"""

from __future__ import annotations

from typing import Any

from lance_lightning.cursor.loop import LoopCounters
from lance_lightning.cursor.position import CURSOR_FORMAT, check_state, fresh_start
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.layout import Layout


class CursorTracker:
    """Tracks the train split's position (data epoch, units consumed) and restores it from a state."""

    def __init__(self, plan: Plan, resume: bool = True) -> None:
        self.plan = plan
        self.resume = resume
        #: Lightning's loop counters at the position: trainer epoch, steps before, planned, trained.
        self.loop = LoopCounters()
        self.epoch: int | None = None  # data epoch being read
        self.layout: Layout | None = None
        self.restored_epoch: int | None = None  # the trainer epoch that began from a restored state
        self._pending: dict[str, Any] | None = None

    # -- epoch life cycle -------------------------------------------------------------------
    def begin_epoch(
        self,
        trainer_epoch: int,
        world_size: int,
        rank: int,
        planned_steps: int | None = None,
        first_index: int | None = None,
    ) -> Layout:
        """Start iterating ``trainer_epoch`` on rank ``rank`` of ``world_size``: from the restored
        cursor where it applies, else from the first unit of its data epoch.

        ``planned_steps``: the batches the trainer takes of this epoch (its length, limit applied);
        by default every batch of the layout. ``first_index``: the trainer's index of the epoch's
        first batch, by default the restored steps (``steps`` counts on from it).
        """
        data_epoch, start, steps_before = self._resume_point(trainer_epoch)
        if first_index is not None:
            steps_before = first_index
        self.restored_epoch = trainer_epoch if self._pending is not None else None
        self._pending = None
        self.epoch = data_epoch
        self.layout = self.plan.layout(world_size, start)
        epoch_steps = steps_before + self.layout.rank_steps(rank) if planned_steps is None else planned_steps
        self.loop.start_epoch(trainer_epoch, steps_before, epoch_steps)
        return self.layout

    def _resume_point(self, trainer_epoch: int) -> tuple[int, int, int]:
        """(data epoch, first sequence unit, steps trained before) of ``trainer_epoch``: where the
        restored state was taken in it, the state's position, else its data epoch from the start."""
        pending = self._pending
        if pending is not None and trainer_epoch == pending["trainer_epoch"]:
            return pending["epoch"], pending["rows_consumed"], pending["steps"]
        return trainer_epoch, 0, 0

    def length(self, trainer_epoch: int, world_size: int, rank: int) -> int:
        """Rank ``rank``'s batches when iterating ``trainer_epoch``: while this topology reads it,
        its own count (a loader iterated before the trainer attached read with another)."""
        layout = self.layout
        if layout is not None and self._reading(trainer_epoch, world_size):
            return layout.rank_steps(rank)
        _, start, _ = self._resume_point(trainer_epoch)
        return self.plan.layout(world_size, start).rank_steps(rank)

    def first_index(self, trainer_epoch: int, world_size: int) -> int:
        """The trainer's batch index of the first batch of ``trainer_epoch`` as the cursor knows it:
        the steps trained before a restored mid-epoch state, else 0."""
        if self._reading(trainer_epoch, world_size):
            return self.loop.steps_before
        return self._resume_point(trainer_epoch)[2]

    def _reading(self, trainer_epoch: int, world_size: int) -> bool:
        layout = self.layout
        return (
            self._pending is None
            and layout is not None
            and layout.world_size == world_size
            and self.loop.trainer_epoch == trainer_epoch
        )

    def restoring(self, trainer_epoch: int) -> bool:
        """Whether a restored state is still to be read, or ``trainer_epoch`` began from one: its
        length may differ from a whole epoch's (another batch size or world size, the rest of a cut
        epoch), and which trainer epoch a restore resumes is Lightning's choice, made after it reads
        the loader's length. The data module has the trainer read the length again next epoch."""
        return self._pending is not None or self.restored_epoch == trainer_epoch

    def describe_resume(self, world_size: int, budget: int | None = None) -> str | None:
        """One line on where the restored data resumes and what its last step leaves out.

        ``budget``: the batches the trainer still runs (``max_steps``), when fewer than the rest of
        the epoch: the line promises only those.
        """
        pending = self._pending
        if pending is None or (pending["rows_consumed"] == 0 and pending["steps"] == 0):
            return None
        unit, rows, start = self.plan.unit, self.plan.matched_rows, pending["rows_consumed"]
        versions = ", ".join((source.stands_for or source).version_shown for source in self.plan.sources)
        line = (
            f"  resume: data epoch {pending['epoch']} at {unit} {start:,} of {rows:,} "
            f"({versions}; {pending['steps']:,} step(s) of trainer epoch {pending['trainer_epoch']} done)"
        )
        if start >= rows:
            return line + ": finished; the next epoch is read whole"
        layout = self.plan.layout(world_size, start)
        if budget is not None and budget < layout.steps:
            return line + f": {budget:,} more step(s) of {layout.step_rows:,} {unit}(s) before the trainer stops"
        line += f": {layout.steps:,} more step(s) of {layout.step_rows:,} {unit}(s)"
        if layout.dropped_rows:
            line += f"; drop_last skips the last {layout.dropped_rows:,} {unit}(s) of this epoch"
        return line

    # -- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        if self.layout is None or self.epoch is None:
            return {}
        loop = self.loop
        done = loop.done()
        return {
            "format": CURSOR_FORMAT,
            "epoch": self.epoch,
            "rows_consumed": self.layout.start + self.layout.rows_after(done),
            "trainer_epoch": loop.trainer_epoch,
            "steps": loop.steps_before + done,
            "epoch_steps": loop.epoch_steps,
            "plan": self.plan.identity(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Validate ``state`` against the current plan and resume from it at the next epoch start.

        With ``resume=False`` the state is not checked and its epoch restarts at unit 0 of the
        current plan (an unfinished epoch keeps its step count, which Lightning restores).
        """
        if not state:
            return
        if not self.resume:
            self._pending = fresh_start(state, self.plan)
            return
        check_state(state, self.plan)
        self._pending = dict(state)
