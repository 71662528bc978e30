"""#51: who reads with ``num_workers: 2``, as users get it: ``lance-lightning fit`` in a subprocess
with the race as shipped (``LANCE_LIGHTNING_WORKER_CHOICE`` removed from the environment; the
suite forces ``workers`` elsewhere, tests/conftest.py), on one process and on 2 DDP ranks (gloo).

Each fit writes, per rank, one JSON line per training step (`RowLog`): its epoch, the rows' ids,
which rows the transform flipped and the pid that made the batch; at each epoch end and at the end
of training, the processes the training process had started. The oracle is the same fit with
``num_workers: 0``, uninterrupted. On one process both tests share one (`flip_oracle`:
`RandomFlip`): the `PythonRows` test compares only ids and their order, which neither transform
changes (a 0-worker fit of its own ran the pure-Python transform on every batch for nothing). No
assertion depends on timing: the race's decision is never asserted, only that what the report
states agrees with the pids that made the batches.

- `RandomFlip` (it declares ``releases_gil``), stopped mid-epoch by ``max_steps`` and resumed from
  that step's checkpoint with ``--ckpt_path``: no process is ever started (a fork server lives
  until its process exits), the report says why and speaks of no worker, and each epoch trains
  the oracle's rows in its order, flips included.
- A pure-Python transform (`tests.worker_probe.PythonRows`) lets the race start the workers and
  hand over mid-epoch (on this machine it usually does: the test prints the outcome): the rows and
  their order are the oracle's, the run exits 0, and the report states the decision with its rates.
- On 2 DDP ranks with `RandomFlip`, stopped mid-epoch and resumed: every rank trains as many
  batches, each epoch's rows across ranks are each row once, each rank's rows are the oracle's.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tests.helpers import RecordingModel, run_in_own_session, write_dataset
from tests.race_cli import fit_config

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS, BATCH = 320, 8  # 40 batches an epoch on one process, 20 a rank on two
#: Epochs of the fit without a Python transform (stopped and resumed in the second).
EPOCHS = 4
#: Epochs of the one-process fit with `PythonRows` (uninterrupted), whatever is asserted: the fork
#: server, forked from the training process at ``setup``, imports nothing and is ready at once, so
#: the race's gate opens after its measured window in the first epoch and the trial runs there (the
#: workers took over at its 22nd batch of 40 in a run at load 10, then read the 3 later epochs).
#: It was 12 while the server imported torch (11 s under the suite's load) before the hand-over.
PYTHON_EPOCHS = EPOCHS
TIMEOUT_S = 300

#: How a DDP report's workers line begins (each rank decides for itself; rank 0 reports).
DDP_PREFIX = "rank 0 (each rank decides for itself): "
NEVER_STARTED = "the training process read, the workers never started (a transform that may hold the GIL took 0% of"


class RowLog(RecordingModel):
    """`RecordingModel` that appends each training step to ``<log>.rank<R>`` (a flushed JSON line):
    its epoch, global step, ids, which rows' ``vec`` is flipped, and the processes that made the
    batch (``pid`` column, when the transform adds one). At each epoch's end and at the end of
    training (``"end": true``, with this process's pid) a line lists the command lines of every
    process this one has started, its descendants: a fork server, once started, lives until this
    process exits (its workers are its children), so a worker start at any step shows in every
    later look."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = log

    def _write(self, record: dict[str, Any]) -> None:
        with open(f"{self.log}.rank{self.global_rank}", "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def _look(self, **record: Any) -> None:
        children = [_cmdline(child) for child in psutil.Process().children(recursive=True)]
        self._write({"look": True, "children": children, **record})

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        ids = batch["id"]
        record: dict[str, Any] = {"epoch": int(self.current_epoch), "step": int(self.global_step), "ids": self.seen[-1]}
        record["flipped"] = (batch["vec"][:, 0] != ids * 8).tolist()
        if "pid" in batch:
            record["pids"] = sorted({int(p) for p in batch["pid"].tolist()})
        self._write(record)
        return loss

    def on_train_epoch_end(self) -> None:
        self._look()

    def on_train_end(self) -> None:
        self._look(end=True, pid=os.getpid())


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:200]
    except psutil.Error:
        return f"{process.pid} (gone)"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("race_cli") / "ds.lance", ROWS, fragment_rows=100)


