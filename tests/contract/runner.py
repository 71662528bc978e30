"""Runs a scenario's phases and collects what they recorded.

Guarantees:
- The phases run in order: ``reference`` (one rank, every epoch's whole sequence), ``stop`` (the
  scenario's first run, stopped as it says) and, from the checkpoint the scenario picks,
  ``resume``. A phase on one rank that is not killed runs in this process (saves an interpreter
  start); a DDP phase, a SIGKILLed one, and every phase with ``isolate=True`` runs as a script in
  a new session, whose whole process group is killed when the phase ends (no rank or worker is
  left behind, also after the SIGKILL of rank 0) or after `PHASE_TIMEOUT_S` (reported as a hang).
  A ``cli`` scenario's stopped and resumed phases run the ``lance-lightning`` console script
  itself, the same way. Such a process is forked from the test zygote where it can mirror it
  (`tests.zygote.run_in_session`: the process, merged output, exit status, session and start-up
  variables a fresh start gives, less the imports; ``LANCE_LIGHTNING_TEST_ZYGOTE=off``: fresh).
- The checkpoint resumed from is the scenario's kind (`Checkpoint.kind`: periodic, ``last``,
  ``epoch``, ``exception``, ``saved``), at ``pick`` among that kind's (`choose`; all of them when
  the run wrote none of that kind). A SIGTERM stop runs as a script, as a SIGKILL does. A
  ``resume.session`` scenario runs both fits in the stopped phase's process; its ``resume`` phase
  is read from that process's records. A scenario with ``store.damage`` damages the stopped
  run's cached copies before the resume (`tests.contract.store.damage`; `Run.damaged` says how).
- A scenario that must fail with a clear error (`truth.expected_error`) runs only the phase that
  must fail.
- A "prepare, then fit" scenario (`tests.contract.prepared`) writes table 0's raw input instead
  of the table, SIGKILLs a prepare of it where the scenario says, and runs the stopped phase
  before the reference one: the scenario's own first fit (in this process, the CLI or DDP)
  prepares the table; the versions it pins are read after it.
- A scenario's issue #50 parts (`tests.contract.parts`: a prepare of raw files, the prediction
  writer, clips over the media corpus) run first, each in a folder of its own; ``fit=False``
  runs only them.
- The package's Lance tags on every table are recorded after the stopped and the resumed runs.
  A scenario with ``resume.maintenance`` runs `truth.maintain` in between (only when a checkpoint
  is resumed: a fresh run would read the compacted layout); the resume must then fail with a
  clear error unless the stopped run left the checkpoint's version held.
- A scenario on S3 (`tests.contract.store`) writes its tables under its own key prefix of the
  server the caller passes (the soak's one server), or of one started for this scenario alone
  and stopped when it ends; the server's credentials reach every phase (subprocesses included)
  through the environment only. Each run gets its own ``remote_cache`` arguments (`Run.caches`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from tests import zygote
from tests.contract import prepared, store, truth
from tests.contract.parts import run_parts
from tests.contract.phase import run_phase
from tests.contract.phase_config import REFERENCE_BATCH, cli_config, scenario_environment
from tests.contract.scenario import Scenario, Topology

REPO_ROOT = Path(__file__).resolve().parents[2]
PHASE_TIMEOUT_S = 300


@dataclass
class Phase:
    """What one phase recorded: the events of each rank, in rank order."""

    role: str
    ranks: list[list[dict[str, Any]]]
    returncode: int
    seconds: float
    output: str = ""
    timed_out: bool = False

    def events(self, kind: str, rank: int | None = None) -> list[dict[str, Any]]:
        ranks = self.ranks if rank is None else self.ranks[rank : rank + 1]
        return [event for events in ranks for event in events if event["t"] == kind]

    @property
    def error(self) -> dict[str, Any] | None:
        errors = self.events("error")
        return errors[0] if errors else None


@dataclass
class Checkpoint:
    path: str
    batches: int
    #: Written in the epoch-end hooks (Lightning has counted the epoch as processed).
    epoch_end: bool = False

    @property
    def kind(self) -> str:
        """Which writer wrote it (`tests.contract.scenario.CHECKPOINT_KINDS`), from its file name."""
        name = Path(self.path).name
        if name.startswith("last"):
            return "last"
        if name.startswith("on_exception"):
            return "exception"
        if name.startswith("saved"):
            return "saved"
        return "epoch" if name.startswith("d-") else "periodic"


@dataclass
class Run:
    scenario: Scenario
    phases: dict[str, Phase] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    chosen: Checkpoint | None = None
    #: Why the scenario must fail before training (`truth.expected_error`), per run.
    expected_errors: dict[str, str | None] = field(default_factory=dict)
    #: Each table's latest version before the first run (the version a run pins).
    versions: dict[str, int] = field(default_factory=dict)
    #: The package's tags on each table after a run: role -> URI -> tag -> version.
    holds: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    maintained: bool = False
    #: Each run's ``remote_cache`` arguments on S3 (`tests.contract.store.cache_arguments`).
    caches: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: What `tests.contract.store.damage` did to the cached copies before the resume.
    damaged: list[str] = field(default_factory=list)
    #: A "prepare, then fit" scenario's prepared table (`tests.contract.prepared`): its ``uri``, the
    #: ``root``, what the kill left (``killed``) and its `prepared.state` after the stopped run, the
    #: reference run and before the resume.
    prepare: dict[str, Any] = field(default_factory=dict)
    #: The failures of the scenario's issue #50 parts (`tests.contract.parts.run_parts`).
    parts: list[str] = field(default_factory=list)


def held_after_stop(scenario: Scenario, checkpointed: bool = True, stopped: bool = True) -> bool:
    """Whether the stopped run leaves its versions held (``checkpointed``: it wrote a checkpoint;
    ``stopped``: its stop fired, `stop_fired`): a kill always; an exception or SIGTERM when a
    checkpoint can need them; a normal end (a stop set past the run's last batch too) with "keep"
    (`lance_lightning.hold`)."""
    if scenario.hold == "off":
        return False
    if not stopped:
        return scenario.hold == "keep"
    if scenario.stop.kind == "sigkill":
        return True
    if scenario.stop.kind in ("exception", "sigterm"):
        return checkpointed
    return scenario.hold == "keep"


def stop_fired(phase: Phase | None) -> bool:
    """Whether the stopped run's stop cut its fit short (a stop set past its last batch never fires:
    the fit ends normally, recording ``fit_end``)."""
    return phase is None or not phase.events("fit_end", rank=0)


def run_scenario(scenario: Scenario, root: Path, isolate: bool = False, s3: Any = None) -> Run:
    """Write the scenario's tables under ``root`` (or on S3: on the started server ``s3``, or one
    started for this scenario) and run its phases; return what they recorded."""
    root.mkdir(parents=True, exist_ok=True)
    parts = run_parts(scenario, root / "parts", s3)
    if scenario.fit is False:
        return Run(scenario, parts=parts)
    if scenario.store is None:
        run = _run_scenario(scenario, root, isolate, truth.write_tables(scenario, root))
    else:
        with store.serving() if s3 is None else nullcontext(s3) as server:
            run = _run_scenario(scenario, root, isolate, store.write_tables(scenario, root, server))
    run.parts = parts
    return run


def _run_scenario(scenario: Scenario, root: Path, isolate: bool, uris: list[str]) -> Run:
    run = Run(scenario)
    run.caches = {role: store.cache_arguments(scenario, role, root, uris) for role in ("reference", "stop", "resume")}
    session = scenario.resume.session
    if session:  # one data module: the first fit's cache
        run.caches["resume"] = run.caches["stop"]
    first, then = scenario.topology, scenario.resume.topology
    run.expected_errors = {
        "reference": truth.expected_error(scenario, 1, REFERENCE_BATCH, drop_last=False),
        "stop": truth.expected_error(scenario, first.world_size, first.batch_size, scenario.drop_last),
        "resume": truth.expected_error(scenario, then.world_size, then.batch_size, scenario.drop_last),
    }
    if run.expected_errors["stop"] is None:
        run.expected_errors["stop"] = store.expected_error(scenario)
    made = scenario.prepare is not None  # "prepare, then fit": the stopped run's prepare_data makes table 0
    if made:
        prepared.write_input(scenario, root)
        run.prepare = {"uri": uris[prepared.TABLE], "root": str(root)}
        if scenario.prepare.kill is not None:
            run.prepare["killed"] = prepared.kill(scenario, root, uris[prepared.TABLE])
    else:
        run.versions = truth.latest_versions(uris)

    def stopped() -> None:
        run.phases["stop"] = _run_phase(scenario, "stop", first, root, uris, None, isolate, run.caches["stop"])
        if made:  # the versions the stopped run pinned: the prepared ones
            run.prepare["after_stop"] = prepared.state(uris[prepared.TABLE])
            if run.prepare["after_stop"] is not None:
                run.versions = truth.latest_versions(uris)

    def reference() -> None:
        if run.expected_errors["reference"] is None:
            run.phases["reference"] = _run_phase(
                scenario, "reference", Topology(), root, uris, None, isolate, run.caches["reference"]
            )
            if made:
                run.prepare["after_reference"] = prepared.state(uris[prepared.TABLE])

    if run.expected_errors["stop"] is not None:
        stopped()
        if run.versions:
            run.holds["stop"] = truth.holds(uris)
        return run
    if not made:
        reference()
    if session:  # both fits in one process: the resumed phase is read from its records
        stopped()
        if made:
            reference()
        run.phases["resume"] = _session_resume(run.phases["stop"], root, then.world_size)
        run.checkpoints = _checkpoints(root / "ckpt_stop")
        chosen = run.phases["stop"].events("chosen", rank=0)
        if chosen and chosen[0]["path"] is not None:
            run.chosen = next(c for c in run.checkpoints if c.path == chosen[0]["path"])
        between = run.phases["stop"].events("holds", rank=0)
        run.holds["stop"] = between[0]["holds"] if between else {}
        run.holds["resume"] = truth.holds(uris)
        return run
    stopped()
    run.holds["stop"] = truth.holds(uris)
    if made:
        reference()
    run.checkpoints = _checkpoints(root / "ckpt_stop")
    run.chosen = choose(run.checkpoints, scenario.checkpoints.pick, scenario.checkpoints.resume_from)
    ckpt = run.chosen.path if run.chosen is not None else None
    if scenario.store is not None and scenario.store.damage is not None:
        run.damaged = store.damage(root / "remote_cache", scenario.store.damage)
    if scenario.resume.maintenance and ckpt is not None:
        truth.maintain(uris)
        run.maintained = True
        if run.expected_errors["resume"] is None and not held_after_stop(
            scenario, stopped=stop_fired(run.phases["stop"])
        ):
            run.expected_errors["resume"] = "the checkpoint's version was cleaned up and nothing held it"
    if made:
        run.prepare["before_resume"] = prepared.state(uris[prepared.TABLE])
    run.phases["resume"] = _run_phase(scenario, "resume", then, root, uris, ckpt, isolate, run.caches["resume"])
    run.holds["resume"] = truth.holds(uris)
    return run


def choose(checkpoints: list[Checkpoint], pick: float, kind: str = "pick") -> Checkpoint | None:
    """The checkpoint at ``pick`` of the list ordered by batches trained (1.0: the last written),
    among those of ``kind`` when the run wrote one (``pick``: among all)."""
    if not checkpoints:
        return None
    checkpoints = [c for c in checkpoints if c.kind == kind] or checkpoints
    if pick >= 1.0:
        return checkpoints[-1]
    return checkpoints[min(len(checkpoints) - 1, int(pick * len(checkpoints)))]


def _session_resume(stop: Phase, root: Path, world_size: int) -> Phase:
    """The second fit of a session (`Scenario.resume.session`), recorded by the stopped phase's process."""
    ranks = _read(root, "resume", world_size)
    returncode = stop.returncode
    if stop.events("chosen", rank=0):  # the first fit ended as it should: the exit is the second's
        stop.returncode = 0
    else:
        returncode = 0
    return Phase("resume", ranks, returncode, 0.0, stop.output, stop.timed_out)


