"""Planning once per node (issue #39): N processes planning the same filtered split against one.

A 10^7-row table (``id`` int64, ``label`` int32 uniform in 0..99, written once under the cache folder),
filter ``label < 10`` (10%). Each process is a fresh Python process that has imported Lightning
and the package (as a training script has), waits at a start gate, then does what a rank does:
``LanceDataModule(train=LanceSource(uri, columns=["id", "label"], filter=...), batch_size=256,
shuffle=RowShuffle(seed=0)).setup("fit")``, then the train loader's first batch. Measured per
process from the gate: planning (``setup``) CPU time (``getrusage``: all threads, and children)
and bytes read (``rchar`` of ``/proc/self/io``: every read system call, so the dataset's files
and the survey cache entry alike), and the time to the first batch.

(a) one process, (b) ``processes`` (8) started together, in two modes: the survey cache off
(``LANCE_LIGHTNING_SURVEY_CACHE=off``: every process scans, the behaviour before it) and on (an
empty cache directory per run: the first process computes, the others wait and load; pinning
plans the filter's scan without reading). Ratios are (b) over (a)
of the same mode (totals for bytes and CPU, the slowest process for the first batch): medians over
``reps`` repetitions, each mode first in turn. Target (issue #39): every ratio at most 1.5. On a
2-core machine the 8 processes share 2 cores: their times add up.

A process is ``python -m benchmarks.studies.planning URI MODE`` (`one`).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.study import ROOT, Params

FILTER = "label < 10"
TARGET = 1.5
#: Survey cache modes.
MODES = ("off", "on")


def _read_bytes() -> int:
    """Bytes this process has read through system calls (``rchar``): the dataset's files, the
    survey cache entry, anything else."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar"))


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _one(uri: str, mode: str) -> None:
    """One process: imports, then the gate (a line on stdin), then setup and the first batch; prints JSON."""
    import lightning.pytorch  # noqa: F401  (a training script has imported it)

    from lance_lightning import LanceDataModule, LanceSource, RowShuffle
    from lance_lightning.plan import survey_cache

    source = LanceSource(uri, columns=["id", "label"], filter=FILTER)
    print("ready", flush=True)
    sys.stdin.readline()
    started, cpu, read = time.perf_counter(), _cpu_s(), _read_bytes()
    datamodule = LanceDataModule(train=source, batch_size=256, shuffle=RowShuffle(seed=0))
    datamodule.setup("fit")
    setup_s, planning_cpu, planning_bytes = time.perf_counter() - started, _cpu_s() - cpu, _read_bytes() - read
    plan = datamodule.plans["train"]
    next(iter(datamodule.train_dataloader()))
    first_s = time.perf_counter() - started
    outcome = next(iter(survey_cache.OUTCOMES))
    print(
        json.dumps(
            {
                "setup_s": setup_s,
                "first_batch_s": first_s,
                "planning_cpu_s": planning_cpu,
                "planning_bytes": planning_bytes,
                "outcome": outcome,
                "matched": plan.matched_rows,
            }
        )
    )


def _together(uri: str, processes: int, mode: str, env: dict[str, str]) -> list[dict]:
    """``processes`` fresh processes released at once (each waits on its stdin after its imports)."""
    cache = tempfile.mkdtemp(prefix="bench_planning_surveys_")  # empty: the first process computes
    env = {
        **env,
        "LANCE_LIGHTNING_SURVEY_CACHE": "off" if mode == "off" else "on",
        "LANCE_LIGHTNING_SURVEY_CACHE_DIR": cache,
    }
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.studies.planning", uri, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(processes)
    ]
    for child in children:
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a process failed before the gate (exit {child.wait()}): {line!r}")
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    results = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"a process exited {child.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _write_table(path: Path, rows: int) -> str:
    import lance
    import numpy as np
    import pyarrow as pa

    if common.table_ready(path, rows, None):
        return str(path)
    labels = np.random.default_rng(0).integers(0, 100, rows, dtype=np.int32)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "label": labels})
    lance.write_dataset(table, str(path), mode="overwrite")
    return str(path)