def _config(root: Path, uri: str, *, workers: int, transform: str, devices: int, epochs: int, stop: int) -> Path:
    """A fit config (`tests.race_cli.fit_config`): a row shuffle, ``epochs`` epochs, a checkpoint
    every ``stop`` steps, `RowLog` writing under ``root``, the report printed at the end of fit."""
    model = "tests.scenarios.test_race_as_shipped.RowLog"
    return fit_config(
        root,
        uri,
        model=model,
        devices=devices,
        epochs=epochs,
        batch=BATCH,
        workers=workers,
        transform=transform,
        every=stop,
        row_identity=transform == FLIP,
    )


def _stop_step(devices: int, epoch: int) -> int:
    """The step in the middle of ``epoch`` (from 0)."""
    per_epoch = ROWS // BATCH // devices
    return epoch * per_epoch + per_epoch // 2


def _fit(config: Path, *args: str, devices: int) -> str:
    """``lance-lightning fit --config CONFIG ARGS`` in its own session with the race as shipped (the
    switch removed from the environment); the output; fails the test on a non-zero exit or a hang.
    On one device without the zygote's spare for a DDP rank: `RowLog` lists the process's children."""
    command = [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config), *args]
    return run_in_own_session(command, TIMEOUT_S, drop=("LANCE_LIGHTNING_WORKER_CHOICE",), spare=devices > 1)


def _records(root: Path, rank: int = 0) -> list[dict[str, Any]]:
    path = root / f"rows.rank{rank}"
    assert path.exists(), f"rank {rank} trained nothing under {root}"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_epoch(records: list[dict[str, Any]], *keys: str) -> dict[int, list[Any]]:
    """Each epoch's steps in order, as tuples of ``keys``."""
    epochs: dict[int, list[Any]] = defaultdict(list)
    for record in records:
        if "ids" in record:
            epochs[record["epoch"]].append(tuple(json.dumps(record[key]) for key in keys))
    return dict(epochs)


def _resumed(
    tmp_path: Path, uri: str, *, transform: str, devices: int, epochs: int, stop_epoch: int
) -> tuple[Path, str, str]:
    """A fit of ``epochs`` epochs with 2 workers stopped in the middle of ``stop_epoch``
    (``max_steps``) and resumed from its checkpoint there to the end: (its folder, the first run's
    output, the resumed run's output)."""
    root = tmp_path / "workers"
    root.mkdir()
    stop = _stop_step(devices, stop_epoch)
    config = _config(root, uri, workers=2, transform=transform, devices=devices, epochs=epochs, stop=stop)
    first = _fit(config, f"--trainer.max_steps={stop}", devices=devices)
    ckpt = root / "ckpt" / f"step={stop}.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (root / "ckpt").iterdir())
    for rank in range(devices):  # the resumed run appends to the same logs
        assert [r["step"] for r in _records(root, rank) if "ids" in r] == list(range(stop))
    rest = _fit(config, f"--ckpt_path={ckpt}", devices=devices)
    return root, first, rest


def _oracle(tmp_path: Path, uri: str, *, transform: str, devices: int, epochs: int) -> Path:
    """The same fit with ``num_workers: 0``, uninterrupted: its folder."""
    root = tmp_path / "oracle"
    root.mkdir()
    _fit(
        _config(root, uri, workers=0, transform=transform, devices=devices, epochs=epochs, stop=10**6), devices=devices
    )
    return root


def _report_lines(output: str) -> list[str]:
    """The end-of-fit report's statement of who read (`Race.describe(done=True)`: with the rates),
    one per report (the plan printed at the start states only what the loader will do); under DDP
    the report names its rank first (`DDP_PREFIX`), left out here."""
    lines = (line.strip().removeprefix(DDP_PREFIX) for line in output.splitlines())
    return [line for line in lines if line.startswith("workers: 2, ") and "(in process " in line]


