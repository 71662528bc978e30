"""Two ordinary steps composed in one script: each test is a defect that the contract checker (or an
outside check) found where two steps meet, through ``Trainer.fit``, 2-rank DDP or the CLI.

Each fails on the code before its fix (named in the test's docstring); `tests/contract/cases.jsonl`
keeps the scenario the checker found it with.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torch.utils.data import DataLoader

from lance_lightning import ConfigError, LanceDataModule, LanceMixture, LanceSource, NoShuffle, RowShuffle
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from tests.contract.oracle import check
from tests.contract.runner import run_scenario
from tests.contract.scenario import Checkpoints, Loop, Resume, Scenario, Shuffle, Source, Stop, Table, Topology
from tests.harness import ckpt_dir, ckpt_file, fit
from tests.helpers import RecordingModel, flat, make_table, write_dataset


# -- planning before fit ----------------------------------------------------------------------------------
def _events(run: Any, role: str, kind: str, rank: int) -> list[dict[str, Any]]:
    return [e for e in run.phases[role].ranks[rank] if e["t"] == kind]


@pytest.mark.soak  # the same 2-rank scenario runner replays this defect: cases.jsonl planning-before-fit-ddp(-resume)
@pytest.mark.slow
def test_planning_before_fit_under_ddp(tmp_path: Path) -> None:
    """``dm.explain()`` and ``dm.setup("fit")`` before ``trainer.fit`` on 2 gloo ranks (2,000 rows,
    batch 50, RowShuffle). Before the fix the cursor kept 1 rank: each rank trained 20 steps while
    Lightning took the epoch as 40, the final cursor said 1,000 rows and not finished, and a
    checkpoint at step 20 resumed rows 1,000-1,999 a second time."""
    scenario = Scenario(
        id=1,
        tables=[Table(rows=2000, fragment_rows=512)],
        source=Source(0, None),
        shuffle=Shuffle("row", seed=11),
        topology=Topology(world_size=2, batch_size=50),
        loop=Loop(epochs=3),
        stop=Stop("max_steps", 10),
        checkpoints=Checkpoints(every=5),
        resume=Resume(topology=Topology(world_size=2, batch_size=50), calls=["explain", "setup"]),
        calls=["explain", "setup"],
    )
    run = run_scenario(scenario, tmp_path)
    assert check(run) == []
    for rank in (0, 1):
        per_epoch = Counter(e["epoch"] for e in _events(run, "resume", "batch", rank))
        assert per_epoch == {0: 10, 1: 20, 2: 20}, per_epoch  # the rest of epoch 0, then whole epochs
        lengths = {e["epoch"]: e["num_training_batches"] for e in _events(run, "resume", "epoch", rank)}
        assert set(lengths.values()) == {20}, lengths
        final = _events(run, "resume", "end", rank)[0]["cursor"]
        assert (final["epoch"], final["rows_consumed"]) == (2, 2000)
    trained = [u for rank in (0, 1) for e in _events(run, "stop", "batch", rank) for u in e["units"]]
    trained += [
        u for rank in (0, 1) for e in _events(run, "resume", "batch", rank) if e["epoch"] == 0 for u in e["units"]
    ]
    assert sorted(trained) == list(range(2000))  # epoch 0: every row once across the stop


@pytest.mark.soak  # replayed by cases.jsonl fit-check-skipped-when-planned-before-fit (same runner, 2 ranks)
@pytest.mark.slow
def test_split_too_small_for_the_ranks_is_refused_when_planned_before_fit(tmp_path: Path) -> None:
    """8 matching rows, batch 5 on 2 ranks with drop_last, ``explain()`` before fit: a ConfigError
    naming ``batch_size`` on every rank. Before the fix planning at 1 rank skipped the check."""
    scenario = Scenario(
        id=2,
        tables=[Table(rows=100)],
        source=Source(0, "id < 8"),
        shuffle=Shuffle("none"),
        topology=Topology(world_size=2, batch_size=5),
        loop=Loop(epochs=2),
        stop=Stop("max_steps", 1),
        checkpoints=Checkpoints(),
        resume=Resume(topology=Topology(world_size=2, batch_size=5)),
        calls=["explain"],
    )
    run = run_scenario(scenario, tmp_path)
    assert check(run) == []
    errors = [_events(run, "stop", "error", rank) for rank in (0, 1)]
    assert errors[0] and "`batch_size`=5" in errors[0][0]["message"], errors


def test_a_split_too_small_is_refused_after_explain_when_the_loader_is_built(tmp_path: Path) -> None:
    """``explain()`` then ``next(iter(dm.train_dataloader()))`` on 5 matching rows, batch 8 with
    drop_last: a ConfigError naming ``batch_size``. Before the fix ``explain`` planned the split
    without the check and the loader, finding it planned, skipped it too: a bare StopIteration
    (found by the contract checker, seed 20316)."""
    uri = write_dataset(tmp_path / "ds.lance", 44)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id"], filter="label = 3"), batch_size=8, drop_last=True, shuffle=NoShuffle()
    )
    assert "0 per rank" in dm.explain("train")  # explain describes it, without refusing
    with pytest.raises(ConfigError) as refused:
        next(iter(dm.train_dataloader()))
    assert refused.value.param == "batch_size" and "drop_last leaves no batch" in str(refused.value)
    with pytest.raises(ConfigError):
        fit(tmp_path, dm, name="small")


def test_loader_built_before_a_resumed_fit(tmp_path: Path) -> None:
    """``dm.train_dataloader()`` (and a peeked batch) before ``fit(ckpt_path=...)``. Before the fix
    the loader built without a trainer was kept: it counted its own epochs and, restored at the
    checkpoint's finished epoch, the whole resumed run trained 0 batches."""
    uri = write_dataset(tmp_path / "ds.lance", 120)

    def dm() -> LanceDataModule:
        return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10, shuffle=RowShuffle(seed=2))

    whole = fit(tmp_path, dm(), name="whole", max_epochs=3)
    stopped = fit(tmp_path, dm(), name="stop", ckpt_every=6, max_steps=15, max_epochs=3)
    resumed_dm = dm()
    next(iter(resumed_dm.train_dataloader()))  # a user peeks at a batch before resuming
    resumed = fit(tmp_path, resumed_dm, name="resume", ckpt_path=ckpt_file(tmp_path, "stop", 12), max_epochs=3)
    assert stopped.seen[:12] + resumed.seen == whole.seen
    assert resumed.seen_epochs == [1] * 12 + [2] * 12


