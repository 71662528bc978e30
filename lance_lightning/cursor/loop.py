"""Lightning's loop counters beside the data position: counted while training, normalized on restore.

Guarantees:
- `LoopCounters` are Lightning's side of the cursor (a saved state's
  `lance_lightning.cursor.position.LOOP_KEYS`), kept apart from the data position: the trainer
  epoch being read, the steps trained before it began (a restored state's), the steps the trainer
  planned for it, and the batches of it a checkpoint may call trained: those the loader yielded,
  or (once `DataCursorCheckpoint` reports them) those whose training step ended, never a batch
  whose step is still running (``in_flight``, read from the trainer), nor, once a fit stopped on
  an exception, the batch that was in flight then (`LoopCounters.settle`), whatever the trainer
  runs next.
- `normalize_loop_state` rewrites, in the checkpoint Lightning is restoring, only the fit loop's
  progress counters, and only in the two cases where Lightning's own restart would not follow on
  from the data (Lightning 2.6, ``loops/fit_loop.py`` and ``loops/training_epoch_loop.py``):

  1. **An epoch cut short by a stop** (``max_steps``, ``max_time``, ``should_stop``): Lightning
     counts it finished, so a resume from ``last.ckpt`` or from ``trainer.save_checkpoint`` after
     the fit starts the next epoch and ``max_epochs`` is reached before the rest of the stopped
     epoch is trained. The counters become those Lightning saves at the end of the same training
     step inside the epoch (as ``ModelCheckpoint(every_n_train_steps=...)`` writes them): the
     resumed fit trains the rest of that epoch, then every later epoch whole.
  2. **An epoch read to its end**, also saved at the end of its last step (``is_last_batch``):
     Lightning carries the epoch's batch count over as the next epoch's first batch index (with
     ``max_steps`` set, or when the next epoch is longer: another batch size) and stops that epoch
     early, or runs it without a batch; saved in ``on_train_epoch_end`` (the epoch processed, not
     yet completed) and restarted, Lightning runs that epoch again. The counters become those of
     the finished, completed epoch, with the current epoch's batch counters at zero, as Lightning
     sets them at any epoch start.

- Which case applies is read from the saved data cursor (its trainer epoch, the steps it trained
  and the steps the trainer had planned), never guessed from Lightning's counters alone; a state
  whose counters disagree with the cursor is left as it is.
- Nothing else of the checkpoint changes: weights, optimizer and scheduler states, callbacks.
  (An epoch-interval LR scheduler stepped when the stop ended the epoch: that step is kept.)
- Pure: no I/O, and no Lightning; the trainer is read by duck typing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lance_lightning.cursor.position import LOOP_KEYS

_COUNTERS = ("ready", "started", "processed", "completed")


class LoopCounters:
    """Lightning's loop counters at the cursor's data position (see the module docstring)."""

    def __init__(self) -> None:
        self.trainer_epoch: int | None = None
        self.steps_before = 0
        self.epoch_steps = 0
        self.yielded = 0
        self.consumed: int | None = None  # counted once a callback reports finished steps
        #: Batches handed out whose step has not ended (a trainer's count; None: none are).
        self.in_flight: Callable[[], int] | None = None

    def start_epoch(self, trainer_epoch: int, steps_before: int, epoch_steps: int) -> None:
        """Count ``trainer_epoch`` from its batch ``steps_before``, of ``epoch_steps`` planned."""
        self.trainer_epoch, self.steps_before, self.epoch_steps = trainer_epoch, steps_before, epoch_steps
        self.yielded = 0
        self.consumed = None if self.consumed is None else 0

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

    def settle(self) -> None:
        """The fit stopped on an exception: the batches then in flight were never trained, for good.
        They are handed back (no longer yielded) and the trainer is no longer asked, whose counters
        stop saying so once it runs anything else (``test``, ``validate`` after the failed fit);
        the loader asks it again at its next iteration."""
        if self.in_flight is not None:
            self.yielded -= min(self.yielded, self.in_flight())
            self.consumed = None if self.consumed is None else min(self.consumed, self.yielded)
            self.in_flight = None

    def done(self) -> int:
        """The batches of the epoch trained so far, since ``steps_before``."""
        done = self.consumed if self.consumed is not None else self.yielded
        if self.in_flight is not None:  # a checkpoint written while a step runs (an exception in it)
            done = min(done, self.yielded - self.in_flight())
        return done


def normalize_loop_state(checkpoint: dict[str, Any] | None, cursor: Any) -> str | None:
    """Rewrite ``checkpoint``'s fit loop counters in place (see the module docstring).

    ``cursor`` is the saved train cursor (plain types, possibly damaged: then only case 2 is
    applied, from Lightning's counters). Returns one line when an epoch cut short now resumes
    inside it, or when it cannot (its counters disagree with the cursor), else None.
    """
    fit = _fit_loop(checkpoint)
    if checkpoint is None or fit is None:
        return None
    epochs, batches = fit["epoch_progress"], fit["epoch_loop.batch_progress"]
    ended, done = epochs["current"], batches["current"]
    if batches.get("is_last_batch") is True and _at_last_step(ended, done):
        _close_epoch(checkpoint, fit)
    if not ended["ready"] == ended["started"] == ended["processed"] >= 1:
        return None  # saved inside an epoch: Lightning resumes inside it
    epoch = ended["processed"] - 1
    counts = _cursor_counts(cursor)
    cut = counts if counts is not None and counts[0] == epoch and counts[1] < counts[2] else None
    if cut is not None and _stopped_at(done, cut[1]):
        _reopen_epoch(checkpoint, fit, epoch)
        return (
            f"  resume: the checkpoint was written after a stop ended trainer epoch {epoch} at step "
            f"{cut[1]:,} of {cut[2]:,} (Lightning counts it finished): the rest of it is trained first"
        )
    saved = dict(done)
    _start_next_epoch(checkpoint, fit)
    if cut is not None:
        return (
            f"  resume: trainer epoch {epoch} ended at step {cut[1]:,} of {cut[2]:,} and Lightning's "
            f"batch counters {saved} do not say where: its last {cut[2] - cut[1]:,} step(s) are not trained"
        )
    return None


def loaded_checkpoint(trainer: Any) -> dict[str, Any] | None:
    """The checkpoint ``trainer`` is restoring: Lightning restores its loops from this dict after
    the data module's ``load_state_dict``, so a change made here is what the loops resume from."""
    connector = getattr(trainer, "_checkpoint_connector", None)
    return getattr(connector, "_loaded_checkpoint", None)


def _fit_loop(checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fit loop's state in ``checkpoint`` when it has the counters this module reads."""
    loops = checkpoint.get("loops") if isinstance(checkpoint, dict) else None
    fit = loops.get("fit_loop") if isinstance(loops, dict) else None
    if fit is None:
        return None
    try:
        for name in ("epoch_progress", "epoch_loop.batch_progress"):
            for part in ("current", "total"):
                if not all(isinstance(fit[name][part][key], int) for key in _COUNTERS):
                    return None
    except (KeyError, TypeError):
        return None
    return fit


def _cursor_counts(cursor: Any) -> tuple[int, int, int] | None:
    """(trainer epoch, steps trained, steps planned) of a saved cursor, None when it has none."""
    if not isinstance(cursor, dict):
        return None
    counts = tuple(cursor.get(key) for key in LOOP_KEYS)
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in counts):
        return None
    return counts  # type: ignore[return-value]


def _stopped_at(done: dict[str, int], steps: int) -> bool:
    """Whether the epoch's batch counters say it stopped cleanly after batch ``steps``."""
    return done["ready"] == done["started"] == done["processed"] == done["completed"] == steps > 0


def _at_last_step(epochs: dict[str, int], batches: dict[str, int]) -> bool:
    """Whether the counters are those saved at the end of an epoch's last step, inside the epoch."""
    inside = epochs["ready"] == epochs["started"] == epochs["processed"] + 1
    return inside and batches["ready"] == batches["started"] == batches["processed"] == batches["completed"] + 1


def _close_epoch(checkpoint: dict[str, Any], fit: dict[str, Any]) -> None:
    """The counters Lightning saves once the epoch whose last step ended is finished."""
    for part in ("current", "total"):
        epochs = fit["epoch_progress"][part]
        epochs["processed"] += 1
        epochs["completed"] = epochs["processed"]
        batches = fit["epoch_loop.batch_progress"][part]
        batches["completed"] = batches["processed"]
    stepped = fit.get("epoch_loop.state_dict", {})
    if isinstance(stepped.get("_batches_that_stepped"), int):
        stepped["_batches_that_stepped"] += 1
    checkpoint["epoch"] = fit["epoch_progress"]["current"]["completed"]


def _start_next_epoch(checkpoint: dict[str, Any], fit: dict[str, Any]) -> None:
    """The finished epoch counted completed (a checkpoint written in ``on_train_epoch_end`` holds it
    processed, not completed: restarted so, Lightning runs that epoch again), and the next epoch's
    batch counters at zero."""
    for part in ("current", "total"):
        epochs = fit["epoch_progress"][part]
        epochs["completed"] = epochs["processed"]
    checkpoint["epoch"] = fit["epoch_progress"]["current"]["completed"]
    batches = fit["epoch_loop.batch_progress"]
    for key in _COUNTERS:
        batches["current"][key] = 0
    batches["is_last_batch"] = False


def _reopen_epoch(checkpoint: dict[str, Any], fit: dict[str, Any], epoch: int) -> None:
    """The counters Lightning saves at the end of the same step inside ``epoch``."""
    for part in ("current", "total"):
        epochs = fit["epoch_progress"][part]
        epochs["processed"] -= 1
        epochs["completed"] = epochs["processed"]
        batches = fit["epoch_loop.batch_progress"][part]
        batches["completed"] = batches["processed"] - 1
    stepped = fit.get("epoch_loop.state_dict", {})
    if isinstance(stepped.get("_batches_that_stepped"), int):
        stepped["_batches_that_stepped"] -= 1
    checkpoint["epoch"] = epoch
