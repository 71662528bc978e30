"""Draw and check scenarios: ``uv run python -m tests.contract.soak --scenarios 500 --seed 20261125``.

Each scenario prints one line (its id, what it composes, seconds, PASS or FAIL); a failure also
prints the scenario as one JSON line (``FAILED {...}``) and appends it, with the oracle's
findings, to ``--out``: replay one with ``--replay FILE`` or add it to
``tests/contract/cases.jsonl`` (see ``tests/contract/test_contract.py``). ``--shrink`` retries a
failing scenario with simpler settings and reports the simplest one that still fails.

Scenarios on S3 share one S3 server (moto on loopback), started at the first of them and stopped
when the soak ends; the remote caches' default directory (``XDG_CACHE_HOME``) is a temporary one,
never the user's.

Leave the package's files alone while a soak runs: its one process keeps a forkserver whose
modules were imported at its start, and DataLoader workers forked from it that import a changed
module fail to start (``WorkerDiedError``), which is the edit, not the package.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from tests.contract import store
from tests.contract.oracle import Inapplicable, check
from tests.contract.runner import run_scenario
from tests.contract.scenario import Loop, Scenario, Topology, generate


def describe(scenario: Scenario) -> str:
    """A short summary of what the scenario composes."""
    parts = [f"#{scenario.id}" + (" cli" if scenario.cli else "")]
    if scenario.mixture is not None:
        m = scenario.mixture
        parts.append(
            f"mixture{len(m.sources)}:{m.epoch}" + (f"({m.samples}/{m.block})" if m.samples else f"/{m.block}")
        )
    else:
        parts.append(f"filter={scenario.source.filter!r}" if scenario.source.filter else "nofilter")
    parts.append(scenario.shuffle.kind)
    if scenario.packing is not None:
        parts.append(f"packed{scenario.packing.seq_len}")
    if scenario.clips is not None:
        c = scenario.clips
        parts.append(f"clips{c.per_item}x{c.frames}/{c.frame_step}:{c.starts}")
    a, b = scenario.topology, scenario.resume.topology
    parts.append(f"W{a.world_size}B{a.batch_size}K{a.num_workers}->W{b.world_size}B{b.batch_size}K{b.num_workers}")
    parts.append(f"stop={scenario.stop.kind}:{scenario.stop.at}")
    loop = scenario.loop
    for name, value in (
        ("acc", loop.accumulate),
        ("val", loop.val_check_interval),
        ("limit", loop.limit_train_batches),
        ("reload", loop.reload_every),
    ):
        if value not in (None, 0, 1) or (name == "val" and value is not None):
            parts.append(f"{name}={value}")
    if loop.check_val_every_n_epoch != 1:
        parts.append(f"val_every={loop.check_val_every_n_epoch}")
    if loop.validate:
        parts.append("validate")
    if loop.num_sanity_val_steps != 2:
        parts.append(f"sanity={loop.num_sanity_val_steps}")
    resume = scenario.resume
    checkpoints = scenario.checkpoints
    saved = checkpoints.save_after_fit and checkpoints.resume_from != "saved"
    parts.append(f"ckpt={checkpoints.resume_from}" + ("+saved" if saved else ""))
    for name, value in (
        ("max_epochs", resume.max_epochs),
        ("max_steps", resume.max_steps),
        ("max_time", resume.max_time),
    ):
        if value is not None:
            parts.append(f"resume.{name}={value}")
    if resume.session:
        parts.append("second-fit" + (f"({','.join(resume.between)})" if resume.between else ""))
    if scenario.calls or scenario.resume.calls:
        parts.append("calls=" + ",".join(scenario.calls) + "|" + ",".join(scenario.resume.calls))
    if scenario.hold != "fit" or scenario.resume.maintenance:
        parts.append(f"hold={scenario.hold}" + ("+maintenance" if scenario.resume.maintenance else ""))
    if scenario.store is not None:
        small = scenario.store.cache.small or scenario.store.resume_cache.small
        tiny = " tiny-limit(refused)" if scenario.store.cache.tiny else ""
        parts.append(f"s3 cache={scenario.store.mode}" + (" small-limit" if small else "") + tiny)
        if scenario.store.damage is not None:
            parts.append(f"damage={scenario.store.damage}")
    if scenario.replay is not None:
        parts.append(f"replay={scenario.replay.batches}x{scenario.replay.steps}")
    if scenario.prepare is not None:
        parts.append(f"prepare(workers={scenario.prepare.workers}, kill={scenario.prepare.kill})")
    if scenario.ingest is not None:
        i = scenario.ingest
        big = " big" if i.big else ""
        where = f" from {i.location}" if i.location != "local" else ""
        parts.append(f"ingest({i.format}{big} n={i.files} units/{i.unit_files} W{i.workers} kill={i.kill}{where})")
    if scenario.writing is not None:
        w = scenario.writing
        killed = f" kill=r{w.kill_rank}@{w.kill_batch}->{w.rerun}" if w.kill_rank is not None else ""
        parts.append(f"predict(W{w.world_size}K{w.num_workers} {w.random} bad={w.bad}{killed})")
    if scenario.media is not None:
        m = scenario.media
        placed = f" {m.policy}" if m.policy != "error" else ""
        placed += (
            f" range[{m.range_start},{m.range_end})" if m.range_start is not None or m.range_end is not None else ""
        )
        placed += f" every {m.every}s" if m.every is not None else ""
        parts.append(f"media({m.kind} {','.join(m.names)} x{m.per_item}{placed})")
    if scenario.fit is False:
        parts.append("no-fit")
    return " ".join(parts)


_SERVER: list[object] = []
_EXIT = contextlib.ExitStack()


def s3_server() -> object:
    """The soak's one S3 server, started on first use, stopped when the process exits."""
    if not _SERVER:
        _SERVER.append(_EXIT.enter_context(store.serving()))
        atexit.register(_EXIT.close)
    return _SERVER[0]