# -- mixtures -------------------------------------------------------------------------------------------------
OFFSET = 100_000


def _mixture_uris(tmp_path: Path, rows_a: int, rows_b: int) -> tuple[str, str]:
    a, b = str(tmp_path / "a.lance"), str(tmp_path / "b.lance")
    lance.write_dataset(make_table(rows_a), a, max_rows_per_file=700)
    lance.write_dataset(make_table(rows_b, start=OFFSET), b)
    return a, b


def test_mixture_draws_follow_each_sources_order(tmp_path: Path) -> None:
    """Through ``Trainer.fit``: a slot takes its source's next draw. Before the fix, under NoShuffle a
    source's rows came permuted within each block (0, 3, 4, 5, 6, 9, 1, ...), and ``samples`` below
    ``block`` drew a random subset of the block's draws: a 2,400-row source drawn 200 times gave
    198 distinct rows."""
    a, b = _mixture_uris(tmp_path, 2400, 2400)
    mixture = LanceMixture(
        [LanceSource(a, columns=["id", "x"]), LanceSource(b, columns=["id", "x"])],
        weights=[1, 1],
        epoch="samples",
        samples=400,
        block=1000,
    )
    dm = LanceDataModule(train=mixture, batch_size=20, shuffle=NoShuffle())
    model = fit(tmp_path, dm, name="mix", max_epochs=2)
    for epoch in (0, 1):
        ids = [i for step, e in zip(model.seen, model.seen_epochs) if e == epoch for i in step]
        first = [i for i in ids if i < OFFSET]
        second = [i - OFFSET for i in ids if i >= OFFSET]
        assert first == list(range(len(first))) and second == list(range(len(second)))  # storage order, no gap
        assert len(first) + len(second) == 400

    shuffled = LanceDataModule(train=mixture, batch_size=20, shuffle=RowShuffle(seed=3))
    ids = flat(fit(tmp_path, shuffled, name="mix-shuffled", max_epochs=1).seen)
    assert len(ids) == 400 and len(set(ids)) == 400  # no row twice inside the partial block


