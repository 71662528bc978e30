"""The randomized contract checker in the suite: a fixed-seed sample, every defect it found, and the
oracle's own tests.

- `test_sample` (in the soak run, ``uv run pytest -m soak``): scenarios drawn from fixed seeds
  (`SAMPLE_SEEDS`, about 5 minutes on a 2-core machine), each through real
  ``Trainer.fit(ckpt_path=...)`` (real 2-rank DDP where it draws 2; a scenario on S3 starts its own
  S3 server on loopback for the test).
- `test_found_defect`: every scenario in ``cases.jsonl``: each failed on the code where the checker
  found it (its ``found`` says how) and must pass for good.
- `test_clip_sample` (in the default run): scenarios drawn from `CLIP_SEEDS`, which train on video
  clips (`Scenario.clips`) composed with the generator's other draws; the oracle's clip checks
  report a clip with other frames, times, row or start (`test_oracle_reports_a_wrong_clip`).
- `test_wide_batch_sample` and `test_losing_workers_sample` (in the default run): the seeds whose
  scenarios send batches through shared-memory slabs (`WIDE_SEEDS`) and whose raced workers lose
  every trial, checked against the retrial rule in a fit stopped by SIGKILL and resumed
  (`LOSE_SEED`). Who read each batch (`tests.contract.readers`) is checked in the replayed case
  ``forced-workers-never-started-short-epochs-cli`` and, rule by rule, per epoch
  (`test_who_reads_is_checked_per_epoch`).
- `test_oracle_*`: the oracle reports what a wrong run would look like (a repeated or a skipped
  unit, another order, a short epoch, a wrong cursor; where Lightning's loop meets the loader: a
  short epoch after a fractional-limit resume, the rest of an epoch lost after a ``max_steps``
  stop, a batch repeated by a second fit), so a green sample is not the oracle missing everything.

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
from tests.contract.readers import epoch_problem
from tests.contract.runner import Run, held_after_stop, run_scenario
from tests.contract.scenario import (
    ALL_STOPS,
    CHECKPOINT_KINDS,
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
SAMPLE_SEEDS = [4, 7, 14, 15, 19, 21, 25, 28, 35, 39, 42, 46, 80, 82, 97, 15151]
SHUFFLES = ("none", "shard", "row", "buffer")
#: Seeds of the default run whose scenarios train on video clips, each resumed in this process on
#: another batch size (a few seconds each): 1017, two random-start clips of each video matching a
#: filter on a table with deleted rows, a buffer shuffle, validation on clips every epoch, stopped
#: by ``max_steps`` and resumed from ``last.ckpt``; 969, three clips of each of 16 videos in 2
#: fragments, a row shuffle, ``limit_train_batches``, stopped at an epoch end, the replay probe.
#: The soak's clip scenarios add the rest: mixtures, worker processes, DDP (seeds 7, 25 and 42).
CLIP_SEEDS = [1017, 969]
#: Seeds of the default run whose scenarios send wide batches (`tests.worker_probe.WidenRows`) from 2
#: worker processes per rank on 2 DDP ranks through shared-memory slabs: 10, batches over 1 MiB
#: (a slab each), stopped by ``max_steps`` and resumed on 2 ranks; 189, batches of about 96 KiB
#: (a worker's run shares a slab), the first batches read while the workers start.
WIDE_SEEDS = {"over 1 MiB": 10, "96 KiB": 189}
#: The default run's seed whose raced workers lose every trial (`Scenario.lose`): stopped by SIGKILL
#: without workers, resumed from ``last.ckpt`` with 2 workers up to epoch 7, so the oracle's check
#: of the race's retrials (`tests.contract.retrials`) meets a real fit outside the soak as well.
#: It fails a retrial one epoch early (``RETRY_EPOCHS = 0``: "trial 2 began in epoch 4, before epoch
#: 5"); not a wait that stops doubling (its fit ends before a third trial is due), which
#: `tests/scenarios/test_race_retrials.py` checks.
LOSE_SEED = 15151


def _run(scenario: Scenario, root: Path) -> list[str]:
    try:
        return check(run_scenario(scenario, root))
    except Inapplicable as refused:
        pytest.skip(f"Lightning refuses this configuration: {refused}")


def _fails(scenario: Scenario, failures: list[str]) -> str:
    return "\n".join(failures[:5]) + f"\nreplay with this line in a file (soak --replay FILE):\n{scenario.to_json()}"


# -- the fixed sample ------------------------------------------------------------------------------
@pytest.mark.soak  # seeded random scenarios beyond the replay set (cases.jsonl): `uv run pytest -m soak`
@pytest.mark.slow
@pytest.mark.parametrize("seed", SAMPLE_SEEDS)
def test_sample(seed: int, tmp_path: Path) -> None:
    scenario = generate(seed)
    failures = _run(scenario, tmp_path)
    assert not failures, _fails(scenario, failures)


def test_sample_covers_the_options() -> None:
    scenarios = [generate(seed) for seed in SAMPLE_SEEDS]
    wide = scenarios + [generate(seed) for seed in WIDE_SEEDS.values()]
    covered = {
        "ddp": any(s.uses_ddp for s in scenarios),
        "workers": any(s.topology.num_workers or s.resume.topology.num_workers for s in scenarios),
        "mixture": any(s.mixture is not None for s in scenarios),
        "scheduled mixture": any(s.mixture is not None and s.mixture.schedule for s in scenarios),
        "packing": any(s.packing is not None for s in scenarios),
        "clips": any(s.clips is not None for s in scenarios),
        "clips in a mixture": any(s.clips is not None and s.mixture is not None for s in scenarios),
        "filter": any(s.source is not None and s.source.filter for s in scenarios),
        "calls before fit": any(s.calls or s.resume.calls for s in scenarios),
        "cli": any(s.cli for s in scenarios),
        "a clear error": any(truth.epoch_units(s) == 0 for s in scenarios),
        **{f"stop {kind}": any(s.stop.kind == kind for s in scenarios) for kind in ALL_STOPS},
        **{
            f"shuffle {kind}": any(s.shuffle.kind == kind for s in scenarios)
            for kind in ("none", "shard", "row", "buffer")
        },
        "accumulate_grad_batches": any(s.loop.accumulate > 1 for s in scenarios),
        "val_check_interval": any(s.loop.val_check_interval is not None for s in scenarios),
        "limit_train_batches": any(isinstance(s.loop.limit_train_batches, int) for s in scenarios),
        "limit_train_batches fraction": any(isinstance(s.loop.limit_train_batches, float) for s in scenarios),
        "val_check_interval fraction": any(isinstance(s.loop.val_check_interval, float) for s in scenarios),
        "check_val_every_n_epoch": any(s.loop.check_val_every_n_epoch != 1 for s in scenarios),
        "num_sanity_val_steps": any(s.loop.num_sanity_val_steps != 2 for s in scenarios),
        "reload_dataloaders_every_n_epochs": any(s.loop.reload_every for s in scenarios),
        "resumed max_epochs": any(s.resume.max_epochs is not None for s in scenarios),
        "resumed max_steps": any(isinstance(s.resume.max_steps, int) for s in scenarios),
        "a second fit of one data module": any(s.resume.session for s in scenarios),
        **{
            f"resume from {kind}": any(s.checkpoints.resume_from == kind for s in scenarios)
            for kind in CHECKPOINT_KINDS
        },
        "a damaged cached copy": any(s.store is not None and s.store.damage is not None for s in scenarios),
        "a change on resume": any(s.resume.topology != s.topology for s in scenarios),
        **{f"hold_versions {mode}": any(s.hold == mode for s in scenarios) for mode in ("fit", "keep", "off")},
        "maintenance, version held": any(s.resume.maintenance and held_after_stop(s) for s in scenarios),
        "maintenance, version not held": any(s.resume.maintenance and not held_after_stop(s) for s in scenarios),
        "s3": any(s.store is not None for s in scenarios),
        "cache changed on resume": any(
            s.store is not None and s.store.mode in ("on->off", "off->on") for s in scenarios
        ),
        "replay probe": any(s.replay is not None for s in scenarios),
        "prepare, then fit": any(s.prepare is not None for s in scenarios),
        "a killed prepare resumed by the fit": any(s.prepare is not None and s.prepare.kill for s in scenarios),
        "batches over 1 MiB from workers (slabs)": any(s.wide and s.wide_bytes is None for s in wide),
        "runs of 96 KiB batches from workers (one slab a run)": any(s.wide and s.wide_bytes for s in wide),
        "workers waited for (no hand-over)": any(s.handoff is False for s in scenarios),
        "workers' trial lost: this process reads on": any(s.worker_choice == "in_process" for s in scenarios),
        "who reads decided by the measured race": any(s.worker_choice == "race" for s in scenarios),
        # 15151: raced workers that lose every trial (`Scenario.lose`) in a fit resumed after a SIGKILL
        # from last.ckpt: trials in epochs 2 and 4 (or 3 and 5), lost, by the rule (`tests.contract.retrials`).
        "workers that lose the race, tried again": any(s.lose and truth.epoch_units(s) > 0 for s in scenarios),
        "workers from the stock fork server": any(s.stock_server for s in scenarios),
        "who read each batch checked (forced to the workers)": any(s.record_pids for s in scenarios),
        "workers from a fork server forked from the trainer": any(
            not s.stock_server and (s.topology.num_workers or s.resume.topology.num_workers) for s in scenarios
        ),
        "first batches read while workers start": any(
            s.handoff is None and (s.topology.num_workers or s.resume.topology.num_workers) for s in scenarios
        ),
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


def test_clips_are_drawn_apart_from_packing_and_leave_other_scenarios_as_they_were() -> None:
    """About 17% of scenarios train on clips, never packed, only on video tables; a scenario
    without clips writes no clip field (its JSON, and so every case written before, is unchanged)."""
    scenarios = [generate(seed) for seed in range(300)]
    clipped = [s for s in scenarios if s.clips is not None]
    assert 0.1 < len(clipped) / len(scenarios) < 0.25, len(clipped)
    assert all(s.packing is None and all(t.video for t in s.tables) and s.store is None for s in clipped)
    assert {s.clips.starts for s in clipped} == {"random", "even"}
    assert {s.clips.per_item for s in clipped} == {1, 2, 3}
    assert any(s.mixture is not None for s in clipped) and any(s.uses_ddp for s in clipped)
    assert any(s.cli for s in clipped)
    for scenario in scenarios:
        if scenario.clips is None:
            plain = json.loads(scenario.to_json())
            assert "clips" not in plain and not any("video" in table for table in plain["tables"])
            assert not any(t.video for t in scenario.tables)


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


# -- ... and where Lightning's loop meets the loader (issue #37) -------------------------------------------
def _fraction_limited() -> Scenario:
    """``limit_train_batches=0.5`` of 20 batches, resumed from step=10: the last batch of limited epoch 0."""
    return Scenario(
        id=0,
        tables=[Table(rows=80, fragment_rows=17)],
        source=Source(0),
        shuffle=Shuffle("row", seed=4),
        topology=Topology(batch_size=4),
        loop=Loop(epochs=3, limit_train_batches=0.5),
        stop=Stop("max_steps", 14),
        checkpoints=Checkpoints(every=10, resume_from="periodic"),
        resume=Resume(topology=Topology(batch_size=4)),
    )


def _second_fit() -> Scenario:
    """One process, one data module: a fit stopped by ``max_steps`` inside epoch 0, validate, then a
    new Trainer fits from ``trainer.save_checkpoint``'s file (Lightning counts epoch 0 as finished)."""
    return Scenario(
        id=0,
        tables=[Table(rows=60, fragment_rows=17)],
        source=Source(0, "label != 3"),
        shuffle=Shuffle("row", seed=4),
        topology=Topology(batch_size=4),
        loop=Loop(epochs=2),
        stop=Stop("max_steps", 5),
        checkpoints=Checkpoints(every=2, resume_from="saved", save_after_fit=True),
        resume=Resume(topology=Topology(batch_size=4), session=True, between=["validate"]),
    )


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    runs = {
        "fraction": run_scenario(_fraction_limited(), tmp_path_factory.mktemp("fraction")),
        "second fit": run_scenario(_second_fit(), tmp_path_factory.mktemp("second_fit")),
    }
    for run in runs.values():
        assert check(run) == []
    return runs