def run_one(scenario: Scenario, isolate: bool = False) -> tuple[list[str] | None, float]:
    """Run and check ``scenario`` in a fresh temporary folder; return the failures (None: the
    scenario is one Lightning refuses, nothing to check) and the seconds."""
    root = Path(tempfile.mkdtemp(prefix=f"contract{scenario.id}_"))
    started = time.perf_counter()
    try:
        remote_input = scenario.ingest is not None and scenario.ingest.location == "s3"
        s3 = s3_server() if scenario.store is not None or remote_input else None
        failures: list[str] | None = check(run_scenario(scenario, root, isolate=isolate, s3=s3))
    except Inapplicable:
        failures = None
    except Exception as error:  # the checker itself broke: report, do not stop the soak
        failures = [f"checker error: {type(error).__name__}: {error}"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return failures, time.perf_counter() - started


def simpler(scenario: Scenario) -> list[Scenario]:
    """Scenarios one step simpler than ``scenario`` (for shrinking)."""
    out = []
    one = Topology(batch_size=scenario.topology.batch_size)
    if scenario.calls or scenario.resume.calls:
        out.append(replace(scenario, calls=[], resume=replace(scenario.resume, calls=[])))
    if scenario.uses_ddp:
        out.append(
            replace(
                scenario,
                topology=replace(scenario.topology, world_size=1),
                resume=replace(scenario.resume, topology=replace(scenario.resume.topology, world_size=1)),
            )
        )
    if scenario.topology != one or scenario.resume.topology != one:
        out.append(replace(scenario, topology=one, resume=replace(scenario.resume, topology=one)))
    loop, plain = scenario.loop, Loop(epochs=scenario.loop.epochs)
    if loop != plain:
        out.append(replace(scenario, loop=plain))
    resume = scenario.resume
    if resume.after_fit or resume.between or resume.max_steps is not None or resume.max_time is not None:
        out.append(replace(scenario, resume=replace(resume, after_fit=[], between=[], max_steps=None, max_time=None)))
    if resume.session:
        out.append(replace(scenario, resume=replace(resume, session=False, between=[])))
    if scenario.shuffle.kind != "none":
        out.append(replace(scenario, shuffle=replace(scenario.shuffle, kind="none")))
    if any(t.delete_mod or t.fragment_rows for t in scenario.tables):
        plain_tables = [replace(t, delete_mod=0, fragment_rows=None) for t in scenario.tables]
        unkilled = replace(scenario.prepare, kill=None) if scenario.prepare is not None else None  # one unit now
        out.append(replace(scenario, tables=plain_tables, prepare=unkilled))
    if not scenario.cursor_callback:
        out.append(replace(scenario, cursor_callback=True))
    if scenario.resume.maintenance or scenario.hold != "fit":
        out.append(replace(scenario, hold="fit", resume=replace(scenario.resume, maintenance=False)))
    if scenario.replay is not None:
        out.append(replace(scenario, replay=None))
    if scenario.prepare is not None:
        if scenario.prepare.kill is not None:
            out.append(replace(scenario, prepare=replace(scenario.prepare, kill=None)))
        out.append(replace(scenario, prepare=None))
    if scenario.store is not None:
        out.append(replace(scenario, store=None))
    return out


def shrink(scenario: Scenario, failures: list[str], attempts: int = 12) -> tuple[Scenario, list[str]]:
    """The simplest scenario found (within ``attempts`` runs) that still fails, and its failures."""
    for _ in range(attempts):
        for candidate in simpler(scenario):
            found, _ = run_one(candidate)
            found = found or []
            attempts -= 1
            if found:
                scenario, failures = candidate, found
                break
            if attempts <= 0:
                return scenario, failures
        else:
            return scenario, failures
    return scenario, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 1_000_000, help="first scenario id")
    parser.add_argument("--replay", type=Path, help="a file of scenario JSON lines (or FAILED lines) to run")
    parser.add_argument("--out", type=Path, help="append failing scenarios here")
    parser.add_argument("--shrink", action="store_true", help="shrink failing scenarios")
    parser.add_argument("--isolate", action="store_true", help="run every phase in its own process")
    args = parser.parse_args(argv)
    os.environ["XDG_CACHE_HOME"] = cache_home = tempfile.mkdtemp(prefix="contract-xdg-cache-")
    atexit.register(shutil.rmtree, cache_home, True)
    if args.replay:
        lines = [line.removeprefix("FAILED ").strip() for line in args.replay.read_text().splitlines() if line.strip()]
        scenarios = [Scenario.from_json(json.loads(line).get("scenario", json.loads(line))) for line in lines]
    else:
        scenarios = [generate(args.seed + i) for i in range(args.scenarios)]
    failed, skipped, started = 0, 0, time.perf_counter()
    for scenario in scenarios:
        failures, seconds = run_one(scenario, isolate=args.isolate)
        verdict = "SKIP" if failures is None else "FAIL" if failures else "PASS"
        print(f"{verdict} {seconds:5.1f}s {describe(scenario)}", flush=True)
        skipped += failures is None
        if not failures:
            continue
        failed += 1
        if args.shrink:
            scenario, failures = shrink(scenario, failures)
            print(f"  shrunk to: {describe(scenario)}", flush=True)
        for failure in failures[:5]:
            print("  " + failure.replace("\n", "\n  "), flush=True)
        line = json.dumps({"scenario": json.loads(scenario.to_json()), "failures": failures[:5]})
        print(f"FAILED {line}", flush=True)
        if args.out:
            with args.out.open("a") as out:
                out.write(line + "\n")
    total = time.perf_counter() - started
    counts = ", ".join(
        f"{sum(map(has, scenarios))} {name}"
        for name, has in (
            ("on S3", lambda s: s.store is not None),
            (
                "with the cache changed on resume",
                lambda s: s.store is not None and s.store.mode in ("on->off", "off->on"),
            ),
            (
                "with a small cache limit",
                lambda s: s.store is not None and (s.store.cache.small or s.store.resume_cache.small),
            ),
            ("with the replay probe", lambda s: s.replay is not None),
            ("with a second fit of one data module", lambda s: s.resume.session),
            ("with a damaged cached copy", lambda s: s.store is not None and s.store.damage is not None),
            ("on video clips", lambda s: s.clips is not None),
            ("preparing from a remote input", lambda s: s.ingest is not None and s.ingest.location != "local"),
        )
    )
    print(
        f"{len(scenarios)} scenarios ({counts}), {failed} failed, {skipped} refused by Lightning, {total:.0f}s",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
