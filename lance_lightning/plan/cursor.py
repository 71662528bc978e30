"""The train data cursor: what a checkpoint must hold to resume an epoch exactly.

Guarantees:
- The state is a small versioned dict of plain types (loads with ``weights_only=True``), of
  constant size whatever the dataset size::

      {"format": 3, "epoch": int, "rows_consumed": int, "steps": int, "finished": bool,
       "plan": {"uri", "version", "columns", "filter", "shuffle", "rows"[, "packing"]}, "fingerprint": str}

  With packing (`lance_lightning.plan.packing`) the sequence counts windows: ``rows_consumed``
  and ``plan.rows`` are windows, and ``plan.packing`` (absent without packing) must match.

- ``rows_consumed`` counts rows of the epoch sequence, not batches of one rank, so it does not
  depend on the world size, the batch size or the number of DataLoader workers: a run restored
  on another topology starts its layout at that row (see `lance_lightning.plan.layout`).
- Only consumed batches count: the loader reports yields from the main process (the loader has a
  length, so Lightning does not fetch ahead), and `DataCursorCheckpoint` reports the batches whose
  training step ended, which is exact whatever fetches ahead.
- Restore is strict: any plan field that differs raises `CursorMismatchError` naming the field.
  Seeking is O(1): nothing is replayed. With ``resume=False`` a saved state is not checked: the
  epoch it names restarts at its first row (Lightning still counts the steps trained before).
- ``length(epoch)`` is what iterating ``epoch`` yields: a whole epoch, or the rest of a restored
  one. Lightning resumes its batch index at the saved step count and stops the epoch at
  ``len``, so the trainer's loader adds those steps (``count_restored=True``).
"""

from __future__ import annotations

import warnings
from typing import Any

from lance_lightning.errors import CursorMismatchError
from lance_lightning.plan.layout import Layout
from lance_lightning.plan.planner import ReadPlan

#: Bumped whenever the epoch order of a plan changes (2: a short last unit always comes last, and
#: unit boundaries rotate per epoch; 3: every permutation is a keyed bijection), so that an older
#: checkpoint is refused instead of resuming at the same row count of a different order.
CURSOR_FORMAT = 3
STATE_KEYS = ("format", "epoch", "rows_consumed", "steps", "finished", "plan", "fingerprint")


