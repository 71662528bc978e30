"""Exact mid-epoch resume: checkpoint at step k, resume, and the epoch is trained exactly once.

What the tests establish: the resumed run trains exactly the rest of the epoch, in the
uninterrupted order, for every shuffle strategy, with and without a filter, in the first and the
second epoch, with worker processes, and without `DataCursorCheckpoint` (the data module's state is
enough; stale cursor copies of earlier versions are ignored); and Lightning's pitfalls change
nothing: batches fetched ahead, ``estimated_stepping_batches`` (#20550), a checkpoint at an epoch's
end, validation in between (the table in docs/checkpoints.md).

Every test trains with a real Trainer on a real Lance dataset (the `uri` fixture of
tests/scenarios/conftest.py: 300 rows in 3 fragments) and resumes from a real checkpoint file.
Run A trains to step k (``max_steps=k``) and saves ``step=k.ckpt`` with
``ModelCheckpoint(every_n_train_steps=k)``; run B resumes from it; run C trains uninterrupted.
Exact means: A's first k batches followed by B's batches equal C's batches, same ids, same order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.cursor.position import finished
from lance_lightning.cursor.tracker import CursorTracker
from tests.harness import (
    BATCH,
    DM_KEY,
    FILTER,
    ROWS,
    assert_epoch_once,
    assert_exact,
    ckpt_file,
    epoch_batches,
    fit,
    make_dm,
    matching_ids,
    run_resume,
)
from tests.helpers import RecordingModel, assert_one_saved_cursor, flat, write_dataset

STRATEGIES = ["none", "shard:32:1", "row:2", "row:2:4", "buffer:64:16:3"]
FILTERS = [None, FILTER]


# -- 1. exact resume for every strategy, with and without a filter ---------------------------------
@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_mid_epoch_resume_is_exact(tmp_path: Path, uri: str, shuffle: str, filter: str | None) -> None:
    k = 7
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k)
    assert len(a.seen) == k
    assert_exact(a.seen, b.seen, c.seen, k)
    assert_epoch_once(flat(c.seen), uri, filter, BATCH)
    assert b.seen_epochs == [0] * len(b.seen)


@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_resume_in_second_epoch_is_exact(tmp_path: Path, uri: str, shuffle: str, filter: str | None) -> None:
    steps_per_epoch = len(matching_ids(uri, filter)) // BATCH
    k = steps_per_epoch + 4  # 4 steps into epoch 1
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k, max_epochs=2)
    assert c.seen_epochs == [0] * steps_per_epoch + [1] * steps_per_epoch
    assert_exact(a.seen, b.seen, c.seen, k)
    assert b.seen_epochs == [1] * (steps_per_epoch - 4)
    first, second = epoch_batches(c, 0), epoch_batches(c, 1)
    for epoch in (first, second):
        assert_epoch_once(flat(epoch), uri, filter, BATCH)
    if shuffle == "none":
        assert first == second
    else:
        assert flat(first) != flat(second), "epoch 1 repeats epoch 0's order"


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_mid_epoch_resume_is_exact_with_workers(tmp_path: Path, uri: str, shuffle: str) -> None:
    k = 5
    a, b, c = run_resume(tmp_path, uri, shuffle, FILTER, k=k, num_workers=2)
    assert_exact(a.seen, b.seen, c.seen, k)
    assert_epoch_once(flat(c.seen), uri, FILTER, BATCH)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["shard:32:1", "row:2:4"])
def test_resume_in_second_epoch_with_workers(tmp_path: Path, uri: str, shuffle: str) -> None:
    steps_per_epoch = len(matching_ids(uri, FILTER)) // BATCH
    k = steps_per_epoch + 3
    a, b, c = run_resume(tmp_path, uri, shuffle, FILTER, k=k, num_workers=2, max_epochs=2)
    assert_exact(a.seen, b.seen, c.seen, k)
    assert flat(epoch_batches(c, 0)) != flat(epoch_batches(c, 1))


# -- 2. without the callback: the data module's own state is enough ---------------------------------
@pytest.mark.parametrize("max_epochs", [1, 2])
@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", ["shard:32:1", "row:2", "buffer:64:16:3"])
def test_resume_without_cursor_callback(
    tmp_path: Path, uri: str, shuffle: str, filter: str | None, max_epochs: int
) -> None:
    steps_per_epoch = len(matching_ids(uri, filter)) // BATCH
    k = 5 if max_epochs == 1 else steps_per_epoch + 2
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k, max_epochs=max_epochs, cursor_callback=False)
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert "DataCursorCheckpoint" not in ckpt.get("callbacks", {})
    cursor = ckpt[DM_KEY]["train_cursor"]  # steps and rows count within the cursor's epoch
    assert (cursor["epoch"], cursor["steps"], cursor["rows_consumed"]) == (
        max_epochs - 1,
        5 if max_epochs == 1 else 2,
        (5 if max_epochs == 1 else 2) * BATCH,
    )
    assert_exact(a.seen, b.seen, c.seen, k)


def test_copies_an_earlier_version_saved_beside_the_data_module_are_ignored(tmp_path: Path, uri: str) -> None:
    """Checkpoints of earlier versions held the cursor three times; the data module's copy is the one
    restored (once), so stale copies under the callback and the loop's loader state change nothing."""
    k = 5
    a = fit(tmp_path, make_dm(uri, "row:2"), name="A", ckpt_every=k)
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert_one_saved_cursor(ckpt)
    stale = {**ckpt[DM_KEY]["train_cursor"], "rows_consumed": 0, "steps": 0}
    ckpt["callbacks"]["DataCursorCheckpoint"] = stale
    ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] = [stale]
    edited = tmp_path / "earlier_layout.ckpt"
    torch.save(ckpt, edited)
    restores: list[dict[str, Any]] = []
    original = CursorTracker.restore

    def counted(self: CursorTracker, state: dict[str, Any]) -> None:
        restores.append(state)
        original(self, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CursorTracker, "restore", counted)
        b = fit(tmp_path, make_dm(uri, "row:2"), name="B", ckpt_path=edited)
    assert [state["steps"] for state in restores] == [k], "restored once, from the data module's copy"
    assert_exact(a.seen, b.seen, a.seen, k)


