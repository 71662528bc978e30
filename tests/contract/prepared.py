""" "Prepare, then fit" (issue #40): a scenario's table 0 given as raw Parquet, prepared by the fit.

Guarantees:
- `write_input` writes table 0's rows (`truth.table_data`, without ``id``: prepare adds it, as
  each row's position in the input, so ids equal the direct write's: the generator draws this only
  for a table 0 without deleted rows, whose ids start at 0) as one Parquet file per fragment the
  direct write would have; `spec` prepares it with ``unit_files=1`` (one unit, one commit, one
  fragment per file), so the prepared dataset has the direct write's rows, order and fragments.
- Every source of table 0 (train, val, test, predict; a mixture's) carries the spec
  (`tests.contract.phase_config.data_arguments`), so ``LanceDataModule.prepare_data`` prepares it in the
  scenario's first fit (the stopped run: in this process, a ``lance-lightning fit`` subprocess or
  under DDP, which the runner runs before the reference run) and finds it complete in every later
  one. A script that calls the data module before ``fit`` calls ``prepare_data`` first, as a user
  must.
- `kill` runs, before the first fit, a prepare of the same spec SIGKILLed at a drawn moment
  (`Prepared.kill`, by tests/prepare_kill.py, which tests/scenarios/test_prepare_cli.py uses too: the
  writer reads no variable to kill itself); the first fit's ``prepare_data`` then resumes it.
- `check` (part of `tests.contract.oracle.check`) says what went wrong: the kill did not leave the
  output incomplete; the first fit's prepare did not report prepared / resumed (or complete, after
  a kill past the completion commit); the dataset is not complete or a ``.partial`` is left; its
  rows, schema's columns or fragments differ from a direct write of the same table (ids stable);
  a later prepare (the reference run's, the resume's, a second fit's) reported anything but
  "already complete" or committed a version.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.contract import truth

if TYPE_CHECKING:
    from tests.contract.runner import Run
    from tests.contract.scenario import Scenario

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The prepared table.
TABLE = 0

#: A prepare that SIGKILLs itself at `Prepared.kill` (tests/prepare_kill.py).
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"


def input_folder(root: str | Path) -> Path:
    return Path(root) / f"raw{TABLE}"


def spec(scenario: Scenario, root: str | Path) -> dict[str, Any]:
    """The ``prepare`` spec every source of table 0 carries (as a YAML ``prepare:`` holds it)."""
    assert scenario.prepare is not None
    return {"format": "parquet", "input": str(input_folder(root)), "unit_files": 1, "workers": scenario.prepare.workers}


def write_input(scenario: Scenario, root: Path) -> Path:
    """Table 0's rows as Parquet files, one per fragment of a direct write (once: kept if there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = input_folder(root)
    if folder.exists():
        return folder
    table = scenario.tables[TABLE]
    data = pa.table({k: v for k, v in truth.table_data(table).items() if k != "id"})
    step = table.fragment_rows or table.rows
    staging = Path(tempfile.mkdtemp(dir=root))
    for index, start in enumerate(range(0, table.rows, step)):
        pq.write_table(data.slice(start, step), staging / f"part-{index:05d}.parquet")
    staging.rename(folder)
    return folder