def _short_epoch_after_fraction_resume(run: Run) -> None:
    """Issue #37 (1): the epoch after the resume trains half its limited batches."""
    events = run.phases["resume"].ranks[0]
    for event in [e for e in _batches(run, "resume") if e["epoch"] == 1][5:]:
        events.remove(event)


def _rest_of_epoch_lost(run: Run) -> None:
    """Issue #37 (3): the rest of the epoch a max_steps stop cut short is never trained."""
    events = run.phases["resume"].ranks[0]
    for event in [e for e in _batches(run, "resume") if e["epoch"] == 0]:
        events.remove(event)


def _batch_repeated_by_second_fit(run: Run) -> None:
    """Issue #37 (2): the second fit trains again a batch the first had trained."""
    _batches(run, "resume")[0]["units"] = list(_batches(run, "stop")[-1]["units"])


@pytest.mark.parametrize(
    ("name", "mutate", "expected"),
    [
        ("fraction", _short_epoch_after_fraction_resume, "5 expected batch(es) before it lost"),
        ("second fit", _rest_of_epoch_lost, "8 expected batch(es) before it lost"),
        ("second fit", _batch_repeated_by_second_fit, "a repeat of batch 4 of the stopped run"),
    ],
    ids=["short-epoch-after-fraction-resume", "rest-of-epoch-lost-after-max-steps", "repeat-after-second-fit"],
)
def test_oracle_reports_a_wrong_loop(
    loop_runs: dict[str, Run], name: str, mutate: Callable[[Run], None], expected: str
) -> None:
    run = copy.deepcopy(loop_runs[name])
    mutate(run)
    failures = check(run)
    assert any(expected in failure for failure in failures), failures


