"""#51: workers that lose their trial are tried again after 1, 2, 4, ... whole epochs read in
process (`lance_lightning.load.race.Race.retrial_due`), as users get it: ``lance-lightning fit``
in a subprocess with the race as shipped (``LANCE_LIGHTNING_WORKER_CHOICE`` removed from the
environment), ``num_workers: 2``, persistent workers, on one process and on 2 DDP ranks (gloo).

The transform (`tests.worker_probe.SlowInWorkers`) runs Python that holds the GIL for 30 ms a
batch in the training process (the race weighs its CPU seconds against the loop thread's: a share
that opens the race's gate, at least 40%, `START_GAIN` 1.25 on 2 workers, while a step's CPU time
stays under 1.5 times the spin's, 45 ms where the spin has a core) and sleeps 0.16 s a batch in a
worker, so the workers lose every trial whatever the machine's load: both sides' rates are
bounded by the same loop, and two workers at 80 ms a batch never deliver 1.15x a process at 30 ms
(they could only where the loop's in-process cycle is over 92 ms). The model
(`RetrialLog`) waits at ``on_train_start`` for the fork server the data module started at
``setup`` (the package's own `WorkerStart`, as the loader waits for it), so the first trial
comes in the first epoch rather than after seconds of imports; the race is otherwise as shipped.

Each fit writes, per rank, one JSON line per training step (`RowLog`: epoch, ids, the pid that
made the batch). A trial is a run of steps made by workers. The oracle is the same config with
``num_workers: 0`` and no transform (the transform changes no row), uninterrupted. What is
asserted does not depend on timing: which epoch a trial begins in is derived from the rule
(`tests.worker_probe.check_retrial_schedule`: each trial begins ``1, 2, 4, ...`` whole epochs
after the epoch in which the one before was lost, none is skipped), and the report's count of
trials is the count of runs of worker-made steps; 7 epochs leave room for three trials (epochs
1, 3 and 6 counted from 1) even if the first trial ends an epoch late.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import WaitsForForkServer, write_dataset
from tests.race_cli import fit_config
from tests.scenarios.test_race_as_shipped import DDP_PREFIX, RowLog, _by_epoch, _fit, _records, _runs
from tests.worker_probe import check_retrial_schedule, worker_trials

ROWS, BATCH = 448, 8  # 56 batches an epoch on one process; 28 a rank on two (batch 4 there: 56)
EPOCHS = 7
SLOW = "{class_path: tests.worker_probe.SlowInWorkers, init_args: {main_s: 0.03, worker_s: 0.16}}"
#: What the report says of a race whose workers lost every trial (`Race.describe(done=True)`).
LOST = ": the training process read (in process "


class RetrialLog(WaitsForForkServer, RowLog):
    """`RowLog` whose fit waits, before its first batch, for the fork server (`WaitsForForkServer`)."""


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("retrials") / "ds.lance", ROWS, fragment_rows=150)


def _config(root: Path, uri: str, *, workers: int, devices: int, every: int = 10**6) -> Path:
    """A fit config under ``root`` (`tests.race_cli.fit_config`): a row shuffle, `EPOCHS` epochs,
    `RetrialLog`, a checkpoint every ``every`` steps, the report printed at the end of fit; `SLOW`
    with workers, no transform without."""
    root.mkdir(parents=True, exist_ok=True)
    model = "tests.scenarios.test_race_retrials.RetrialLog"
    return fit_config(
        root,
        uri,
        model=model,
        devices=devices,
        epochs=EPOCHS,
        batch=BATCH if devices == 1 else BATCH // 2,
        workers=workers,
        transform=SLOW if workers else "null",
        every=every,
    )


def _trials(run: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The workers' trials in one run's steps (`worker_trials`; its last line, ``end``, holds its pid)."""
    main = run[-1]["pid"]
    assert all(len(r["pids"]) == 1 for r in run[:-1]), "a batch made by more than one process"
    return worker_trials((r["epoch"], r["pids"] != [main]) for r in run[:-1])


def _check_report(output: str, trials: list[tuple[int, int]], prefix: str = "") -> None:
    """The end-of-fit report says the training process read, and how many times the trial ran."""
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(f"{prefix}workers: 2, ")]
    (line,) = [line for line in lines if "(in process " in line]
    assert LOST in line and "measured race" in line, line
    if len(trials) > 1:
        assert line.endswith(f"; the workers' trial run {len(trials)} times)"), (line, trials)
    else:
        assert "trial run" not in line, (line, trials)


