"""The train data cursor: what a checkpoint must hold to resume the data exactly.

Guarantees:
- The state is a small versioned dict of plain types (loads with ``weights_only=True``), of
  constant size whatever the dataset size::

      {"format": 5, "epoch": int, "rows_consumed": int, "trainer_epoch": int, "steps": int,
       "epoch_steps": int, "plan": {"uri", "version", "data", "columns", "filter", "shuffle", "rows"[, "packing"]}}

  ``epoch`` is the data epoch being read (its order) and ``rows_consumed`` the units of its
  sequence already trained (rows; windows with packing; draws for a mixture). ``trainer_epoch``,
  ``steps`` and ``epoch_steps`` are the trainer's epoch, the batches it counted in that epoch and
  the batches it planned for it. An epoch is finished when ``rows_consumed == plan["rows"]``
  (`finished`): derived, never stored.
- Nothing in it depends on the world size, the batch size or the number of DataLoader workers: a
  run restored on another topology starts its layout at ``rows_consumed`` (`lance_lightning.plan.layout`).
  The tracker never holds a topology either: its caller passes the loader's (world size, rank)
  to each question, so the cursor and the batches cannot disagree about it.
- Only consumed batches count: the loader reports yields from the main process (the loader has a
  length, so Lightning does not fetch ahead), `DataCursorCheckpoint` reports the batches whose
  training step ended, and a batch handed out whose step has not ended (a checkpoint written on an
  exception, e.g. by ``OnExceptionCheckpoint``) is not counted (``in_flight``: the trainer's count).
- Trainer epoch ``e`` reads data epoch ``e``: a restore resumes the saved epoch at
  ``rows_consumed`` where the trainer resumes inside it, and any later trainer epoch reads its own
  data epoch from its first unit. A checkpoint that Lightning wrote after a stop cut an epoch short
  (``max_steps``, ``max_time``, ``should_stop``: fewer ``steps`` than ``epoch_steps``) resumes
  inside that epoch too: the data module rewrites its loop state to the one Lightning saves inside
  an epoch (`lance_lightning.load.loop_state`). Nothing is skipped, nothing read twice.
- Restore is strict: any plan field that differs raises `CursorMismatchError` naming the field.
  Seeking is O(1): nothing is replayed. With ``resume=False`` a saved state is not checked: the
  epoch it names restarts at its first unit (Lightning still counts the steps trained before).
- ``length(epoch, ...)`` is what iterating trainer epoch ``epoch`` yields: a whole epoch, or the
  rest of a restored one; ``first_index`` the trainer's batch index of its first batch (the steps
  trained before a restored state). Lightning stops an epoch at ``len(loader)`` (scaled by
  ``limit_train_batches``), so a trainer's loader reports their sum: the whole epoch's batches
  whenever the topology is the one the state was saved with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lance_lightning.errors import ConfigError, CursorMismatchError
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan

#: Bumped whenever the meaning of a state or the epoch order of a plan changes (3: every
#: permutation is a keyed bijection; 4: a mixture slot takes its source's next draw; 5: trainer
#: epoch ``e`` always reads data epoch ``e``), so that an older checkpoint is refused instead of
#: resuming at the same row count of a different order.
CURSOR_FORMAT = 5
STATE_KEYS = ("format", "epoch", "rows_consumed", "trainer_epoch", "steps", "epoch_steps", "plan")


def finished(state: dict[str, Any]) -> bool:
    """Whether the data epoch of ``state`` was read to its end."""
    return state["rows_consumed"] >= state["plan"]["rows"]


class CursorTracker:
    """Tracks the train split's position (data epoch, units consumed) and restores it from a state."""

    def __init__(self, plan: ReadPlan, resume: bool = True, in_flight: Callable[[], int] | None = None) -> None:
        self.plan = plan
        self.resume = resume
        #: Batches handed out whose step has not ended (a trainer's count; None: none are).
        self.in_flight = in_flight
        self.epoch: int | None = None  # data epoch being read
        self.trainer_epoch: int | None = None
        self.layout: Layout | None = None
        self.steps_before = 0
        self.epoch_steps = 0
        self.yielded = 0
        self.consumed: int | None = None  # counted once a callback reports finished steps
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
        self.epoch, self.trainer_epoch = data_epoch, trainer_epoch
        self.layout = self.plan.layout(world_size, start)
        self.steps_before = steps_before
        self.epoch_steps = steps_before + self.layout.rank_steps(rank) if planned_steps is None else planned_steps
        self.yielded = 0
        self.consumed = None if self.consumed is None else 0
        return self.layout

    def on_yield(self) -> None:
        self.yielded += 1

    def count_finished_steps(self) -> None:
        """From now on only steps reported by `on_step_end` count as consumed, not batches yielded
        (`DataCursorCheckpoint` calls it at each epoch start)."""
        if self.consumed is None:
            self.consumed = 0

    def on_step_end(self) -> None:
        """A training step finished on the latest yielded batch (reported by the callback)."""
        self.consumed = min(self.yielded, (self.consumed or 0) + 1)

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
        if self._reading(trainer_epoch, world_size):
            return layout.rank_steps(rank)
        _, start, _ = self._resume_point(trainer_epoch)
        return self.plan.layout(world_size, start).rank_steps(rank)

    def first_index(self, trainer_epoch: int, world_size: int) -> int:
        """The trainer's batch index of the first batch of ``trainer_epoch`` as the cursor knows it:
        the steps trained before a restored mid-epoch state, else 0."""
        if self._reading(trainer_epoch, world_size):
            return self.steps_before
        return self._resume_point(trainer_epoch)[2]

    def _reading(self, trainer_epoch: int, world_size: int) -> bool:
        layout = self.layout
        return (
            self._pending is None
            and layout is not None
            and layout.world_size == world_size
            and self.trainer_epoch == trainer_epoch
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
        line = (
            f"  resume: data epoch {pending['epoch']} at {unit} {start:,} of {rows:,} "
            f"({pending['steps']:,} step(s) of trainer epoch {pending['trainer_epoch']} done)"
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
        done = self.consumed if self.consumed is not None else self.yielded
        if self.in_flight is not None:  # a checkpoint written while a step runs (an exception in it)
            done = min(done, self.yielded - self.in_flight())
        return {
            "format": CURSOR_FORMAT,
            "epoch": self.epoch,
            "rows_consumed": self.layout.start + self.layout.rows_after(done),
            "trainer_epoch": self.trainer_epoch,
            "steps": self.steps_before + done,
            "epoch_steps": self.epoch_steps,
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
            self._pending = _fresh_start(state, self.plan)
            return
        check_state(state, self.plan)
        self._pending = dict(state)


def _fresh_start(state: dict[str, Any], plan: ReadPlan) -> dict[str, Any] | None:
    """The state that reads the trainer epoch ``state`` was taken in from its first unit, should
    the trainer resume inside it, and every later epoch whole (of any cursor format: with
    ``resume=False`` nothing else of a saved state is trusted)."""
    if not isinstance(state, dict):
        return None
    trainer_epoch = state.get("trainer_epoch", state.get("epoch"))
    steps = state.get("steps", 0)
    if not isinstance(trainer_epoch, int) or isinstance(trainer_epoch, bool) or not isinstance(steps, int):
        return None
    return {
        "format": CURSOR_FORMAT,
        "epoch": trainer_epoch,
        "rows_consumed": 0,
        "trainer_epoch": trainer_epoch,
        "steps": steps,
        "epoch_steps": steps,  # never read on: a later trainer epoch starts its own data epoch
        "plan": plan.identity(),
    }


#: The state's counters: non-negative integers.
_COUNTERS = ("epoch", "rows_consumed", "trainer_epoch", "steps", "epoch_steps")


def check_state(state: dict[str, Any], plan: ReadPlan) -> None:
    """Raise `CursorMismatchError` naming the first field where ``state`` and ``plan`` differ, or
    `ConfigError` naming the field of a state that is not a cursor (damaged or edited)."""
    if not isinstance(state, dict):
        raise _damaged("train_cursor", state, "is not a mapping")
    if state.get("format") != CURSOR_FORMAT:
        raise CursorMismatchError("format", state.get("format"), CURSOR_FORMAT)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise CursorMismatchError("keys", sorted(state), list(STATE_KEYS))
    for key in _COUNTERS:
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _damaged(f"train_cursor.{key}", value, "is not a non-negative integer")
    if state["epoch"] != state["trainer_epoch"]:
        raise _damaged("train_cursor.epoch", state["epoch"], f"differs from trainer_epoch {state['trainer_epoch']}")
    if not isinstance(state["plan"], dict):
        raise _damaged("train_cursor.plan", state["plan"], "is not a mapping")
    field = first_difference(plan.resume_identity(state["plan"]), plan.identity(), "plan")
    if field is not None:
        raise CursorMismatchError(*field)
    if not 0 <= state["rows_consumed"] <= plan.matched_rows:
        raise CursorMismatchError("rows_consumed", state["rows_consumed"], f"0..{plan.matched_rows}")


def _damaged(field: str, value: Any, problem: str) -> ConfigError:
    return ConfigError(
        f"checkpoint {field}",
        value,
        f"{problem}: the checkpoint's data cursor was edited or damaged",
        "resume from another checkpoint, or start the data epoch fresh with `resume_data=False`",
    )


#: Plan fields compared first, so that a mismatch names the most telling one.
_FIRST_FIELDS = (
    "uri",
    "version",
    "data",
    "filter",
    "columns",
    "sources",
    "names",
    "weights",
    "block",
    "epoch_rule",
    "shuffle",
)


def first_difference(saved: dict[str, Any], current: dict[str, Any], path: str) -> tuple[str, Any, Any] | None:
    """(field path, saved value, current value) of the first plan field that differs, or None.

    A mixture's ``sources`` are compared source by source (``plan.sources[1].version``).
    """
    keys = [k for k in _FIRST_FIELDS if k in saved or k in current]
    keys += sorted((set(saved) | set(current)) - set(keys))
    for key in keys:
        old, new = saved.get(key), current.get(key)
        if key == "sources" and isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            for j, (a, b) in enumerate(zip(old, new)):
                found = first_difference(a, b, f"{path}.sources[{j}]")
                if found is not None:
                    return found
        elif old != new:
            return f"{path}.{key}", old, new
    return None


def repin_versions(
    state: dict[str, Any], sources: list[dict[str, Any]], configured: list[int | None]
) -> list[int | None] | None:
    """A mixture's `repin_target`: the version each source must be re-pinned to so that the cursor
    ``state`` resumes exactly (its current version where it needs none), or None when none does.
    ``sources`` are the current plans' identities, ``configured`` the versions the config names."""
    saved = state.get("plan")
    saved_sources = saved.get("sources") if isinstance(saved, dict) else None
    if not isinstance(saved_sources, list) or len(saved_sources) != len(sources):
        return None  # `check_state` names what is wrong with it
    versions: list[int | None] = []
    for old, new, version in zip(saved_sources, sources, configured, strict=True):
        moved = (
            isinstance(old, dict) and old.get("uri") == new["uri"] and old.get("version") not in (None, new["version"])
        )
        versions.append(old["version"] if moved and version is None else new["version"])
    return versions if versions != [new["version"] for new in sources] else None


def repin_target(
    state: dict[str, Any],
    current_uri: str | None,
    current_version: int | None,
    configured_version: int | None,
    materialized: bool,
) -> tuple[str, Any] | None:
    """Where the train split must be pinned to resume ``state`` exactly, or None to keep (or pin
    as configured) the current one. ``current_uri``/``current_version`` are those of the split's
    plan, ``None`` when it is not planned yet.

    ``("view", uri)``: the checkpoint read another materialized view (views are kept when the source
    moves on). ``("version", v)``: it read version ``v`` of the same source and no version was
    configured, so the latest version is not necessarily the one the cursor counts rows of.
    """
    saved = state.get("plan")
    if not isinstance(saved, dict):
        return None  # `check_state` names what is wrong with it
    if materialized:
        return ("view", saved["uri"]) if saved.get("uri") not in (None, current_uri) else None
    if (
        saved.get("uri") == current_uri
        and saved.get("version") not in (None, current_version)
        and configured_version is None
    ):
        return ("version", saved["version"])
    return None