# -- "prepare, then fit" (issue #40): the oracle catches a prepare gone wrong, without a fit --------------
def test_oracle_reports_a_prepared_table_that_differs_or_a_second_prepare_that_commits(tmp_path: Path) -> None:
    import lance

    from lance_lightning.source import Prepare
    from lance_lightning.write.prepare import prepare
    from tests.contract import prepared
    from tests.contract.runner import Phase
    from tests.contract.scenario import Prepared

    scenario = replace(_small(), prepare=Prepared(workers=2, kill="commit:2"))
    assert Scenario.from_json(scenario.to_json()) == scenario and '"prepare"' in scenario.to_json()
    uri = str(tmp_path / "table0.lance")
    prepared.write_input(scenario, tmp_path)
    killed = prepared.kill(scenario, tmp_path, uri)
    assert killed["returncode"] != 0 and not killed["exists"], killed
    report = prepare(Prepare(**prepared.spec(scenario, tmp_path)), uri, progress=False)
    assert report.status == "resumed"
    again = prepare(Prepare(**prepared.spec(scenario, tmp_path)), uri, progress=False)
    run = Run(scenario, prepare={"uri": uri, "root": str(tmp_path), "killed": killed})
    run.prepare["after_stop"] = run.prepare["before_resume"] = prepared.state(uri)
    events = [{"t": "prepared", "lines": {uri: report.line()}}, {"t": "prepared", "lines": {uri: again.line()}}]
    run.phases["stop"] = Phase("stop", [events], 0, 0.0)
    assert prepared.check(run) == []
    run.phases["resume"] = Phase("resume", [[{"t": "prepared", "lines": {uri: report.line()}}]], 0, 0.0)
    assert any("a second prepare did something" in p for p in prepared.check(run))
    del run.phases["resume"]
    lance.dataset(uri).delete("id = 5")  # a row lost, and a commit after the first fit
    problems = prepared.check(run)
    assert any("rows differ from a direct write" in p for p in problems), problems
    assert any("the resumed run committed" in p for p in problems), problems


