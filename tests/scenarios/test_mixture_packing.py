"""Packing and mixtures compose: a weighted mixture of packed sources, through real fits.

Each source's tokens are numbered by their place in that source's stream, from a distinct first
token (0 and `SECOND`), so a window's first token names its source and its window. The harness
(tests/harness.py) runs the fits: uninterrupted, stopped at a checkpoint, and resumed with another
batch size and world size.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from lance_lightning import LanceDataModule, LanceMixture, LanceSource, RowShuffle, TokenPacking
from tests.harness import Job, Setup, run_and_check_resume, run_jobs
from tests.helpers import write_token_dataset

SECOND = 1_000_000  # the second source's first token
SEQ = 8
WEIGHTS = [0.7, 0.3]
BLOCK = 10
PACKING = {"column": "tokens", "seq_len": SEQ, "lengths_column": "n_tokens"}


@pytest.fixture
def uris(tmp_path: Path) -> list[str]:
    first, _ = write_token_dataset(tmp_path / "a.lance", 300, seed=1, fragment_rows=100)
    second, _ = write_token_dataset(tmp_path / "b.lance", 200, seed=2, first_token=SECOND)
    return [first, second]


def _mixture(uris: list[str]) -> dict:
    return {"uris": uris, "weights": WEIGHTS, "names": ["a", "b"], "block": BLOCK}


def _positions(uris: list[str]) -> int:
    """Mixture samples (packed windows) per epoch, as the data module plans them."""
    dm = LanceDataModule(
        train=LanceMixture([LanceSource(u, columns=["tokens", "n_tokens"]) for u in uris], WEIGHTS, block=BLOCK),
        packing=TokenPacking(**PACKING),
        shuffle=RowShuffle(seed=3),
        batch_size=4,
    )
    dm.setup("fit")
    plan = dm.plans["train"]
    assert plan.packed and all(source.packed for source in plan.plans)
    return plan.matched_rows


def test_a_mixture_of_packed_sources_trains_windows_once_in_the_weights(tmp_path: Path, uris: list[str]) -> None:
    batch = 4
    job = Job("whole", uris[0], "row:1", Setup(batch_size=batch), 2, mixture=_mixture(uris), packing=PACKING)
    run = run_jobs(tmp_path, [job])["whole"]
    positions = _positions(uris)
    for epoch in (0, 1):
        firsts = run.rows(epoch)
        assert len(firsts) == len(set(firsts)), "a window was trained twice in one epoch"
        assert positions - batch < len(firsts) <= positions, "more than the drop_last tail went untrained"
        assert all((first % SECOND) % SEQ == 0 for first in firsts), "a sample is not a window start"
        share = Counter(first >= SECOND for first in firsts)[True] / len(firsts)
        assert abs(share - WEIGHTS[1]) < 0.01, f"source b made {share:.3f} of epoch {epoch}"
    assert run.rows(0) != run.rows(1), "RowShuffle gives each epoch another order"


def test_resume_of_a_packed_mixture_is_exact_and_elastic(tmp_path: Path, uris: list[str]) -> None:
    k, epochs = 5, 2
    a, b = Setup(batch_size=4, devices=2), Setup(batch_size=6)

    def job(name: str, setup: Setup, **kw) -> Job:
        return Job(name, uris[0], "row:2", setup, epochs, mixture=_mixture(uris), packing=PACKING, **kw)

    run_and_check_resume(tmp_path, job, rows=_positions(uris), k=k, setup_a=a, setup_b=b, max_epochs=epochs)
