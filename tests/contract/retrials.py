"""The race's trials in a ``lose`` scenario (`tests.contract.scenario.Scenario.lose`): `check_retrials`.

In a ``lose`` scenario the transform (`tests.worker_probe.SlowInWorkers`) makes raced workers lose
every trial, so `lance_lightning.load.race.Race.retrial_due` tries them again after 1, 2, 4, ...
epochs read in process. Each trained batch records whether a DataLoader worker made it, and when
(`tests.contract.phase.ContractModel`: ``worker`` from the ``pid`` column the transform adds,
against the rank's own process; ``at``, monotonic seconds). A race is one loader's: one per fit
(a resumed run in a new process, or the second fit of a session with its new ``Trainer``) and
rank, so each phase's steps on each rank are checked on their own; a trial is a run of
consecutive worker-made steps, lost when steps of the rank's process follow it in the fit.

Guarantees (each failure one line, naming the phase, the rank and the trials found):
- Every trained batch of a ``lose`` scenario's stopped and resumed runs says who made it, and none
  of a run without workers is a worker's.
- Never early (exact, whatever the load): trial ``i + 1`` (from 0) begins no earlier than epoch
  ``L + 1 + 2**i``, ``L`` the epoch trial ``i`` was lost in: the epochs between are read in process.
- Never missing, where the fit's steps determine it (`deadline`): the first trial is due once the
  race has measured `lance_lightning.load.race.WINDOW_BATCHES` batches (the first of each epoch
  left out), each later one at the start of the epoch it is due in. From there the race's
  `lance_lightning.load.handoff.WorkerStart` (an empty process forked by the fork server, already
  running) is taken as ready after `READY_STEPS` steps and `READY_S` seconds, and the workers
  begin `HANDOVER_STEPS` steps later (this process reads ``prefetch_batches`` ahead; with a buffer
  shuffle up to a buffer more, to a buffer's start): in that epoch when it holds those steps, else
  after the first step of the first later epoch that does. A trial whose deadline lies past the
  fit's last step (a stop, a short fit, epochs too short) is not asserted.

`tests.worker_probe.check_retrial_schedule` (the CLI and DDP tests' rule, on long epochs) asserts
each trial begins exactly in its due epoch; here epochs may be shorter than the hand-over needs
(the trial then begins in a later epoch, as the race does) and fits are cut anywhere, so this is
the same rule with the hand-over's room made explicit. With the gate open (`SlowInWorkers`'s share
of the loop) and 0.2 s a batch in a worker, no trial is won.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lance_lightning.load.race import WINDOW_BATCHES
from tests.contract.runner import Run
from tests.contract.scenario import Scenario, Topology

#: Steps and seconds read in process after the due point by which the race's `WorkerStart` (a
#: fork of an empty process by the running fork server) is taken as ready: seen ready within 5
#: steps (0.2 s) on the loaded 2-core machine; a step in process took 2 to 300 ms there.
READY_STEPS = 16
READY_S = 1.0
#: Steps from the step after which the workers are ready to their first batch: that step, then the
#: ``prefetch_batches`` (4, the data module's default) this process has read ahead.
HANDOVER_STEPS = 1 + 4

#: One fit's trained steps on one rank, in order: (epoch, made by a worker, monotonic seconds).
Steps = list[tuple[int, bool, float]]


def recorded_batches(run: Run, failures: list[str]) -> Iterator[tuple[str, Topology, int, list[dict[str, Any]]]]:
    """Each fit's (role, topology) and rank with its trained batches, where the fit ran as the
    scenario expects; a rank with a batch that does not say who made it is a failure, not yielded."""
    scenario = run.scenario
    for role, topology in (("stop", scenario.topology), ("resume", scenario.resume.topology)):
        phase = run.phases.get(role)
        if phase is None or phase.timed_out or run.expected_errors.get(role) is not None:
            continue
        for rank, events in enumerate(phase.ranks):
            batches = [e for e in events if e["t"] == "batch"]
            if any("worker" not in e for e in batches):
                failures.append(f"{role} rank {rank}: a batch without the process that made it (no pid column)")
                continue
            yield role, topology, rank, batches


def check_retrials(run: Run) -> list[str]:
    """The trials of each fit and rank of a ``lose`` scenario against the rule (module docstring)."""
    scenario = run.scenario
    if not scenario.lose:
        return []
    failures: list[str] = []
    for role, topology, rank, batches in recorded_batches(run, failures):
        steps = [(int(e["epoch"]), bool(e["worker"]), float(e["at"])) for e in batches]
        if not topology.num_workers:
            if any(worker for _, worker, _ in steps):
                failures.append(f"{role} rank {rank}: a worker made a batch of a run without workers")
            continue
        problem = schedule_problem(steps, extra_steps(scenario, topology))
        if problem is not None:
            failures.append(f"{role} rank {rank}: {problem}")
    return failures


def extra_steps(scenario: Scenario, topology: Topology) -> int:
    """Steps the hand-over may wait beyond `HANDOVER_STEPS` for a buffer's start (a buffer shuffle)."""
    rows = scenario.shuffle.buffer_rows if scenario.shuffle.kind == "buffer" else 0
    return rows // topology.batch_size + 1 if rows else 0


