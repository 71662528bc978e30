"""Mixture schedules through the user's path: ``Trainer.fit`` stopped before a stage boundary and
resumed across it with ``fit(ckpt_path=...)`` and another batch size (in-process, and 2 DDP ranks
-> 1), then two more epochs: exactly the uninterrupted run's data, each source's rows once per
pass, every whole block holding the counts scheduled at its first sample; the monitor's scheduled
and delivered shares in the CSV logs; a checkpoint of another schedule refused naming the field,
and continued with ``on_schedule_change="continue"``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pytest
from lightning.pytorch.loggers import CSVLogger

from lance_lightning import (
    CursorMismatchError,
    DataLoadingMonitor,
    LanceDataModule,
    LanceMixture,
    LanceSource,
    RowShuffle,
)
from tests.harness import Job, Setup, Trained, ckpt_file, fit, run_and_check_resume
from tests.helpers import make_table

OFFSET = 100_000  # ids of source "b" start here
SAMPLES, BLOCK = 500, 50
#: Samples [0, 250): 30 a + 20 b per block; from sample 250 on (epoch 0's second half and every
#: later epoch): 20 a + 30 b. Epoch 0 reads a 250 of 300 rows, b all 250: no row twice.
CONSTANT = [{"until_sample": 250, "weights": [0.6, 0.4]}, {"weights": [0.4, 0.6]}]
#: From 0.7 a at sample 0 to 0.3 at sample 400 (8 steps of 50 samples), then 0.3.
LINEAR = [{"until_step": 8, "weights": [0.7, 0.3]}, {"weights": [0.3, 0.7]}]


def _write(root: Path, rows_a: int = 300, rows_b: int = 250) -> tuple[str, str]:
    a, b = str(root / "a.lance"), str(root / "b.lance")
    lance.write_dataset(make_table(rows_a), a)
    lance.write_dataset(make_table(rows_b, start=OFFSET), b)
    return a, b


def _expected_counts(schedule: list[dict[str, Any]], step_samples: int, linear: bool, g: int) -> list[int]:
    """Counts of a block starting at sample ``g``, from the guide's rule (largest remainder)."""
    first, last = schedule[0]["weights"], schedule[-1]["weights"]
    end = schedule[0].get("until_sample") or schedule[0]["until_step"] * step_samples
    s0, s1 = np.asarray(first) / sum(first), np.asarray(last) / sum(last)
    shares = s1 if g >= end else (s0 + (s1 - s0) * (g / end) if linear else s0)
    exact = shares * BLOCK
    counts = np.floor(exact).astype(int)
    for j in sorted(range(len(counts)), key=lambda j: (-(exact[j] - counts[j]), j))[: BLOCK - counts.sum()]:
        counts[j] += 1
    return counts.tolist()


