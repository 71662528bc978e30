"""The randomized contract checker in the suite: a fixed-seed sample, every defect it found, and the
oracle's own tests.

- `test_sample`: scenarios drawn from fixed seeds (`SAMPLE_SEEDS`, about 4 minutes on a 2-core
  machine), each through real ``Trainer.fit(ckpt_path=...)`` (real 2-rank DDP where it draws 2; a
  scenario on S3 starts its own S3 server on loopback for the test).
- `test_found_defect`: every scenario in ``cases.jsonl``: each failed on the code where the checker
  found it (its ``found`` says how) and must pass for good.
- `test_oracle_*`: the oracle reports what a wrong run would look like (a repeated or a skipped
  unit, another order, a short epoch, a wrong cursor), so a green sample is not the oracle
  missing everything.

A longer soak with new seeds: ``uv run python -m tests.contract.soak --scenarios 500 --seed N``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.contract import truth
from tests.contract.oracle import Inapplicable, check
from tests.contract.runner import Run, held_after_stop, run_scenario
from tests.contract.scenario import (
    STOPS,
    Checkpoints,
    Loop,
    Resume,
    Scenario,
    Shuffle,
    Source,
    Stop,
    Table,
    Topology,
    generate,
)

CASES = Path(__file__).with_name("cases.jsonl")
#: Seeds whose scenarios together compose every kind of option (checked by `test_sample_covers_the_options`).
SAMPLE_SEEDS = [4, 7, 14, 15, 19, 21, 28, 35, 39, 42, 46, 82, 97]
SHUFFLES = ("none", "shard", "row", "buffer")


def _run(scenario: Scenario, root: Path) -> list[str]:
    try:
        return check(run_scenario(scenario, root))
    except Inapplicable as refused:
        pytest.skip(f"Lightning refuses this configuration: {refused}")


def _fails(scenario: Scenario, failures: list[str]) -> str:
    return "\n".join(failures[:5]) + f"\nreplay with this line in a file (soak --replay FILE):\n{scenario.to_json()}"


# -- the fixed sample ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("seed", SAMPLE_SEEDS)
def test_sample(seed: int, tmp_path: Path) -> None:
    scenario = generate(seed)
    failures = _run(scenario, tmp_path)
    assert not failures, _fails(scenario, failures)


def test_sample_covers_the_options() -> None:
    scenarios = [generate(seed) for seed in SAMPLE_SEEDS]
    covered = {
        "ddp": any(s.uses_ddp for s in scenarios),
        "workers": any(s.topology.num_workers or s.resume.topology.num_workers for s in scenarios),
        "mixture": any(s.mixture is not None for s in scenarios),
        "scheduled mixture": any(s.mixture is not None and s.mixture.schedule for s in scenarios),
        "packing": any(s.packing is not None for s in scenarios),
        "filter": any(s.source is not None and s.source.filter for s in scenarios),
        "calls before fit": any(s.calls or s.resume.calls for s in scenarios),
        "cli": any(s.cli for s in scenarios),
        "a clear error": any(truth.epoch_units(s) == 0 for s in scenarios),
        **{f"stop {kind}": any(s.stop.kind == kind for s in scenarios) for kind in STOPS},
        **{
            f"shuffle {kind}": any(s.shuffle.kind == kind for s in scenarios)
            for kind in ("none", "shard", "row", "buffer")
        },
        "accumulate_grad_batches": any(s.loop.accumulate > 1 for s in scenarios),
        "val_check_interval": any(s.loop.val_check_interval is not None for s in scenarios),
        "limit_train_batches": any(s.loop.limit_train_batches for s in scenarios),
        "reload_dataloaders_every_n_epochs": any(s.loop.reload_every for s in scenarios),
        "a change on resume": any(s.resume.topology != s.topology for s in scenarios),
        **{f"hold_versions {mode}": any(s.hold == mode for s in scenarios) for mode in ("fit", "keep", "off")},
        "maintenance, version held": any(s.resume.maintenance and held_after_stop(s) for s in scenarios),
        "maintenance, version not held": any(s.resume.maintenance and not held_after_stop(s) for s in scenarios),
        "s3": any(s.store is not None for s in scenarios),
        "cache changed on resume": any(
            s.store is not None and s.store.mode in ("on->off", "off->on") for s in scenarios
        ),
        "replay probe": any(s.replay is not None for s in scenarios),
    }
    assert all(covered.values()), [name for name, yes in covered.items() if not yes]


# -- every defect found, replayed ---------------------------------------------------------------------
def _cases() -> list[Any]:
    cases = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [pytest.param(case, id=case["name"], marks=pytest.mark.slow) for case in cases]


@pytest.mark.parametrize("case", _cases())
def test_found_defect(case: dict[str, Any], tmp_path: Path) -> None:
    scenario = Scenario.from_json(case["scenario"])
    failures = _run(scenario, tmp_path)
    assert not failures, f"{case['name']} is back ({case['found']}):\n" + _fails(scenario, failures)


def test_cases_round_trip_and_are_named_once() -> None:
    names = []
    for line in CASES.read_text().splitlines():
        case = json.loads(line)
        scenario = Scenario.from_json(case["scenario"])
        assert json.loads(scenario.to_json()) == case["scenario"], case["name"]
        names.append(case["name"])
    assert len(names) == len(set(names))


def test_truth_schedules_match_the_guide() -> None:
    """The oracle's own scheduled counts, on the guide's examples (hand-computed)."""
    from tests.contract.scenario import Mixture

    stages = [{"until_step": 3, "weights": [1.0, 0.0]}, {"weights": [1.0, 1.0]}]
    warm = Mixture([Source(0), Source(0)], [1.0, 1.0], "samples", 200, 50, stages, "constant", 100)
    assert truth.scheduled_counts(warm, 0) == [[50, 0]] * 4
    assert truth.scheduled_counts(warm, 1) == [[50, 0], [50, 0], [25, 25], [25, 25]]  # sample 300 onwards
    ramp = Mixture([Source(0), Source(0)], [1.0, 1.0], "samples", 100, 10, [
        {"until_sample": 40, "weights": [1.0, 0.0]}, {"weights": [0.0, 1.0]}], "linear")  # fmt: skip
    assert truth.scheduled_counts(ramp, 0)[:5] == [[10, 0], [8, 2], [5, 5], [3, 7], [0, 10]]  # 7.5: the tie to a


def test_generate_is_deterministic_and_round_trips() -> None:
    for seed in range(50):
        scenario = generate(seed)
        assert generate(seed) == scenario
        assert Scenario.from_json(scenario.to_json()) == scenario


# -- the oracle catches what a wrong run looks like ------------------------------------------------------
def _small() -> Scenario:
    """One rank, a row shuffle, a resume with another batch size: small enough to run in-process in seconds."""
    return Scenario(
        id=0,
        tables=[Table(rows=60, fragment_rows=17)],
        source=Source(0, "label != 3"),
        shuffle=Shuffle("row", seed=4),
        topology=Topology(batch_size=6),
        loop=Loop(epochs=3),
        stop=Stop("max_steps", 4),
        checkpoints=Checkpoints(every=2),
        resume=Resume(topology=Topology(batch_size=4)),
    )


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = run_scenario(_small(), tmp_path_factory.mktemp("oracle"))
    assert check(run) == []
    return run


def _batches(run: Run, role: str) -> list[dict[str, Any]]:
    return [event for event in run.phases[role].ranks[0] if event["t"] == "batch"]


def _swap_units(run: Run) -> None:
    first, second = _batches(run, "resume")[:2]
    first["units"][0], second["units"][0] = second["units"][0], first["units"][0]


def _repeat_unit(run: Run) -> None:
    batch = _batches(run, "resume")[0]
    batch["units"][1] = batch["units"][0]


def _skip_last_batch(run: Run) -> None:
    events = run.phases["resume"].ranks[0]
    events.remove(_batches(run, "resume")[-1])


def _wrong_length(run: Run) -> None:
    epoch = next(e for e in run.phases["resume"].ranks[0] if e["t"] == "epoch")
    epoch["num_training_batches"] += 1


def _wrong_cursor(run: Run) -> None:
    save = next(e for e in run.phases["stop"].ranks[0] if e["t"] == "save")
    save["cursor"]["rows_consumed"] += 1


def _wrong_reference_order(run: Run) -> None:
    batch = next(e for e in run.phases["reference"].ranks[0] if e["t"] == "batch")
    batch["units"][0] += 10_000


def _tag_left_behind(run: Run) -> None:
    uri = next(iter(run.versions))
    run.holds["resume"][uri] = {"lance-lightning-20261125-000000-abcdef-v1": 1}


def _replay_changed_model(run: Run) -> None:
    end = next(e for e in run.phases["resume"].ranks[0] if e["t"] == "fit_end")
    end["weight"] += 0.5


def _tag_missing(run: Run) -> None:
    run.scenario = replace(run.scenario, hold="keep")  # the stopped run should have kept its tag


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_swap_units, "resume batch 0"),
        (_repeat_unit, "resume batch 0"),
        (_skip_last_batch, "resume: trained"),
        (_wrong_length, "Lightning took epoch"),
        (_wrong_cursor, "stop: cursor at save"),
        (_wrong_reference_order, "reference epoch 0"),
        (_tag_left_behind, "carries the tags {'lance-lightning-20261125-000000-abcdef-v1': 1}, expected {}"),
        (_tag_missing, "carries the tags {}, expected one per version in [1]"),
        (_replay_changed_model, "the replay changed the model"),
    ],
    ids=["order", "repeat", "skip", "length", "cursor", "reference", "tag-left", "tag-missing", "replay-model"],
)
def test_oracle_reports_a_wrong_run(clean_run: Run, mutate: Callable[[Run], None], expected: str) -> None:
    run = copy.deepcopy(clean_run)
    mutate(run)
    failures = check(run)
    assert any(expected in failure for failure in failures), failures