class CursorTracker:
    """Tracks one split's epoch position and restores it from a saved state."""

    def __init__(self, plan: ReadPlan, world_size: int, rank: int = 0, resume: bool = True) -> None:
        self.plan = plan
        self.world_size = world_size
        self.rank = rank
        self.resume = resume
        self.epoch: int | None = None
        self.layout: Layout | None = None
        self.steps_before = 0
        self.yielded = 0
        self.consumed: int | None = None  # set when a callback reports finished steps
        self._pending: dict[str, Any] | None = None

    # -- epoch life cycle -------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> Layout:
        """Start iterating ``epoch``: from the restored cursor if it belongs to it, else from 0."""
        start, steps_before = self._resume_point(epoch)
        pending, self._pending = self._pending, None
        if pending is not None and pending["epoch"] < epoch and not pending["finished"]:
            left = self.plan.matched_rows - pending["rows_consumed"]
            warnings.warn(
                f"The checkpoint's data cursor stopped in epoch {pending['epoch']} with {left} of "
                f"{self.plan.matched_rows} rows unread, but the trainer resumes at epoch {epoch} (Lightning counts a "
                "run stopped by `max_steps` or `max_time` as a finished epoch). Those rows are skipped; epoch "
                f"{epoch} is read in full.",
                RuntimeWarning,
                stacklevel=2,
            )
        self.epoch = epoch
        self.layout = self.plan.layout(self.world_size, start)
        self.steps_before = steps_before
        self.yielded = 0
        self.consumed = None if self.consumed is None else 0
        return self.layout

    def on_yield(self) -> None:
        self.yielded += 1

    def on_step_end(self) -> None:
        """A training step finished on the latest yielded batch (reported by the callback)."""
        self.consumed = min(self.yielded, (self.consumed or 0) + 1)

    def _resume_point(self, epoch: int) -> tuple[int, int]:
        """(first sequence row, steps trained before) of ``epoch`` given the restored cursor."""
        pending = self._pending
        if pending is not None and pending["epoch"] == epoch:
            return pending["rows_consumed"], pending["steps"]
        return 0, 0

    def length(self, epoch: int, count_restored: bool = False) -> int:
        """This rank's batches when iterating ``epoch`` (while it is read: its own count).

        ``count_restored`` adds the steps trained before a restored cursor, as Lightning does.
        """
        if self.layout is not None and self.epoch == epoch and self._pending is None:
            steps, before = self.layout.rank_steps(self.rank), self.steps_before
        else:
            start, before = self._resume_point(epoch)
            steps = self.plan.layout(self.world_size, start).rank_steps(self.rank)
        return steps + before if count_restored else steps

    def full_length(self) -> int:
        """This rank's batches in a whole epoch."""
        return self.plan.layout(self.world_size).rank_steps(self.rank)

    def restored_epoch_differs(self) -> bool:
        """Whether the restored epoch's steps (before + after the checkpoint) differ from a whole
        epoch's: the batch size or world size changed since the checkpoint."""
        pending = self._pending
        if pending is None or pending["finished"]:
            return False
        return self.length(pending["epoch"], count_restored=True) != self.full_length()

    def describe_resume(self) -> str | None:
        """One line on where the restored epoch resumes and what its last step leaves out."""
        pending = self._pending
        if pending is None or pending["finished"]:
            return None
        layout = self.plan.layout(self.world_size, pending["rows_consumed"])
        line = (
            f"  resume: epoch {pending['epoch']} from row {pending['rows_consumed']:,} of "
            f"{self.plan.matched_rows:,} ({pending['steps']:,} step(s) done): {layout.steps:,} more step(s) "
            f"of {layout.step_rows:,} row(s)"
        )
        if layout.dropped_rows:
            line += f"; drop_last skips the last {layout.dropped_rows:,} row(s) of this epoch"
        return line

    # -- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        if self.layout is None or self.epoch is None:
            return {}
        done = self.consumed if self.consumed is not None else self.yielded
        return {
            "format": CURSOR_FORMAT,
            "epoch": self.epoch,
            "rows_consumed": self.layout.start + self.layout.rows_after(done),
            "steps": self.steps_before + done,
            "finished": done >= self.layout.steps,
            "plan": self.plan.identity(),
            "fingerprint": self.plan.fingerprint(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Validate ``state`` against the current plan and resume from it at the next epoch start.

        With ``resume=False`` the state is not checked and its epoch restarts at row 0 of the
        current plan (an unfinished epoch keeps its step count, which Lightning restores).
        """
        if not state:
            return
        if not self.resume:
            if state.get("finished", True) or "epoch" not in state:
                self._pending = None
                return
            self._pending = {
                "format": CURSOR_FORMAT,
                "epoch": state["epoch"],
                "rows_consumed": 0,
                "steps": int(state.get("steps", 0)),
                "finished": False,
                "plan": self.plan.identity(),
                "fingerprint": self.plan.fingerprint(),
            }
            return
        check_state(state, self.plan)
        self._pending = dict(state)


def check_state(state: dict[str, Any], plan: ReadPlan) -> None:
    """Raise `CursorMismatchError` naming the first field where ``state`` and ``plan`` differ."""
    if state.get("format") != CURSOR_FORMAT:
        raise CursorMismatchError("format", state.get("format"), CURSOR_FORMAT)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise CursorMismatchError("keys", sorted(state), list(STATE_KEYS))
    field = first_difference(state["plan"], plan.identity(), "plan")
    if field is not None:
        raise CursorMismatchError(*field)
    if not 0 <= state["rows_consumed"] <= plan.matched_rows:
        raise CursorMismatchError("rows_consumed", state["rows_consumed"], f"0..{plan.matched_rows}")


#: Plan fields compared first, so that a mismatch names the most telling one.
_FIRST_FIELDS = ("uri", "version", "filter", "columns", "sources", "names", "weights", "block", "epoch_rule", "shuffle")


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


def repin_target(
    state: dict[str, Any], plan: ReadPlan, configured_version: int | None, materialized: bool
) -> tuple[str, Any] | None:
    """Where the train split must be re-pinned to resume ``state`` exactly, or None to keep ``plan``.

    ``("view", uri)``: the checkpoint read another materialized view (views are kept when the source
    moves on). ``("version", v)``: it read version ``v`` of the same source and no version was
    configured, so the latest version the split pinned is not the one the cursor counts rows of.
    """
    saved = state.get("plan", {})
    current = plan.source
    if materialized:
        return ("view", saved["uri"]) if saved.get("uri") not in (None, current.uri) else None
    if (
        saved.get("uri") == current.uri
        and saved.get("version") not in (None, current.version)
        and configured_version is None
    ):
        return ("version", saved["version"])
    return None