FLIP = "{class_path: lance_lightning.transforms.RandomFlip, init_args: {column: vec, seed: 7}}"


@pytest.fixture(scope="module")
def flip_oracle(tmp_path_factory: pytest.TempPathFactory, uri: str) -> list[dict[str, Any]]:
    """The oracle of this module's one-process tests: `RandomFlip`, ``num_workers: 0``,
    `EPOCHS` epochs (`PYTHON_EPOCHS` too), uninterrupted; its records."""
    tmp_path = tmp_path_factory.mktemp("flip_oracle")
    return _records(_oracle(tmp_path, uri, transform=FLIP, devices=1, epochs=EPOCHS))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cli_fit_with_a_transform_that_releases_the_gil_never_starts_a_worker(
    tmp_path: Path, uri: str, flip_oracle: list[dict[str, Any]]
) -> None:
    """``num_workers: 2``, persistent workers, `RandomFlip` (it declares ``releases_gil``): the race
    never opens its gate, so no process is started in either run (a fork server lives until its
    process exits, so one started at any step shows at every later step and at the end), the
    report of each run says why, and every epoch trains the rows of a 0-worker fit in its order
    (`flip_oracle`), each row flipped as there, across a resume from the middle of the second epoch."""
    root, first, rest = _resumed(tmp_path, uri, transform=FLIP, devices=1, epochs=EPOCHS, stop_epoch=1)
    records = _records(root)
    expected = _by_epoch(flip_oracle, "ids", "flipped")
    assert sorted(expected) == list(range(EPOCHS)) and all(len(steps) == ROWS // BATCH for steps in expected.values())
    for epoch, steps in expected.items():  # each epoch is every row once (counted without the package)
        assert sorted(i for (ids, _) in steps for i in json.loads(ids)) == list(range(ROWS)), epoch
    assert _by_epoch(records, "ids", "flipped") == expected, "rows lost, repeated, reordered or transformed otherwise"
    looks = [record for record in records if record.get("look")]
    assert [record.get("end", False) for record in looks].count(True) == 2, "a run ended without its last look"
    assert len(looks) >= EPOCHS + 2, "not a look at every epoch's end"
    started = {child for record in looks for child in record["children"]}
    assert not started, f"the training process started processes: {started}"
    for output in (first, rest):
        lines = _report_lines(output)
        assert len(lines) == 1 and NEVER_STARTED in lines[0], output[-3000:]
        # Nor does the rest of the report speak of workers (it did: "workers (transfer)", #51).
        for said in ("workers (transfer)", "(per worker)", "worker output", "x 2 process(es)"):
            assert said not in output, f"the report speaks of workers that never started: {said!r}"


PYTHON = "{class_path: tests.worker_probe.PythonRows}"
RATES = re.compile(
    r"\(in process ([\d,]+) rows/s, workers ([\d,]+|not measured)( rows/s)?(; the workers' trial run \d+ times)?\)$"
)


def _runs(records: list[dict[str, Any]], count: int) -> list[list[dict[str, Any]]]:
    """The steps of each of ``count`` runs, and its last line (``end``)."""
    runs: list[list[dict[str, Any]]] = [[]]
    for record in records:
        if "ids" in record or record.get("end"):
            runs[-1].append(record)
        if record.get("end"):
            runs.append([])
    assert runs[-1] == [] and len(runs) == count + 1, f"not {count} run(s) that each reached their end"
    return runs[:count]


def _check_statement(line: str, run: list[dict[str, Any]]) -> str:
    """The report's statement ``line`` of a run agrees with the processes that made its batches
    (each step's ``pids``; the run's own pid on its last line): the outcome it names, and its rates."""
    main = run[-1]["pid"]
    pids = [set(record["pids"]) for record in run[:-1]]
    assert all(len(p) == 1 for p in pids), "a batch made by more than one process"
    by_worker = [p != {main} for p in pids]
    rates = RATES.search(line)
    assert rates is not None, f"no rates in the statement: {line}"
    measured = rates.group(2) != "not measured"
    assert int(rates.group(1).replace(",", "")) > 0, line
    if "the workers never started" in line:
        assert not any(by_worker) and not measured, f"{line}: yet a worker made a batch"
        return "never started"
    if ": the workers read (" in line:
        assert measured and by_worker[-1], f"{line}: yet this process made the last batch"
        return "workers"
    if ": the training process read (" in line:
        assert measured and any(by_worker) and not by_worker[-1], (
            f"{line}: yet no trial, or a worker made the last batch"
        )
        return "in process"
    assert ": undecided (" in line and not measured, f"no decision stated: {line}"
    return "undecided"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cli_fit_with_a_python_transform_trains_the_rows_of_a_fit_without_workers(
    tmp_path: Path, uri: str, flip_oracle: list[dict[str, Any]]
) -> None:
    """``num_workers: 2`` and `PythonRows` (pure Python per row: it holds the GIL, so the race may
    start the workers and hand over to them mid-epoch, then keep them or stop them after their
    trial): whatever it decides on this machine, every epoch trains the rows of a 0-worker fit in
    their order (`flip_oracle`'s ids: neither transform changes a row's id or order), the run exits
    0, and the report states its decision with its rates, as the batches' processes show it (which
    made the last batch, whether a worker made any)."""
    shape: dict[str, Any] = dict(transform=PYTHON, devices=1, epochs=PYTHON_EPOCHS)
    oracle = _by_epoch(flip_oracle, "ids")
    assert sorted(oracle) == list(range(PYTHON_EPOCHS))
    root = tmp_path / "workers"
    root.mkdir()
    output = _fit(_config(root, uri, workers=2, **shape, stop=10**6), devices=shape["devices"])
    records = _records(root)
    assert _by_epoch(records, "ids") == oracle, "rows lost, repeated or out of order"
    ((line,), (run,)) = _report_lines(output), _runs(records, 1)
    print(f"the race's outcome on this machine: {_check_statement(line, run)}")
    if "workers not measured" not in line:  # they started: from a fork of this fresh process (before any dataset)
        assert "their fork server        forked from this process, imported nothing" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_two_rank_ddp_cli_fit_with_the_race_trains_each_row_once_an_epoch(tmp_path: Path, uri: str) -> None:
    """2 DDP ranks (gloo), ``num_workers: 2``, `RandomFlip`, the race as shipped (each rank's own):
    every rank trains as many batches in each epoch, each epoch's rows across the ranks are each
    row once, and each rank trains the rows (and flips) of a 0-worker DDP fit in their order,
    across a resume from the middle of the second epoch; rank 0's report says its workers never
    started, and why."""
    devices = 2
    shape: dict[str, Any] = dict(transform=FLIP, devices=devices, epochs=EPOCHS)
    oracle_root = _oracle(tmp_path, uri, **shape)
    root, first, rest = _resumed(tmp_path, uri, **shape, stop_epoch=1)
    per_rank = [_by_epoch(_records(root, rank), "ids", "flipped") for rank in range(devices)]
    for rank in range(devices):
        expected = _by_epoch(_records(oracle_root, rank), "ids", "flipped")
        assert per_rank[rank] == expected, f"rank {rank}: not the oracle's rows"
    assert sorted(per_rank[0]) == list(range(EPOCHS))
    for epoch in range(EPOCHS):
        counts = [len(ranks[epoch]) for ranks in per_rank]
        assert counts == [ROWS // BATCH // devices] * devices, f"epoch {epoch}: batches per rank {counts}"
        rows = sorted(i for ranks in per_rank for step in ranks[epoch] for i in json.loads(step[0]))
        assert rows == list(range(ROWS)), f"epoch {epoch}: rows lost or repeated across ranks"
    for output in (first, rest):
        lines = _report_lines(output)  # rank 0 prints the report
        assert len(lines) == 1 and NEVER_STARTED in lines[0], output[-3000:]
        assert DDP_PREFIX + lines[0] in output, "the report does not say whose decision it shows"