def _check_epochs(run: Trained, epochs: int, sizes: tuple[int, int], expected: Any) -> None:
    for epoch in range(epochs):
        ids = run.rows(epoch)
        sources = [int(i >= OFFSET) for i in ids]
        for b in range(len(ids) // BLOCK):  # every whole block trained holds its scheduled counts
            got = np.bincount(sources[b * BLOCK : (b + 1) * BLOCK], minlength=2).tolist()
            assert got == expected(epoch * SAMPLES + b * BLOCK), (epoch, b, got)
        for j, n in enumerate(sizes):  # each source's rows once per pass through it
            mine = [i for i, s in zip(ids, sources) if s == j]
            for first in range(0, len(mine), n):
                chunk = mine[first : first + n]
                assert len(set(chunk)) == len(chunk), (epoch, j, first)


def _resume_across_the_boundary(tmp_path: Path, schedule: Any, setup_a: Setup, linear: bool, **extra: Any) -> None:
    sizes = (300, 300) if linear else (300, 250)
    a, b = _write(tmp_path, *sizes)
    mixture = {
        "uris": [a, b],
        "names": ["a", "b"],
        "block": BLOCK,
        "epoch": "samples",
        "samples": SAMPLES,
        "schedule": schedule,
        "interpolate": "linear" if linear else "constant",
        **extra,
    }
    setup_b, k, epochs = Setup(batch_size=12), 6, 3  # the stop at 6 steps: before sample 250

    def job(name: str, setup: Setup, **kwargs: Any) -> Job:
        return Job(name, a, "row:3", setup, epochs, mixture=mixture, **kwargs)

    assert k * setup_a.step_rows < 250
    runs = run_and_check_resume(tmp_path, job, rows=SAMPLES, k=k, setup_a=setup_a, setup_b=setup_b, max_epochs=epochs)
    step_samples = extra.get("step_samples", 0)
    resumed = Trained(runs["stop"].steps + runs["resume"].steps, runs["stop"].epochs + runs["resume"].epochs)
    _check_epochs(resumed, epochs, sizes, lambda g: _expected_counts(schedule, step_samples, linear, g))


def test_resume_across_a_stage_boundary_with_another_batch_size(tmp_path):
    _resume_across_the_boundary(tmp_path, CONSTANT, Setup(batch_size=16), linear=False)


@pytest.mark.slow
def test_linear_schedule_resumed_from_two_ranks_on_one(tmp_path):
    _resume_across_the_boundary(tmp_path, LINEAR, Setup(batch_size=8, devices=2), linear=True, step_samples=50)


def _mixture(a: str, b: str, schedule: Any = CONSTANT, **kwargs: Any) -> LanceMixture:
    args = {"names": ["a", "b"], "block": BLOCK, "epoch": "samples", "samples": SAMPLES, "schedule": schedule}
    return LanceMixture(
        [LanceSource(a, columns=["id", "x"]), LanceSource(b, columns=["id", "x"])], **{**args, **kwargs}
    )


def test_monitor_logs_scheduled_and_delivered_shares(tmp_path):
    a, b = _write(tmp_path)
    dm = LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5))
    logger = CSVLogger(str(tmp_path), name="logs")
    model = fit(
        tmp_path, dm, name="monitor", max_epochs=1, logger=logger,
        callbacks=[DataLoadingMonitor(log_every_n_steps=5, report=False)],
    )  # fmt: skip
    with (Path(logger.log_dir) / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("data/mixture/a/scheduled_share")]
    assert rows, "no scheduled share logged"
    for row in rows:
        step = int(row["step"])
        consumed = min(SAMPLES, 20 * (step + 1))
        scheduled = (0.6 * min(consumed, 250) + 0.4 * max(0, consumed - 250)) / consumed
        assert float(row["data/mixture/a/scheduled_share"]) == pytest.approx(scheduled)
        assert float(row["data/mixture/b/scheduled_share"]) == pytest.approx(1 - scheduled)
        trained = [i for batch in model.seen[: step + 1] for i in batch]
        delivered = sum(i < OFFSET for i in trained) / len(trained)
        assert float(row["data/mixture/a/share"]) == pytest.approx(delivered)
        assert abs(delivered - scheduled) <= 1 / BLOCK + 1e-9 or consumed % BLOCK  # exact per whole block


def _state_after(dm: LanceDataModule, batches: int) -> dict[str, Any]:
    for _, _ in zip(range(batches), dm.train_dataloader()):
        pass
    return dm.state_dict()


def test_a_checkpoint_of_another_schedule_is_refused_naming_the_field(tmp_path):
    a, b = _write(tmp_path)
    state = _state_after(LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5)), 3)
    assert state["train_cursor"]["rows_consumed"] == 60
    later = [{"until_sample": 300, "weights": [0.6, 0.4]}, {"weights": [0.4, 0.6]}]
    for train, field in (
        (_mixture(a, b, later), "plan.schedule"),
        (_mixture(a, b, CONSTANT, interpolate="linear"), "plan.schedule"),
        (_mixture(a, b, None, weights=[0.5, 0.5]), "plan.weights"),
    ):
        other = LanceDataModule(train=train, batch_size=20, shuffle=RowShuffle(seed=5))
        with pytest.raises(CursorMismatchError) as info:
            other.load_state_dict(state)
        assert info.value.field == field
    same = LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5))
    same.load_state_dict(state)  # the same schedule resumes