def _summary(runs: list[list[dict]]) -> dict[str, float]:
    """Medians over repetitions of the totals (bytes, CPU) and the slowest first batch."""
    return {
        "bytes": statistics.median(sum(r["planning_bytes"] for r in run) for run in runs),
        "cpu": statistics.median(sum(r["planning_cpu_s"] for r in run) for run in runs),
        "first": statistics.median(max(r["first_batch_s"] for r in run) for run in runs),
        "setup": statistics.median(max(r["setup_s"] for r in run) for run in runs),
        "computed": statistics.median(sum(r["outcome"] in ("computed", "off") for r in run) for run in runs),
    }


def measure(p: Params) -> str:
    rows = int(p.rows)
    uri = _write_table(p.cache / f"planning_{rows}.lance", rows)
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    env = {**os.environ, "PYTHONPATH": path}
    loads = [common.load_average(" ")]
    runs: dict[tuple[str, int], list[list[dict]]] = {(m, n): [] for m in MODES for n in (1, p.processes)}
    for rep in range(p.reps):
        for mode in MODES[rep % len(MODES) :] + MODES[: rep % len(MODES)]:  # each mode first in turn
            for count in (1, p.processes):
                runs[(mode, count)].append(_together(uri, count, mode, env))
                print(f"rep {rep + 1} cache {mode} x{count}: {runs[(mode, count)][-1]}", flush=True)
        loads.append(common.load_average(" "))
    return _report(p, rows, runs, loads)


def _report(p: Params, rows: int, runs: dict, loads: list[str]) -> str:
    n = p.processes
    lines = [
        f"- the {n} processes share the machine's {os.cpu_count()} cores, so their times add up (each gets",
        f"  about {min(1, (os.cpu_count() or 1) / n):.2g} of a core); the machine is shared: load average (1, 5, 15 min)",
        f"  before and after each repetition: {' | '.join(loads)}",
        f"- data: {rows:,} rows (`id` int64, `label` int32 uniform in 0..99), filter `{FILTER}` (10%),",
        "  `RowShuffle(seed=0)`, batch_size 256, 0 workers; each process a fresh interpreter that has",
        "  imported Lightning, released with the others at a gate; medians of "
        f"{p.reps} repetition(s), each mode first in turn",
        "- planning bytes: the process's read system calls during `setup` (`rchar`: the dataset's files",
        "  and the survey cache entry); planning CPU: `getrusage` of the process and its children over",
        "  `setup`; first batch: from the gate",
        "- modes: `off` (`LANCE_LIGHTNING_SURVEY_CACHE=off`: every process scans, as before the cache);",
        "  `on` (an empty cache directory: one process scans, the others wait and load its entry;",
        "  pinning plans the filter's scan, `explain_plan`, without reading)",
        "",
    ]
    summary = {key: _summary(value) for key, value in runs.items()}
    heads = "survey cache | processes | surveys computed | planning MB (total) | planning CPU s (total) "
    heads += "| setup s (slowest) | first batch s (slowest)"
    body = []
    for mode in MODES:
        for count in (1, n):
            s = summary[(mode, count)]
            body.append((mode, count, s["computed"], s["bytes"] / 1e6, s["cpu"], s["setup"], s["first"]))
    lines += tables.table(heads, "< > >.0f >.2f >.2f >.2f >.2f", body)
    lines += ["", f"Ratios ({n} processes over 1, same mode; target: at most {TARGET:g}):", ""]
    ratio_rows = []
    for mode in MODES:
        one, many = summary[(mode, 1)], summary[(mode, n)]
        ratios = [many[key] / max(one[key], 1e-9) for key in ("bytes", "cpu", "first")]
        verdict = ("PASS" if max(ratios) <= TARGET else "FAIL") if mode != "off" else "(before)"
        ratio_rows.append((mode, *ratios, verdict))
    heads = "survey cache | planning bytes | planning CPU | first batch (slowest) | result"
    lines += tables.table(heads, "< >.2f >.2f >.2f ^", ratio_rows)
    lines += ["", "Per process, every repetition (setup s, first batch s, planning CPU s, planning MB, outcome):", ""]
    for (mode, count), value in runs.items():
        for rep, run in enumerate(value, 1):
            cells = ", ".join(
                f"{r['setup_s']:.2f}/{r['first_batch_s']:.2f}/{r['planning_cpu_s']:.2f}/"
                f"{r['planning_bytes'] / 1e6:.2f}/{r['outcome']}"
                for r in run
            )
            lines.append(f"- {mode}, {count} process(es), repetition {rep}: {cells}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # one process of a run
    _one(sys.argv[1], sys.argv[2])