def _steps(records: list[dict[str, Any]]) -> dict[int, tuple[int, list[int]]]:
    """Each step's epoch and ids, by global step."""
    return {r["step"]: (r["epoch"], r["ids"]) for r in records if "ids" in r}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cli_fit_tries_losing_workers_again_and_resumes_exactly(tmp_path: Path, uri: str) -> None:
    """One process, 7 epochs: the workers lose their trial in the first epoch and are tried again
    in the third and the sixth (the rule from whichever epoch each trial was lost in); every epoch
    trains the oracle's rows in its order, each row once; the report counts the trials. Then a fit
    resumed (``--ckpt_path``) from the periodic checkpoint in the middle of the second epoch trains
    exactly the oracle's steps from there to the end of the seventh epoch (nothing lost or
    repeated), its own race again trying its losing workers by the rule, as its report says."""
    per_epoch = ROWS // BATCH
    _fit(_config(tmp_path / "oracle", uri, workers=0, devices=1), devices=1)
    oracle = _records(tmp_path / "oracle")
    expected = _by_epoch(oracle, "ids")
    assert sorted(expected) == list(range(EPOCHS))
    for epoch, steps in expected.items():  # each epoch is every row once (counted without the package)
        assert sorted(i for (ids,) in steps for i in json.loads(ids)) == list(range(ROWS)), epoch

    stop = per_epoch + per_epoch // 2
    output = _fit(_config(tmp_path / "workers", uri, workers=2, devices=1, every=stop), devices=1)
    records = _records(tmp_path / "workers")
    assert _by_epoch(records, "ids") == expected, "rows lost, repeated or out of order"
    (run,) = _runs(records, 1)
    trials = _trials(run)
    check_retrial_schedule(trials, EPOCHS - 1)
    assert len(trials) >= 3, f"not tried again twice in {EPOCHS} epochs: {trials}"
    print(f"trials (first epoch, epoch lost), from epoch 0: {trials}")
    _check_report(output, trials)

    ckpt = tmp_path / "workers" / "ckpt" / f"step={stop}.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (tmp_path / "workers" / "ckpt").iterdir())
    output = _fit(_config(tmp_path / "resumed", uri, workers=2, devices=1), f"--ckpt_path={ckpt}", devices=1)
    resumed = _records(tmp_path / "resumed")
    from_oracle = {step: seen for step, seen in _steps(oracle).items() if step >= stop}
    assert _steps(resumed) == from_oracle, "the resumed fit lost, repeated or reordered rows"
    assert [r["step"] for r in resumed if "ids" in r] == sorted(from_oracle), "steps out of order"
    (run,) = _runs(resumed, 1)
    trials = _trials(run)
    check_retrial_schedule(trials, EPOCHS - 1)
    print(f"the resumed fit's trials: {trials}")
    _check_report(output, trials)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_two_rank_ddp_cli_fit_tries_losing_workers_again_on_each_rank(tmp_path: Path, uri: str) -> None:
    """2 DDP ranks (gloo), 7 epochs, each rank's race its own: on each rank the workers lose their
    trials and are tried again by the rule (at least twice), every rank trains as many batches in
    each epoch, each epoch's rows across the ranks are each row once, each rank's rows are those of
    a 0-worker DDP fit in their order, and rank 0's report counts its trials."""
    devices = 2
    oracle_root = tmp_path / "oracle"
    _fit(_config(oracle_root, uri, workers=0, devices=devices), devices=devices)
    output = _fit(_config(tmp_path / "workers", uri, workers=2, devices=devices), devices=devices)
    per_rank = [_by_epoch(_records(tmp_path / "workers", rank), "ids") for rank in range(devices)]
    for rank in range(devices):
        assert per_rank[rank] == _by_epoch(_records(oracle_root, rank), "ids"), f"rank {rank}: not the oracle's rows"
    for epoch in range(EPOCHS):
        counts = [len(steps.get(epoch, [])) for steps in per_rank]
        assert counts == [ROWS // (BATCH // 2) // devices] * devices, f"epoch {epoch}: batches per rank {counts}"
        rows = sorted(i for steps in per_rank for (ids,) in steps[epoch] for i in json.loads(ids))
        assert rows == list(range(ROWS)), f"epoch {epoch}: rows lost or repeated across ranks"
    for rank in range(devices):
        (run,) = _runs(_records(tmp_path / "workers", rank), 1)
        trials = _trials(run)
        check_retrial_schedule(trials, EPOCHS - 1)
        assert len(trials) >= 3, f"rank {rank}: not tried again twice in {EPOCHS} epochs: {trials}"
        print(f"rank {rank}'s trials: {trials}")
        if rank == 0:
            _check_report(output, trials, DDP_PREFIX)