# -- 3. Lightning pitfalls --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_workers", "prefetch_factor"),
    [
        (0, 2),
        pytest.param(2, 4, marks=pytest.mark.slow),
    ],
    ids=["workers0", "workers2-prefetch4"],
)
@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
def test_saved_cursor_counts_only_trained_steps(
    tmp_path: Path, uri: str, num_workers: int, prefetch_factor: int, cursor_callback: bool
) -> None:
    """(a) Nothing fetched ahead (Lightning, workers, prefetch_factor) counts as consumed."""
    k, shuffle = 7, "shard:32:1"

    def dm() -> LanceDataModule:
        return make_dm(uri, shuffle, num_workers=num_workers, prefetch_factor=prefetch_factor)

    # Run A keeps training past step k, so batches after k were already fetched when step=k was saved.
    a = fit(tmp_path, dm(), name="A", ckpt_every=k, cursor_callback=cursor_callback)
    assert len(a.seen) == ROWS // BATCH
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert_one_saved_cursor(ckpt)
    state = ckpt[DM_KEY]["train_cursor"]
    assert (state["epoch"], state["steps"], state["rows_consumed"], finished(state)) == (0, k, k * BATCH, False), (
        f"cursor at step {k}: {state}"
    )
    b = fit(tmp_path, dm(), name="B", ckpt_path=ckpt_file(tmp_path, "A", k), cursor_callback=cursor_callback)
    assert_exact(a.seen, b.seen, a.seen, k)


