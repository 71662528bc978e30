"""The data position a checkpoint saves, and its strict validation against the current plan.

Guarantees:
- The saved state is a small versioned dict of plain types (loads with ``weights_only=True``), of
  constant size whatever the dataset size::

      {"format": 5, "epoch": int, "rows_consumed": int, "trainer_epoch": int, "steps": int,
       "epoch_steps": int, "plan": {"uri", "version", "data", "columns", "filter", "shuffle", "rows"[, "packing"]}}

  The data position is ``epoch``, the data epoch being read (its order),
  ``rows_consumed``, the units of its sequence already trained (rows; windows with packing; draws
  for a mixture), and ``plan``, the identity of the plan they count in. `LOOP_KEYS` are
  Lightning's loop counters at that position (`lance_lightning.cursor.loop`): the trainer's epoch,
  the batches it counted in it and the batches it planned for it. An epoch is finished when
  ``rows_consumed == plan["rows"]`` (`finished`): derived, never stored.
- Nothing in it depends on the world size, the batch size or the number of DataLoader workers: a
  run restored on another topology starts its layout at ``rows_consumed`` (`lance_lightning.plan.layout`).
- Validation is strict (`check_state`): any plan field that differs raises `CursorMismatchError`
  naming the field (`first_difference`), and a state that is not a cursor (damaged or edited)
  raises `ConfigError` naming its field. `fresh_start` is the one state trusted without checks
  (``resume_data=False``): the saved trainer epoch read again from its first unit.
- Pure: no I/O, and no Lightning (DataLoader workers import it).
"""

from __future__ import annotations

from typing import Any

from lance_lightning.errors import ConfigError, CursorMismatchError
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.mixture_plan import MixturePlan

#: Bumped whenever the meaning of a state or the epoch order of a plan changes (3: every
#: permutation is a keyed bijection; 4: a mixture slot takes its source's next draw; 5: trainer
#: epoch ``e`` always reads data epoch ``e``), so that an older checkpoint is refused instead of
#: resuming at the same row count of a different order.
CURSOR_FORMAT = 5
#: Lightning's loop counters at the data position: trainer epoch, steps trained, steps planned.
LOOP_KEYS = ("trainer_epoch", "steps", "epoch_steps")
#: The data position (format, data epoch, units consumed, plan identity) with the loop counters.
STATE_KEYS = ("format", "epoch", "rows_consumed", *LOOP_KEYS, "plan")


def finished(state: dict[str, Any]) -> bool:
    """Whether the data epoch of ``state`` was read to its end."""
    return state["rows_consumed"] >= state["plan"]["rows"]


def fresh_start(state: dict[str, Any], plan: Plan) -> dict[str, Any] | None:
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


def check_state(state: dict[str, Any], plan: Plan) -> None:
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
    # A mixture's resume policy may accept other weights or another schedule (`MixturePlan.resume_identity`).
    saved = plan.resume_identity(state["plan"]) if isinstance(plan, MixturePlan) else state["plan"]
    field = first_difference(saved, plan.identity(), "plan")
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
