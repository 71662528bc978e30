"""Every epoch after a resume is whole: each strategy x {same setup, batch size up/down, 2 ranks ->
1, 1 -> 2, workers 2 -> 0, 0 -> 2}, through real ``Trainer.fit(ckpt_path=...)`` (see tests/harness.py).

Runs shared by several cases (the stopped run, the uninterrupted runs of each setup) are made once;
every DDP fit of the module runs in one launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import Job, Setup, Trained, check_resume, ckpt_file, run_jobs
from tests.helpers import write_dataset

ROWS = 300
K = 3  # the checkpoint step (epoch 0)
MAX_EPOCHS = 2
STRATEGIES = ["none", "shard:32:1", "row:2", "buffer:64:16:3"]
BASE = Setup(batch_size=16)
DDP = Setup(batch_size=16, devices=2)
CHANGES = {
    "same": (BASE, BASE),
    "batch-up": (BASE, Setup(batch_size=24)),
    "batch-down": (BASE, Setup(batch_size=10)),
    "ranks-2-to-1": (DDP, BASE),
    "ranks-1-to-2": (BASE, DDP),
    "workers-2-to-0": (Setup(batch_size=16, num_workers=2), BASE),
    "workers-0-to-2": (BASE, Setup(batch_size=16, num_workers=2)),
}


def _tag(setup: Setup) -> str:
    return f"b{setup.batch_size}d{setup.devices}w{setup.num_workers}"


def _key(shuffle: str) -> str:
    return shuffle.replace(":", "_")


class Runs:
    """The module's fits, made on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = write_dataset(root / "ds.lance", ROWS, fragment_rows=100)
        self.done: dict[str, Trained] = {}

    def _run(self, jobs: list[Job]) -> None:
        self.done.update(run_jobs(self.root, [job for job in jobs if job.name not in self.done]))

    def stopped_job(self, shuffle: str, setup: Setup) -> Job:
        return Job(
            f"stop_{_key(shuffle)}_{_tag(setup)}", self.uri, shuffle, setup, MAX_EPOCHS, max_steps=K, ckpt_every=K
        )

    def whole_job(self, shuffle: str, setup: Setup) -> Job:
        return Job(f"whole_{_key(shuffle)}_{_tag(setup)}", self.uri, shuffle, setup, MAX_EPOCHS)

    def resumed_job(self, shuffle: str, setup_a: Setup, setup_b: Setup) -> Job:
        stopped = self.stopped_job(shuffle, setup_a).name
        return Job(
            f"resume_{_key(shuffle)}_{_tag(setup_a)}_{_tag(setup_b)}",
            self.uri,
            shuffle,
            setup_b,
            MAX_EPOCHS,
            ckpt_path=str(ckpt_file(self.root, stopped, K)),
        )

    def _ensure_ddp(self) -> None:
        """All DDP fits in one launch: per strategy, the stopped and uninterrupted 2-rank runs and
        the 2-rank resume of the 1-rank checkpoint."""
        if f"whole_{_key(STRATEGIES[0])}_{_tag(DDP)}" in self.done:
            return
        self._run([self.stopped_job(s, BASE) for s in STRATEGIES])
        jobs = []
        for shuffle in STRATEGIES:
            jobs += [self.stopped_job(shuffle, DDP), self.whole_job(shuffle, DDP), self.resumed_job(shuffle, BASE, DDP)]
        self._run(jobs)

    def case(self, shuffle: str, setup_a: Setup, setup_b: Setup) -> dict[str, Trained]:
        if DDP in (setup_a, setup_b):
            self._ensure_ddp()
        jobs = [self.stopped_job(shuffle, setup_a), self.whole_job(shuffle, setup_a), self.whole_job(shuffle, setup_b)]
        self._run(jobs)
        resumed = self.resumed_job(shuffle, setup_a, setup_b)
        self._run([resumed])
        return {
            "stopped": self.done[jobs[0].name],
            "whole_a": self.done[jobs[1].name],
            "whole_b": self.done[jobs[2].name],
            "resumed": self.done[resumed.name],
        }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("harness"))


@pytest.mark.slow
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_epochs_after_resume_are_whole(runs: Runs, shuffle: str, change: str) -> None:
    setup_a, setup_b = CHANGES[change]
    fits = runs.case(shuffle, setup_a, setup_b)
    check_resume(rows=ROWS, k=K, setup_a=setup_a, setup_b=setup_b, max_epochs=MAX_EPOCHS, **fits)
