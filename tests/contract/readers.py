"""Who read each trained batch of a ``record_pids`` scenario (`Scenario.record_pids`): `check_readers`.

Such a scenario is forced to the workers (``LANCE_LIGHTNING_WORKER_CHOICE=workers``, set by
`tests.contract.phase_config.scenario_environment`), and its transform (`tests.worker_probe.RecordProcess`) adds the
process that made each batch, which the model records against its rank's own process
(`tests.contract.phase.ContractModel`: ``worker``). The rows and their order are the oracle's;
this checks that the processes the loader promises read them did (a defect that kept the rows
right once left the workers unstarted: every epoch read in process).

Guarantees (each failure one line, naming the phase, the rank, the epoch and the steps):
- Every trained batch says who made it; none of a run without workers is a worker's.
- Waiting for its workers (``handoff=False``), every batch of a run with workers is a worker's.
- Reading while they start (the hand-over), each iteration hands over after its first batch and
  what this process read ahead (`tests.contract.retrials.HANDOVER_STEPS`, a buffer shuffle up to a
  buffer more): an epoch of a fit that trained more steps than that on a rank trained a worker's
  batch at the step after them. Workers that persist from an earlier epoch read from its first step.
"""

from __future__ import annotations

from itertools import groupby

from tests.contract.retrials import HANDOVER_STEPS, extra_steps, recorded_batches
from tests.contract.runner import Run


def check_readers(run: Run) -> list[str]:
    """Who made each trained batch of each fit and rank of a ``record_pids`` scenario (module docstring)."""
    scenario = run.scenario
    if not scenario.record_pids:
        return []
    failures: list[str] = []
    for role, topology, rank, batches in recorded_batches(run, failures):
        last_own = HANDOVER_STEPS + extra_steps(scenario, topology) - 1  # the last step this process may read
        for epoch, group in groupby(batches, key=lambda e: int(e["epoch"])):
            problem = epoch_problem(
                [bool(e["worker"]) for e in group], topology.num_workers, scenario.handoff, last_own
            )
            if problem is not None:
                failures.append(f"{role} rank {rank} epoch {epoch}: {problem}")
    return failures


def epoch_problem(workers: list[bool], num_workers: int, handoff: bool | None, last_own: int) -> str | None:
    """What is wrong with who made one epoch's trained steps (``workers``: each step a worker's);
    ``last_own``: the last step this process may read before the hand-over."""
    made_here = [i for i, worker in enumerate(workers) if not worker]
    if not num_workers:
        return "a worker made a batch of a run without workers" if any(workers) else None
    if handoff is False:
        return f"steps {made_here} read in process, workers waited for" if made_here else None
    if len(workers) > last_own + 1 and not workers[last_own + 1]:
        return (
            f"step {last_own + 1} of {len(workers)} read in process (the hand-over is at step "
            f"{HANDOVER_STEPS}, a buffer's start at most {last_own + 1}); read in process: {made_here}"
        )
    return None
