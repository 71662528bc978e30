"""`normalize_loop_state`: which checkpoints' loop counters change, and to what (the Lightning runs
that show the result trains exactly are in tests/scenarios/test_loop_semantics.py)."""

from __future__ import annotations

import copy
from typing import Any

from lance_lightning.cursor.loop import normalize_loop_state


def _progress(ready: int, started: int, processed: int, completed: int) -> dict[str, int]:
    return {"ready": ready, "started": started, "processed": processed, "completed": completed}


def _checkpoint(epochs: dict[str, int], batches: dict[str, int], *, last: bool = False, epoch: int = 0) -> dict:
    return {
        "epoch": epoch,
        "loops": {
            "fit_loop": {
                "epoch_progress": {"current": dict(epochs), "total": dict(epochs)},
                "epoch_loop.batch_progress": {"current": dict(batches), "total": dict(batches), "is_last_batch": last},
                "epoch_loop.state_dict": {"_batches_that_stepped": batches["completed"]},
            }
        },
    }


def _cursor(steps: int, epoch_steps: int, trainer_epoch: int = 0) -> dict[str, Any]:
    return {"trainer_epoch": trainer_epoch, "steps": steps, "epoch_steps": epoch_steps}


def test_an_epoch_a_stop_cut_short_gets_the_counters_of_a_checkpoint_inside_it() -> None:
    ckpt = _checkpoint(_progress(1, 1, 1, 1), _progress(30, 30, 30, 30), epoch=1)
    note = normalize_loop_state(ckpt, _cursor(30, 120))
    fit = ckpt["loops"]["fit_loop"]
    assert fit["epoch_progress"]["current"] == _progress(1, 1, 0, 0)
    assert fit["epoch_loop.batch_progress"]["total"] == _progress(30, 30, 30, 29)
    assert fit["epoch_loop.state_dict"]["_batches_that_stepped"] == 29
    assert ckpt["epoch"] == 0
    assert note is not None and "step 30 of 120" in note


def test_an_epoch_read_to_its_end_starts_the_next_at_batch_zero() -> None:
    ckpt = _checkpoint(_progress(1, 1, 1, 1), _progress(60, 60, 60, 60), last=True, epoch=1)
    assert normalize_loop_state(ckpt, _cursor(60, 60)) is None
    batches = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert batches["current"] == _progress(0, 0, 0, 0) and batches["total"] == _progress(60, 60, 60, 60)
    assert batches["is_last_batch"] is False and ckpt["epoch"] == 1


def test_a_checkpoint_at_the_end_of_an_epochs_last_step_is_closed() -> None:
    ckpt = _checkpoint(_progress(1, 1, 0, 0), _progress(4, 4, 4, 3), last=True)
    normalize_loop_state(ckpt, _cursor(4, 4))
    fit = ckpt["loops"]["fit_loop"]
    assert fit["epoch_progress"]["total"] == _progress(1, 1, 1, 1) and ckpt["epoch"] == 1
    assert fit["epoch_loop.batch_progress"]["current"] == _progress(0, 0, 0, 0)
    assert fit["epoch_loop.batch_progress"]["total"] == _progress(4, 4, 4, 4)


def test_checkpoints_inside_an_epoch_and_foreign_states_are_left_alone() -> None:
    inside = _checkpoint(_progress(1, 1, 0, 0), _progress(20, 20, 20, 19))
    before = copy.deepcopy(inside)
    assert normalize_loop_state(inside, _cursor(20, 60)) is None and inside == before
    for foreign in (None, {}, {"loops": {"fit_loop": {"epoch_progress": "x"}}}):
        kept = copy.deepcopy(foreign)
        assert normalize_loop_state(foreign, _cursor(1, 2)) is None and foreign == kept


def test_a_cut_epoch_whose_counters_disagree_with_the_cursor_says_what_is_not_trained() -> None:
    ckpt = _checkpoint(_progress(1, 1, 1, 1), _progress(31, 31, 30, 30), epoch=1)
    note = normalize_loop_state(ckpt, _cursor(30, 120))
    assert note is not None and "last 90 step(s) are not trained" in note


def test_an_epoch_saved_processed_but_not_completed_is_completed() -> None:
    """``ModelCheckpoint``'s epoch-end save (in ``on_train_epoch_end``) holds the epoch processed but
    not completed: restarted with ``max_steps`` set, Lightning ran that epoch again (one data epoch
    lost in the contract checker's soak, scenario 3726)."""
    ckpt = _checkpoint(_progress(1, 1, 1, 0), _progress(60, 60, 60, 60), last=True, epoch=0)
    assert normalize_loop_state(ckpt, _cursor(60, 60)) is None
    fit = ckpt["loops"]["fit_loop"]
    assert fit["epoch_progress"]["current"] == _progress(1, 1, 1, 1) and ckpt["epoch"] == 1
    assert fit["epoch_loop.batch_progress"]["current"] == _progress(0, 0, 0, 0)