@pytest.mark.slow
@pytest.mark.parametrize("seed", list(WIDE_SEEDS.values()), ids=list(WIDE_SEEDS))
def test_wide_batch_sample(tmp_path: Path, seed: int) -> None:
    scenario = generate(seed)
    assert scenario.wide and scenario.uses_ddp and scenario.topology.num_workers == 2
    try:
        failures = check(run_scenario(scenario, tmp_path))
    except Inapplicable as refused:  # a fixed seed must be one Lightning runs: else the slabs go unchecked
        pytest.fail(f"seed {seed} draws a configuration Lightning refuses ({refused}): choose another seed")
    assert not failures, _fails(scenario, failures)


@pytest.mark.slow
def test_losing_workers_sample(tmp_path: Path) -> None:
    scenario = generate(LOSE_SEED)
    assert scenario.lose and scenario.worker_choice == "race" and scenario.resume.topology.num_workers == 2
    try:
        failures = check(run_scenario(scenario, tmp_path))
    except Inapplicable as refused:  # a fixed seed must be one Lightning runs: else the retrials go unchecked
        pytest.fail(f"seed {LOSE_SEED} draws a configuration Lightning refuses ({refused}): choose another seed")
    assert not failures, _fails(scenario, failures)


@pytest.mark.parametrize(
    ("workers", "num_workers", "handoff", "problem"),
    [
        ([False] * 5 + [True] * 4, 2, None, None),
        ([True] * 9, 2, None, None),  # persistent workers read the whole epoch
        ([False] * 5, 2, None, None),  # too short to hand over
        ([False] * 6 + [True] * 3, 2, None, "step 5 of 9 read in process"),
        ([False] * 9, 2, None, "step 5 of 9 read in process"),  # the workers never started
        ([True] * 8 + [False], 2, False, "steps [8] read in process, workers waited for"),
        ([False, True], 0, None, "a worker made a batch of a run without workers"),
        ([False] * 9, 0, None, None),
    ],
    ids=["hand-over", "persistent", "short", "late", "never", "waited-for", "no-workers", "in-process"],
)
def test_who_reads_is_checked_per_epoch(
    workers: list[bool], num_workers: int, handoff: bool | None, problem: str | None
) -> None:
    found = epoch_problem(workers, num_workers, handoff, last_own=4)
    assert (found is None) if problem is None else (found is not None and problem in found), found