@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
@pytest.mark.parametrize("max_epochs", [1, 2])
def test_resume_when_configure_optimizers_reads_estimated_stepping_batches(
    tmp_path: Path, uri: str, cursor_callback: bool, max_epochs: int
) -> None:
    """(b) #20550: Lightning skips ``loader.load_state_dict``; the resume must still be exact."""
    shuffle, steps_per_epoch = "row:2", len(matching_ids(uri, FILTER)) // BATCH
    k = 6 if max_epochs == 1 else steps_per_epoch + 6

    def run(name: str, **kwargs: Any) -> RecordingModel:
        model = RecordingModel(read_estimated_stepping_batches=True)
        return fit(
            tmp_path,
            make_dm(uri, shuffle, FILTER),
            name=name,
            model=model,
            max_epochs=max_epochs,
            cursor_callback=cursor_callback,
            **kwargs,
        )

    c = run("C")
    a = run("A", ckpt_every=k, max_steps=k)
    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", k))
    assert c.estimated_stepping_batches == steps_per_epoch * max_epochs
    assert b.estimated_stepping_batches is not None
    assert_exact(a.seen, b.seen, c.seen, k)


@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
@pytest.mark.parametrize(("max_steps", "max_epochs"), [(25, -1), (-1, 3)], ids=["max_steps", "max_epochs"])
def test_end_of_epoch_checkpoint_starts_next_epoch_in_full(
    tmp_path: Path, max_steps: int, max_epochs: int, cursor_callback: bool
) -> None:
    """(c) A checkpoint at the last step of epoch 0 resumes with a full, freshly shuffled epoch 1."""
    uri = write_dataset(tmp_path / "ds170.lance", 170)  # 10 batches of 16, 10 rows dropped per epoch
    shuffle = "row:2"

    def run(name: str, **kwargs: Any) -> RecordingModel:
        return fit(
            tmp_path,
            make_dm(uri, shuffle),
            name=name,
            max_steps=max_steps,
            max_epochs=max_epochs,
            cursor_callback=cursor_callback,
            **kwargs,
        )

    a = run("A", ckpt_every=10)  # uninterrupted; checkpoints at steps 10 and 20 (ends of epochs 0 and 1)
    expected_epochs = [0] * 10 + [1] * 10 + [2] * (5 if max_steps == 25 else 10)
    assert a.seen_epochs == expected_epochs
    cursor = torch.load(ckpt_file(tmp_path, "A", 10), weights_only=True)[DM_KEY]["train_cursor"]
    assert (cursor["epoch"], cursor["steps"], finished(cursor)) == (0, 10, True)

    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", 10))
    assert b.seen_epochs == expected_epochs[10:], "the epoch after an end-of-epoch checkpoint was not run in full"
    assert b.seen == a.seen[10:]
    epochs = [flat(epoch_batches(a, e)) for e in range(3)]
    for ids in epochs[:2]:
        assert len(ids) == 160 and len(set(ids)) == 160
    assert epochs[0] != epochs[1] and epochs[1][:80] != epochs[2][:80], "epochs repeat an order"


@pytest.mark.parametrize("k", [6, 8], ids=["between-val", "at-val"])
def test_resume_with_validation_in_between(tmp_path: Path, uri: str, k: int) -> None:
    """(d) ``val_check_interval`` below the epoch: validation runs between training checkpoints."""
    shuffle = "buffer:64:16:3"

    def run(name: str, **kwargs: Any) -> RecordingModel:
        dm = make_dm(uri, shuffle, FILTER, val=LanceSource(uri, filter="label >= 7"))
        return fit(tmp_path, dm, name=name, limit_val_batches=None, val_check_interval=4, **kwargs)

    c = run("C")
    a = run("A", ckpt_every=k, max_steps=k)
    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", k))
    assert_exact(a.seen, b.seen, c.seen, k)
    val_ids = matching_ids(uri, "label >= 7")
    assert c.val_seen and set(flat(c.val_seen)) == val_ids
    assert b.val_seen and set(flat(b.val_seen)) == val_ids
