"""Worker processes start in the background while the training process reads the first batches
(`lance_lightning.load.handoff`): the same batches in the same order, each read once, through a
plain loop, `Trainer.fit` with a stop and a resume, and a process that exits while workers start."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lance_lightning import LanceDataModule, LanceSource, RowShuffle
from lance_lightning.load.handoff import ENV_SWITCH, handover_step
from lance_lightning.load.race import CHOICE_SWITCH
from lance_lightning.plan.layout import Layout
from tests import zygote
from tests.helpers import RecordingModel, flat, write_dataset
from tests.worker_probe import RecordProcess

REPO_ROOT = Path(__file__).resolve().parents[3]
ROWS, BATCH = 12_000, 48  # 250 batches an epoch
#: Each batch read in the training process sleeps this long, so its workers, once up, are faster.
MAIN_DELAY_S = 0.02


@pytest.fixture(autouse=True)
def _workers_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests follow the hand-over to workers: the race's outcome is forced to them
    (`lance_lightning.load.race`; tests/unit/load/test_race.py covers both outcomes): the loader
    waits for them after each epoch's first batch."""
    monkeypatch.setenv(CHOICE_SWITCH, "workers")


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("handoff") / "ds.lance", rows=ROWS, fragment_rows=4096)


def _module(uri: str, workers: int, persistent: bool = True, transform: Any = None) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=3),
        num_workers=workers,
        persistent_workers=persistent,
        transform=transform,
    )


@pytest.fixture(scope="module")
def planned(uri: str) -> list[list[list[int]]]:
    """The batches of epochs 0-3 (their ids) read without workers: the reference every test here
    compares with, read once (an epoch's order depends on the seed and the epoch, not on how many
    epochs are read)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHOICE_SWITCH, "workers")  # as in every test (no worker reads it here)
        reference = _module(uri, 0)
        reference.setup("fit")
        loader = reference.train_dataloader()
        return [[batch["id"].tolist() for batch in loader] for _ in range(4)]


def _from_main_then_workers(pids: list[int]) -> bool:
    """Batches of this process first, then only workers' (at most one switch)."""
    main = [pid == os.getpid() for pid in pids]
    return main == sorted(main, reverse=True)