def test_on_schedule_change_continue_reads_on_with_the_new_schedule(tmp_path):
    a, b = _write(tmp_path)
    state = _state_after(LanceDataModule(train=_mixture(a, b), batch_size=20, shuffle=RowShuffle(seed=5)), 3)
    later = [{"until_sample": 300, "weights": [0.6, 0.4]}, {"weights": [0.4, 0.6]}]
    dm = LanceDataModule(
        train=_mixture(a, b, later, on_schedule_change="continue"), batch_size=20, shuffle=RowShuffle(seed=5)
    )
    dm.load_state_dict(state)
    assert dm.plans["train"].identity()["schedule"]["stages"][0]["until_sample"] == 300
    # The rest of the resumed epoch is the new schedule's sequence from position 60 on.
    fresh = LanceDataModule(train=_mixture(a, b, later), batch_size=20, shuffle=RowShuffle(seed=5))
    whole = [batch["id"].tolist() for batch in fresh.train_dataloader()]
    rest = [batch["id"].tolist() for batch in dm.train_dataloader()]
    assert rest == whole[3:]


@pytest.mark.slow
def test_cli_yaml_schedule(tmp_path):
    import sys

    from tests import zygote
    from tests.harness import REPO_ROOT
    from tests.helpers import mixture_cli_config

    a, b = _write(tmp_path)
    train = f"""\
  train:
    class_path: lance_lightning.LanceMixture
    init_args:
      sources: [{{uri: {a}, columns: [id, x]}}, {{uri: {b}, columns: [id, x]}}]
      names: [a, b]
      epoch: samples
      samples: 500
      block: 50
      step_samples: 10
      schedule:
        - {{until_step: 25, weights: [1, 0]}}
        - {{weights: [0.4, 0.6]}}
      interpolate: linear"""
    proc = zygote.run(  # forked from the test zygote: the process a fresh start gives, less the imports
        [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(mixture_cli_config(tmp_path, train, a))],
        cwd=REPO_ROOT,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stage 0: samples [0, 250) = until step 25 at 10 samples/step" in proc.stdout + proc.stderr
    bad = train.replace("weights: [1, 0]}", "weights: [1, -1]}")
    proc = zygote.run(
        [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(mixture_cli_config(tmp_path, bad, a))],
        cwd=REPO_ROOT,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "data.train.schedule[0].weights[1]" in proc.stdout + proc.stderr


def test_a_changed_schedule_through_fit_ckpt_path_is_refused_or_continued(tmp_path):
    """The user's path: a fit stopped at step 3 with a checkpoint, then ``Trainer.fit(ckpt_path=...)``
    under another schedule: refused naming the field, or, with ``on_schedule_change="continue"``,
    the resumed epoch is the new schedule's sequence from where it stopped and the next epoch is
    the new schedule's whole epoch."""
    a, b = _write(tmp_path)
    later = [{"until_sample": 300, "weights": [0.6, 0.4]}, {"weights": [0.4, 0.6]}]

    def module(schedule: Any, **kwargs: Any) -> LanceDataModule:
        return LanceDataModule(train=_mixture(a, b, schedule, **kwargs), batch_size=20, shuffle=RowShuffle(seed=5))

    fit(tmp_path, module(CONSTANT), name="A", max_steps=3, ckpt_every=3, max_epochs=2)
    ckpt = ckpt_file(tmp_path, "A", 3)
    with pytest.raises(CursorMismatchError) as info:
        fit(tmp_path, module(later), name="refused", ckpt_path=ckpt, max_epochs=2)
    assert info.value.field == "plan.schedule"
    resumed = fit(tmp_path, module(later, on_schedule_change="continue"), name="B", ckpt_path=ckpt, max_epochs=2)
    whole = fit(tmp_path, module(later), name="C", max_epochs=2)
    steps = SAMPLES // 20
    assert resumed.seen == whole.seen[3:steps] + whole.seen[steps:]