# -- the dataset behind the loader -------------------------------------------------------------------------
def test_dataset_behind_the_loader_yields_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dm.train_dataloader().dataset`` iterated directly, or by a plain DataLoader with workers,
    yields batches; a fit whose workers read every batch (the hand-over off) still receives its
    workers' figures. Before the fix the loader switched the user's dataset to yield internal
    ``Shipment`` tuples."""
    uri = write_dataset(tmp_path / "ds.lance", 200)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=20, num_workers=2)
    dataset = dm.train_dataloader().dataset
    first = next(iter(dataset))
    assert isinstance(first, dict) and first["id"].tolist() == list(range(20))
    plain = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    batches = list(plain)
    assert all(isinstance(batch, dict) for batch in batches)
    assert sorted(int(i) for batch in batches for i in batch["id"]) == list(range(200))

    monkeypatch.setenv(HANDOFF, "off")
    model = fit(tmp_path, dm, name="workers", max_epochs=1)
    assert flat(model.seen) == list(range(200))
    assert dm.train_dataloader().metrics_snapshot().totals["read_rows"] == 200  # measured in the workers


# -- checkpoints Lightning writes at awkward moments -------------------------------------------------------------
def test_exception_checkpoint_without_the_callback_is_exact(tmp_path: Path) -> None:
    """``OnExceptionCheckpoint`` writes a checkpoint while the step of batch 7 raises, without
    ``DataCursorCheckpoint``. Before the fix the data module counted that batch as trained: the
    resume skipped it."""
    uri = write_dataset(tmp_path / "ds.lance", 200)

    def dm() -> LanceDataModule:
        return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10, shuffle=RowShuffle(seed=5))

    class Raising(RecordingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if len(self.seen) == 7:
                raise RuntimeError("the step of batch 7 fails")
            return super().training_step(batch, batch_idx)

    whole = fit(tmp_path, dm(), name="whole", max_epochs=2, cursor_callback=False)
    crashed = Raising()
    on_exception = OnExceptionCheckpoint(dirpath=str(ckpt_dir(tmp_path, "crash")), filename="crash")
    with pytest.raises(RuntimeError, match="batch 7 fails"):
        fit(
            tmp_path,
            dm(),
            name="crash",
            model=crashed,
            callbacks=[on_exception],
            max_epochs=2,
            cursor_callback=False,
            enable_checkpointing=True,
        )
    resumed = fit(
        tmp_path,
        dm(),
        name="resume",
        ckpt_path=ckpt_dir(tmp_path, "crash") / "crash.ckpt",
        max_epochs=2,
        cursor_callback=False,
    )
    assert crashed.seen[:7] + resumed.seen == whole.seen


def test_checkpoint_at_an_epochs_last_step_resumes_whole_epochs(tmp_path: Path) -> None:
    """A checkpoint written at the last step of epoch 0 (batch 10: 4 steps), resumed with batch 5
    (8 steps an epoch). Lightning carries the restored epoch's 4 into the new epoch's batch index;
    before the fix the loader's length ignored it and epoch 1 ended after 4 of its 8 batches."""
    uri = write_dataset(tmp_path / "ds.lance", 40)

    def dm(batch_size: int) -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(uri, columns=["id", "x"]), batch_size=batch_size, shuffle=RowShuffle(seed=1)
        )

    fit(tmp_path, dm(10), name="A", ckpt_every=4, max_epochs=1)
    resumed = fit(tmp_path, dm(5), name="B", ckpt_path=ckpt_file(tmp_path, "A", 4), max_epochs=3)
    whole = fit(tmp_path, dm(5), name="whole", max_epochs=3)
    assert resumed.seen_epochs == [1] * 8 + [2] * 8
    assert resumed.seen == whole.seen[8:]  # epochs 1 and 2 exactly as a run with batch 5


