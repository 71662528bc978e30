"""The oracle's check of the race's trials (`tests.contract.retrials`) on the steps of fits whose
workers lose every trial: it passes the schedule the race runs (seen in seed 15151's resumed fit,
the soak sample's ``lose`` scenario) and reports a retrial missing, one too early, a first trial
that never came, and nothing where the fit's steps do not determine the schedule."""

from __future__ import annotations

import pytest

from tests.contract.retrials import Steps, schedule_problem

PER_EPOCH, STEP_S = 30, 0.05


def _fit(*epochs: str) -> Steps:
    """Steps from one string per epoch: ``p`` made in process, ``W`` by a worker, ``STEP_S`` apart."""
    marks = [(epoch, mark) for epoch, marks in enumerate(epochs) for mark in marks]
    return [(epoch, mark == "W", i * STEP_S) for i, (epoch, mark) in enumerate(marks)]


def _epoch(workers_from: int | None = None, until: int = PER_EPOCH, length: int = PER_EPOCH) -> str:
    """An epoch of ``length`` steps, made by workers from ``workers_from`` to ``until`` (excluded)."""
    if workers_from is None:
        return "p" * length
    return "p" * workers_from + "W" * (until - workers_from) + "p" * (length - until)


P = _epoch()
#: The race as it runs: trial 1 from epoch 1, lost in epoch 2; 1 epoch in process; trial 2 in epoch
#: 4, lost there; 2 epochs in process (trial 3 would be due in epoch 7).
AS_RUN = (P, _epoch(3), _epoch(0, 1), P, _epoch(6), P, P)


@pytest.mark.parametrize(
    ("epochs", "expected"),
    [
        (AS_RUN, None),
        ((P, _epoch(3), _epoch(0, 1), P, P, P, P), "trial 2, due from epoch 4, had not begun by epoch 4"),
        ((P, _epoch(3), _epoch(0, 1), _epoch(10, 20), _epoch(6), P, P), "trial 2 began in epoch 3, before epoch 4"),
        ((P, _epoch(3), _epoch(0, 1), P, _epoch(6), P, _epoch(5, 10)), "trial 3 began in epoch 6, before epoch 7"),
        ((P, P, P), "trial 1, due from epoch 0 step 17 (the race's window measured), had not begun by epoch 1"),
        ((P, "p" * 8), None),  # cut before trial 1's deadline (READY_S, then the hand-over)
        ((P, _epoch(3), _epoch(0, 1), P, "p" * 4), None),  # cut before trial 2's
        ((P, _epoch(3, 30)), None),  # trial 1 undecided when the fit ends
        (tuple("p" * 4 for _ in range(20)), None),  # epochs too short for the hand-over
        ((P, _epoch(3), _epoch(0, 1), P, "p" * 5, _epoch(5)), None),  # trial 2's epoch too short: the next
    ],
    ids=[
        "as-run",
        "retrial-missing",
        "retrial-early",
        "third-trial-early",
        "never-tried",
        "cut-before-first",
        "cut-before-retrial",
        "undecided-at-end",
        "short-epochs",
        "rolled-to-next-epoch",
    ],
)
def test_retrial_schedule_check(epochs: tuple[str, ...], expected: str | None) -> None:
    problem = schedule_problem(_fit(*epochs))
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem, problem
