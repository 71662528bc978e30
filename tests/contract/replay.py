"""The compute-floor probe in a scenario's runs: ``DataLoadingMonitor(replay_batches=N, replay_steps=M)``.

Guarantees:
- `draw_replay` draws the probe into about 20% of scenarios (the stopped and the resumed run, not
  the reference) from its own random stream (``f"{seed}-replay"``: the other draws of a seed stay
  as they were); None is absent from the scenario's JSON.
- `callback` is the probe as a YAML ``trainer.callbacks`` entry (the Python phases instantiate the
  same mapping).
- `check_replay` (part of `tests.contract.oracle.check`): on every rank, the model's weight and the
  global step at the fit's end are those at the train end, before the replay (the replay restores
  the model and the optimizer); a run that trained a batch and reached its train end replayed
  exactly M steps, on copies of its own first N trained batches in turn. The replayed steps are
  recorded apart (``replay`` events), so the oracle's expectations of what is trained, the cursor
  and the checkpoints stay as they are: were the replay to change them, the oracle would report it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.contract.runner import Run

#: Share of scenarios whose runs carry the probe.
REPLAY_SHARE = 0.2


@dataclass(frozen=True)
class Replay:
    batches: int = 2
    steps: int = 3
    #: The monitor's end-of-fit report (printed on rank zero; it shows the floor).
    report: bool = False


def draw_replay(seed: int) -> Replay | None:
    rng = random.Random(f"{seed}-replay")
    if rng.random() >= REPLAY_SHARE:
        return None
    return Replay(batches=rng.choice([1, 2, 4]), steps=rng.choice([1, 3, 6]), report=rng.random() < 0.25)


def callback(replay: Replay) -> dict[str, Any]:
    arguments = {"replay_batches": replay.batches, "replay_steps": replay.steps, "report": replay.report}
    return {"class_path": "lance_lightning.DataLoadingMonitor", "init_args": arguments}


def check_replay(run: Run) -> list[str]:
    replay, failures = run.scenario.replay, []
    for role in ("stop", "resume"):
        phase = run.phases.get(role)
        if phase is None:
            continue
        for rank, events in enumerate(phase.ranks):
            where = f"{role} rank {rank}"
            before = [e for e in events if e["t"] == "train_end"]
            after = [e for e in events if e["t"] == "fit_end"]
            if (
                before
                and after
                and (before[-1]["weight"], before[-1]["gstep"])
                != (
                    after[-1]["weight"],
                    after[-1]["gstep"],
                )
            ):
                failures.append(
                    f"{where}: (weight, global step) {before[-1]['weight'], before[-1]['gstep']} at the train end, "
                    f"{after[-1]['weight'], after[-1]['gstep']} after the fit: the replay changed the model"
                )
            replayed = [e["units"] for e in events if e["t"] == "replay"]
            if replay is None:
                if replayed:
                    failures.append(f"{where}: replayed {len(replayed)} steps without the probe")
                continue
            trained = [e["units"] for e in events if e["t"] == "batch"][: replay.batches]
            if not before or not trained:
                continue
            want = [trained[i % len(trained)] for i in range(replay.steps)]
            if replayed != want:
                failures.append(
                    f"{where}: replayed {len(replayed)} steps, expected {replay.steps} on its first "
                    f"{len(trained)} trained batch(es) in turn"
                )
    return failures