@given(
    start=st.integers(0, 5000),
    rows=st.integers(1, 5000),
    world=st.integers(1, 4),
    batch=st.integers(1, 64),
    least=st.integers(0, 300),
    window=st.one_of(st.none(), st.integers(1, 2000)),
)
def test_the_hand_over_starts_a_window_when_one_starts_soon(
    start: int, rows: int, world: int, batch: int, least: int, window: int | None
) -> None:
    layout = Layout(start=start, rows=rows, world_size=world, batch_size=batch, drop_last=False)
    least = min(least, layout.steps)
    step = handover_step(layout, least, window)
    starts = [s for s in range(least, layout.steps + 1) if window and (start + layout.rows_after(s)) % window == 0]
    soon = [s for s in starts if s <= least + (window or 0) // layout.step_rows + 1]
    assert step == (soon[0] if soon else least)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per epoch"])
def test_batches_come_from_this_process_until_the_workers_are_up(
    uri: str, planned: list[list[list[int]]], persistent: bool
) -> None:
    epochs = 4
    dm = _module(uri, 2, persistent, RecordProcess(MAIN_DELAY_S))
    dm.setup("fit")
    loader = dm.train_dataloader()
    sources = []
    for epoch in range(epochs):
        batches = [(batch["id"].tolist(), set(batch["pid"].tolist())) for batch in loader]
        assert [ids for ids, _ in batches] == planned[epoch], f"epoch {epoch}: rows lost, repeated or out of order"
        assert all(len(pids) == 1 for _, pids in batches)
        pids = [pids.pop() for _, pids in batches]
        assert _from_main_then_workers(pids), f"epoch {epoch}: this process read after its workers"
        sources.append(pids)
    assert sources[0][0] == os.getpid(), "the first batch waited for the workers"
    totals = loader.metrics_snapshot().totals  # this process's batches and the workers', once each
    assert totals["delivered_rows"] == sum(len(epoch) for epoch in planned) * BATCH
    assert totals["transform_rows"] >= totals["delivered_rows"]  # read ahead here, then handed over
    workers = {pid for pids in sources for pid in pids} - {os.getpid()}
    assert workers, f"the workers never took over in {epochs} epochs"
    if persistent:
        assert len(workers) == 2
    else:  # every epoch starts its workers, so every epoch begins in this process
        assert all(pids[0] == os.getpid() for pids in sources)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_off_waits_for_the_workers(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "off")
    dm = _module(uri, 2, True, RecordProcess())
    dm.setup("fit")
    pids = {pid for batch in dm.train_dataloader() for pid in batch["pid"].tolist()}
    assert os.getpid() not in pids and len(pids) == 2


class PidRecorder(RecordingModel):
    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self.pids.append(int(batch["pid"][0]))
        return super().training_step(batch, batch_idx)


def _trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fit_stopped_while_workers_start_resumes_exactly(
    uri: str, planned: list[list[list[int]]], tmp_path: Path
) -> None:
    """Stopped by ``max_steps`` while the first epoch is read in process (its first 3 batches: the
    workers take over after what this process read ahead), resumed with ``ckpt_path`` for two more
    epochs: every epoch trains each row once, in the planned order, as without workers."""
    planned = planned[:3]
    first = PidRecorder()
    trainer = _trainer(tmp_path, max_steps=3)
    trainer.fit(first, datamodule=_module(uri, 2, transform=RecordProcess(MAIN_DELAY_S)))
    ckpt = tmp_path / "stopped.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = PidRecorder()
    _trainer(tmp_path, max_epochs=3).fit(
        resumed, datamodule=_module(uri, 2, transform=RecordProcess(MAIN_DELAY_S)), ckpt_path=ckpt
    )
    trained = first.seen + resumed.seen
    assert trained == [batch for epoch in planned for batch in epoch], "rows lost, repeated or out of order"
    assert len(set(flat(trained[: len(planned[0])]))) == ROWS // BATCH * BATCH
    assert first.pids == [os.getpid()] * 3 and os.getpid() not in resumed.pids[-10:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_fit_that_stops_each_epoch_early_has_its_workers_read_after_the_first_batches(
    uri: str, planned: list[list[list[int]]], tmp_path: Path
) -> None:
    """``limit_train_batches=10`` (Lightning never asks past an epoch's 10th batch, far short of the
    race's window), workers started per epoch: in each of 3 epochs the workers read every batch
    after what this process read ahead of the first, and the fit trains the first 10 planned
    batches of each epoch in order. Before, each epoch was read whole in process and its workers
    never started."""
    model = PidRecorder()
    dm = _module(uri, 2, persistent=False, transform=RecordProcess())
    _trainer(tmp_path, max_epochs=3, limit_train_batches=10).fit(model, datamodule=dm)
    assert model.seen == [batch for epoch in planned[:3] for batch in epoch[:10]], "rows lost or out of order"
    for epoch in range(3):
        pids = model.pids[epoch * 10 : (epoch + 1) * 10]
        assert pids[0] == os.getpid() and _from_main_then_workers(pids), f"epoch {epoch}: {pids}"
        assert os.getpid() not in pids[-4:], f"epoch {epoch}: the workers did not take over: {pids}"


_EXITS_WHILE_STARTING = """
import sys
from lance_lightning import LanceDataModule, LanceSource
dm = LanceDataModule(train=LanceSource(sys.argv[1], columns=["id"]), batch_size=1000, num_workers=2)
dm.setup("fit")
batches = iter(dm.train_dataloader())
print(sum(len(next(batches)["id"]) for _ in range(3)))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_process_that_exits_while_its_workers_start_exits_cleanly(uri: str, tmp_path: Path) -> None:
    """The process reads 3 batches, its own (the workers, started after the first, begin after
    what it read ahead), and exits at once, its workers still starting: none is left failing to
    start after it is gone (the hand-over's first version printed their tracebacks). The process
    is forked from the test zygote where it can be (`tests.zygote`: a fresh process's exit and
    output, less the imports; the zygote never starts a fork server)."""
    script = tmp_path / "exits_while_starting.py"
    script.write_text(textwrap.dedent(_EXITS_WHILE_STARTING))
    proc = zygote.run(
        [sys.executable, str(script), uri], cwd=REPO_ROOT, env=zygote.zygote_env(), text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == [str(3 * 1000)]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