def test_resume_after_max_steps_continues_the_stopped_epoch(tmp_path: Path) -> None:
    """``max_steps=13`` stops in epoch 1 (10 steps an epoch); the checkpoint written after ``fit``
    resumes with ``max_steps=30``. Lightning counts epoch 1 as finished; before the fix the data
    did too (70 of its rows skipped, with a warning). Now the 30 steps are exactly those of an
    uninterrupted run to 30 steps, and the trainer resumes inside epoch 1 (its loop state is
    normalized on restore), so its epochs are the data's."""
    uri = write_dataset(tmp_path / "ds.lance", 100)

    def dm() -> LanceDataModule:
        return LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10, shuffle=RowShuffle(seed=1))

    whole = fit(tmp_path, dm(), name="whole", max_steps=30, max_epochs=10)
    stopped_dm = dm()
    stopped = fit(tmp_path, stopped_dm, name="stop", max_steps=13, max_epochs=10)
    final = tmp_path / "final.ckpt"
    stopped_dm.trainer.save_checkpoint(final)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = fit(tmp_path, dm(), name="resume", ckpt_path=final, max_steps=30, max_epochs=10)
    assert stopped.seen + resumed.seen == whole.seen
    assert not [w for w in caught if "data cursor" in str(w.message)]
    assert Counter(resumed.seen_epochs) == {1: 7, 2: 10}  # Lightning's epochs are the data's


def test_an_epoch_lightning_skips_after_a_restart_loses_no_data(tmp_path: Path) -> None:
    """``last.ckpt`` written at the end of epoch 0 (``max_steps`` reached there, validation every
    half epoch), resumed with ``max_steps`` set: Lightning restores the epoch's ``is_last_batch`` and
    would run epoch 1 without a batch. Before the first fix the data followed Lightning's epoch
    number, so data epoch 1 was never read; now the restored loop state starts epoch 1 as any epoch
    starts, and trainer epoch e reads data epoch e."""
    uri = write_dataset(tmp_path / "ds.lance", 5)

    def dm() -> LanceDataModule:
        source = LanceSource(uri, columns=["id", "x"])
        return LanceDataModule(train=source, val=source, batch_size=5, drop_last=False, shuffle=RowShuffle(seed=1))

    loop = dict(val_check_interval=0.5, limit_val_batches=None)
    whole = fit(tmp_path, dm(), name="whole", max_epochs=4, **loop)
    last = ModelCheckpoint(dirpath=str(ckpt_dir(tmp_path, "stop")), every_n_train_steps=2, save_last=True)
    stopped = fit(
        tmp_path, dm(), name="stop", max_steps=1, max_epochs=4, callbacks=[last], enable_checkpointing=True, **loop
    )
    resumed = fit(
        tmp_path,
        dm(),
        name="resume",
        ckpt_path=ckpt_dir(tmp_path, "stop") / "last.ckpt",
        max_steps=10_000,
        max_epochs=4,
        **loop,
    )
    assert resumed.seen_epochs == [1, 2, 3]  # no epoch without a batch
    assert stopped.seen + resumed.seen == whole.seen  # data epochs 0 to 3, in order


def test_a_checkpoint_saved_after_a_failed_fit_and_a_validate_resumes_its_batch_in_flight(tmp_path: Path) -> None:
    """The step of batch 7 raises (no ``OnExceptionCheckpoint``, no ``DataCursorCheckpoint``); the
    script then validates on the same trainer and saves a checkpoint. Before the fix the trainer's
    count of batches in flight read 0 once it had validated, so the cursor counted batch 7 as
    trained and the resume skipped it (soak seed 1639: a failed fit, then ``test`` and ``predict``)."""
    import lightning.pytorch as pl

    uri = write_dataset(tmp_path / "ds.lance", 200)

    def dm() -> LanceDataModule:
        source = LanceSource(uri, columns=["id", "x"])
        return LanceDataModule(train=source, val=source, batch_size=10, shuffle=RowShuffle(seed=5))

    class Raising(RecordingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if len(self.seen) == 7:
                raise RuntimeError("the step of batch 7 fails")
            return super().training_step(batch, batch_idx)

    whole = fit(tmp_path, dm(), name="whole", max_epochs=2, cursor_callback=False, limit_val_batches=0)
    crashed, module = Raising(), dm()
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="batch 7 fails"):
        trainer.fit(crashed, datamodule=module)
    trainer.validate(crashed, datamodule=module, verbose=False)
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    resumed = fit(
        tmp_path, dm(), name="resume", ckpt_path=tmp_path / "after.ckpt", max_epochs=2, cursor_callback=False,
        limit_val_batches=0,
    )  # fmt: skip
    assert crashed.seen[:7] + resumed.seen == whole.seen