def kill(scenario: Scenario, root: Path, uri: str) -> dict[str, Any]:
    """A prepare SIGKILLed at the scenario's moment; what it left (see `check`)."""
    assert scenario.prepare is not None and scenario.prepare.kill is not None
    from tests.contract.runner import _env

    command = [sys.executable, str(KILLER), scenario.prepare.kill, "spec", json.dumps(spec(scenario, root)), uri]
    done = subprocess.run(command, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    return {"returncode": done.returncode, "output": done.stderr[-2000:], "exists": Path(uri).exists()}


def state(uri: str) -> dict[str, Any] | None:
    """The dataset's version, completion record and fragments' rows (None: there is none)."""
    import lance

    from lance_lightning.write.ledger import DONE_KEY

    if not Path(uri).exists():
        return None
    dataset = lance.dataset(uri)
    return {
        "version": dataset.version,
        "complete": DONE_KEY in dataset.config(),
        "partial": Path(f"{uri.rstrip('/')}.partial").exists(),
        "fragments": [f.count_rows() for f in dataset.get_fragments()],
    }


def lines(run: Run, role: str) -> list[str]:
    """What each ``prepare_data`` of the phase's rank 0 reported for table 0, in order."""
    phase = run.phases.get(role)
    if phase is None:
        return []
    uri = run.prepare["uri"]
    return [event["lines"].get(uri, "(no line)") for event in phase.events("prepared", rank=0)]


def check(run: Run) -> list[str]:
    """What the prepare of a "prepare, then fit" scenario got wrong (empty: nothing; see the module)."""
    scenario = run.scenario
    if scenario.prepare is None:
        return []
    import lance

    problems: list[str] = []
    record, uri = run.prepare, run.prepare["uri"]
    killed = record.get("killed")
    if killed is not None:
        if killed["returncode"] != -signal.SIGKILL:
            problems.append(f"prepare: the prepare to kill at {scenario.prepare.kill} exited {killed['returncode']}")
            problems.append(killed["output"])
        if killed["exists"]:
            problems.append(f"prepare: killed at {scenario.prepare.kill}, the output already looked complete")
    first = lines(run, "stop")
    if first:
        want = ("already complete",) if scenario.prepare.kill == "rename" else (" prepared from ", " resumed ")
        if scenario.prepare.kill and scenario.prepare.kill.startswith("commit:"):
            want = (" resumed ",)
        if not any(w in first[0] for w in want):
            problems.append(f"prepare: the first fit's prepare_data said {first[0]!r}, expected one of {want}")
    later = first[1:] + lines(run, "reference") + lines(run, "resume")
    for line in later:
        if "already complete" not in line or "nothing to do" not in line:
            problems.append(f"prepare: a second prepare did something: {line!r}")
    end = state(uri)
    if end is None and run.expected_errors.get("stop") is not None:
        return problems  # refused as the scenario must be, before prepare_data (a config error at parse)
    if end is None:
        return [*problems, f"prepare: no dataset at {uri} after the runs"]
    if not end["complete"] or end["partial"]:
        problems.append(f"prepare: after the runs, complete={end['complete']}, .partial left={end['partial']}")
    after, before_resume = record.get("after_stop"), record.get("before_resume")
    if after is not None and "reference" in run.phases and record.get("after_reference") != after:
        problems.append(
            f"prepare: the reference run's prepare changed the dataset: {after} -> {record['after_reference']}"
        )
    if before_resume is not None and end["version"] != before_resume["version"]:
        problems.append(f"prepare: the resumed run committed: version {before_resume['version']} -> {end['version']}")
    # -- the prepared dataset equals a direct write of the same rows, ids stable --
    direct_uri = str(Path(record["root"]) / "direct" / f"table{TABLE}.lance")
    if not Path(direct_uri).exists():
        truth.write_table(scenario.tables[TABLE], direct_uri)
    direct = lance.dataset(direct_uri)
    got, want_table = lance.dataset(uri).to_table(), direct.to_table()
    if got.column_names != want_table.column_names:
        problems.append(f"prepare: columns {got.column_names}, a direct write has {want_table.column_names}")
    elif not got.cast(want_table.schema).equals(want_table):
        ids = got["id"].to_pylist()
        problems.append(f"prepare: rows differ from a direct write (ids {ids[:12]}..., {len(ids)} rows)")
    fragments = [f.count_rows() for f in direct.get_fragments()]
    if after is not None and after["fragments"] != fragments:
        problems.append(f"prepare: fragments of {after['fragments']} rows, a direct write has {fragments}")
    return problems


def record_lines(dm: Any, out: Any) -> None:
    """Record what the data module's last ``prepare_data`` reported (only the rank that ran it has lines)."""
    if getattr(dm, "prepared", None):
        out.write({"t": "prepared", "lines": dict(dm.prepared)})