def _checkpoints(folder: Path) -> list[Checkpoint]:
    found = []
    for path in sorted(folder.glob("*.ckpt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        contract = state["contract"]
        found.append(Checkpoint(str(path), int(contract["batches"]), bool(contract["epoch_end"])))
    return sorted(found, key=lambda c: (c.batches, Path(c.path).name))


def _run_phase(
    scenario: Scenario,
    role: str,
    topology: Topology,
    root: Path,
    uris: list[str],
    ckpt: str | None,
    isolate: bool,
    cache: dict[str, Any] | None,
) -> Phase:
    spec = {"scenario": json.loads(scenario.to_json()), "role": role, "root": str(root), "uris": uris}
    spec["cache"] = cache
    if ckpt is not None:
        spec["ckpt_path"] = ckpt
    killed = role == "stop" and scenario.stop.kind in ("sigkill", "sigterm")  # a signal: never to this process
    started = time.perf_counter()
    if scenario.cli and role != "reference":
        return _run_command(scenario, role, topology, root, uris, ckpt, started, cache)
    if not isolate and topology.world_size == 1 and not killed:
        returncode = 0
        try:
            run_phase(spec)
        except Exception:
            returncode = 3
        return Phase(role, _read(root, role, 1), returncode, time.perf_counter() - started)
    path = root / f"{role}.json"
    path.write_text(json.dumps(spec))
    return _run_process(
        [sys.executable, str(Path(__file__).with_name("phase.py")), str(path)], role, topology, root, started, scenario
    )


def _run_command(
    scenario: Scenario,
    role: str,
    topology: Topology,
    root: Path,
    uris: list[str],
    ckpt: str | None,
    started: float,
    cache: dict[str, Any] | None,
) -> Phase:
    """``lance-lightning fit --config <yaml> [--ckpt_path ...]`` in a subprocess; a non-zero exit is
    recorded as the error (``CommandError``: the exit status and stderr's end) of as many ranks as
    printed a one-screen error (rank 0 at least)."""
    config = root / f"{role}.yaml"
    config.write_text(yaml.safe_dump(cli_config(scenario, role, str(root), uris, cache)))
    command = [str(Path(sys.executable).with_name("lance-lightning")), "fit", "--config", str(config)]
    if ckpt is not None:
        command += ["--ckpt_path", ckpt]
    phase = _run_process(command, role, topology, root, started, scenario)
    if phase.returncode in (0, -signal.SIGKILL) or phase.timed_out:
        return phase
    if role == "stop" and scenario.stop.kind == "exception" and "ScenarioStop" in phase.output:
        phase.ranks[0].append({"t": "stopped"})
    elif role == "stop" and scenario.stop.kind == "sigterm" and phase.returncode in (143, -signal.SIGTERM):
        phase.ranks[0].append({"t": "stopped"})
    else:
        shown = phase.output if phase.output.startswith("Fatal Python error") else phase.output[-2000:]
        event = {"t": "error", "type": "CommandError", "message": f"exit {phase.returncode}: {shown}"}
        # Every rank prints its own one-screen error into the shared output: one per rank that reported.
        reported = max(1, phase.output.count("lance-lightning fit: error:"))
        for events in phase.ranks[:reported]:
            events.append(event)
    return phase


def _run_process(
    command: list[str], role: str, topology: Topology, root: Path, started: float, scenario: Scenario
) -> Phase:
    env = {**_env(), **scenario_environment(scenario)}
    done = zygote.run_in_session(command, cwd=REPO_ROOT, env=env, timeout=PHASE_TIMEOUT_S)
    output = done.output
    ranks = _read(root, role, topology.world_size)
    crash = output.find("Fatal Python error")  # faulthandler's report: where every thread was
    kept = output[crash : crash + 6000] + "\n[...]\n" if crash >= 0 else ""
    return Phase(role, ranks, done.returncode, time.perf_counter() - started, kept + output[-6000:], done.timed_out)


def _read(root: Path, role: str, world_size: int) -> list[list[dict[str, Any]]]:
    ranks = []
    for rank in range(world_size):
        path = root / f"{role}.rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        ranks.append([json.loads(line) for line in lines if line.strip()])
    return ranks


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK", "MASTER_PORT", "MASTER_ADDR")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a crash (SIGSEGV, SIGABRT) prints every thread's Python stack
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "lance_lightning_test_pycache"))
    return env