# -- video clips: a sample in the default run, and the oracle's clip checks --------------------------------
@pytest.fixture(scope="module")
def clip_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    scenario = generate(CLIP_SEEDS[0])
    assert scenario.clips is not None
    return run_scenario(scenario, tmp_path_factory.mktemp("clips"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", CLIP_SEEDS)
def test_clip_sample(seed: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run = request.getfixturevalue("clip_run") if seed == CLIP_SEEDS[0] else run_scenario(generate(seed), tmp_path)
    assert run.scenario.clips is not None
    try:
        failures = check(run)
    except Inapplicable as refused:  # a fixed seed must be one Lightning runs: else the clips go unchecked
        pytest.fail(f"clip seed {seed} draws a configuration Lightning refuses ({refused}): choose another seed")
    assert not failures, _fails(run.scenario, failures)


def _first_clip(run: Run) -> tuple[dict[str, Any], list[Any]]:
    batch = _batches(run, "resume")[0]
    return batch, batch["clips"][0]


def _clip_frames(run: Run) -> None:
    _first_clip(run)[1][0] ^= 1  # another frame's pixels


def _clip_times(run: Run) -> None:
    _first_clip(run)[1][2][-1] += 1 / 24  # its last frame one frame late


def _clip_row(run: Run) -> None:
    _first_clip(run)[1][1] += 1  # another row's _clip_row


def _clip_starts_of_the_next_epoch(run: Run) -> None:
    """Every clip of the resumed run's first batch where the next data epoch starts it (the video
    right, the start drawn for the wrong epoch), frames and times of that clip."""
    scenario = run.scenario
    batch, _ = _first_clip(run)
    this, then = (truth.source_units(scenario, 0, batch["epoch"] + e).tolist() for e in (0, 1))
    batch["units"] = [then[this.index(key)] for key in batch["units"]]
    uri = list(run.versions)[scenario.sources[0].table]
    for key, clip in zip(batch["units"], batch["clips"]):
        row, start = divmod(key, truth.CLIP_KEY)
        clip[2], clip[0] = truth.clip_content(scenario.clips, uri, row, start)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_clip_frames, "its frames are not frames"),
        (_clip_times, "frame times"),
        (_clip_row, "_clip_row"),
        (_clip_starts_of_the_next_epoch, "no batch of the intent"),
        (_repeat_unit, "no batch of the intent"),
    ],
    ids=["other-frames", "other-times", "other-row", "starts-of-another-epoch", "repeated-clip"],
)
def test_oracle_reports_a_wrong_clip(clip_run: Run, mutate: Callable[[Run], None], expected: str) -> None:
    run = copy.deepcopy(clip_run)
    assert _batches(run, "resume"), "a resumed run with batches to change"
    mutate(run)
    failures = check(run)
    assert any(expected in failure for failure in failures), failures