def runs_of(steps: Steps) -> list[tuple[int, int]]:
    """Each run of consecutive worker-made steps, as (index of its first step, of its last)."""
    runs: list[tuple[int, int]] = []
    for i, (_, worker, _) in enumerate(steps):
        if worker and runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        elif worker:
            runs.append((i, i))
    return runs


def window_due(steps: Steps) -> int:
    """The index of the first step after the race's window is measured: `WINDOW_BATCHES` steps
    read in process, the first of each epoch left out (it carries the iteration's start); past the
    last step when the fit has fewer. Batches fetched and not trained count too: the race may be
    earlier, never later."""
    counted = 0
    for i in range(1, len(steps)):
        counted += int(steps[i - 1][0] == steps[i][0])
        if counted >= WINDOW_BATCHES:
            return i + 1
    return len(steps)


def deadline(steps: Steps, due: int, extra: int = 0) -> int | None:
    """The index by which a trial due before step ``due`` has begun (module docstring); None when
    that lies past the fit's last step."""
    if due >= len(steps):
        return None
    since = steps[due][2]
    ready = next((i for i in range(due + READY_STEPS - 1, len(steps)) if steps[i][2] - since >= READY_S), None)
    while ready is not None:
        last = ready + HANDOVER_STEPS + extra
        if last >= len(steps):
            return None
        if steps[last][0] == steps[ready][0]:
            return last
        ready = next(i for i in range(ready, len(steps)) if steps[i][0] != steps[ready][0])
    return None


def schedule_problem(steps: Steps, extra: int = 0) -> str | None:
    """What is wrong with the trials in one fit's steps of a race whose workers lose every trial;
    None: nothing (see the module docstring)."""
    runs = runs_of(steps)
    trials = [(steps[first][0], steps[last][0]) for first, last in runs]  # (first epoch, epoch lost)
    due, due_epoch = window_due(steps), None
    for i in range(len(runs) + 1):
        begun = runs[i][0] if i < len(runs) else None
        if i > 0 and begun is not None and begun < due:
            return f"trial {i + 1} began in epoch {steps[begun][0]}, before epoch {due_epoch}: trials {trials}"
        last = deadline(steps, due, extra)
        if last is not None and (begun is None or begun > last):
            where = f"epoch {due_epoch}" if i else f"epoch {steps[due][0]} step {due} (the race's window measured)"
            return (
                f"trial {i + 1}, due from {where}, had not begun by epoch {steps[last][0]} step {last} of the fit: "
                f"trials {trials} (first epoch, epoch lost)"
            )
        if begun is None:
            return None
        end = runs[i][1]
        if end + 1 >= len(steps):  # undecided when the fit ended
            return None
        due_epoch = steps[end][0] + 1 + 2**i
        due = next((j for j in range(end + 1, len(steps)) if steps[j][0] >= due_epoch), len(steps))
    return None
