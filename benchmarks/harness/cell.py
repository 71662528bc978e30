"""One cell measured in this (fresh) process: ``python -m benchmarks.harness.cell SPEC_JSON``.

Guarantees:
- Prints one JSON object on its last line of stdout: ``build_s`` (the loader built, its
  modules already imported: our data module's setup; a peer's dataset opened), ``first_batch_s`` (``iter(loader)`` to its first batch),
  ``again_s`` (asked for: the same for a second loader built in this process, a fork server
  already up),
  ``rows_per_s`` (whole batches, across epochs, for ``seconds`` after `WARM_BATCHES` warm-up
  batches; none when ``seconds`` is 0), ``entropy`` and ``check`` (the first epoch's shuffle
  quality, and whether it delivered every expected row exactly once), ``read_bytes`` and
  ``read_calls`` (the process tree's bytes read through system calls and their count over the
  timed window, workers included while they live: Linux ``/proc/<pid>/io`` ``rchar`` and
  ``syscr``), ``cpu_s`` (the process tree's user and system CPU seconds over the timed window,
  workers included while they live: how much of the machine the rows cost, a figure that CPU
  contention from other programs changes far less than rows/s), ``rss_mb`` (the
  tree's resident memory at the end of the timed window) and ``peak_rss_mb`` (this process's); for
  ours, when asked, ``resume10_s`` and ``resume90_s`` (the first batch after a resume at that
  share of the epoch, the median of ``resume`` alternated resumes).
- Imports nothing but the standard library at module level; when the loader is ours, the main
  module imports Lightning first, as a training script does (so a worker that imports the main
  module again pays for it, as users' workers do).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any

from benchmarks.harness.data import BATCH, CLASSES, entropy_bits
from benchmarks.harness.registry import WORKLOADS, workers_value

WARM_BATCHES = 2

if __name__ == "__main__" and json.loads(sys.argv[1])["loader"].startswith("ours"):
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)


def _tree() -> tuple[int, int, float, float]:
    """Bytes read, read calls, resident MB and CPU seconds (user and system) of this process and
    its children (as psutil sees them)."""
    import psutil

    me = psutil.Process()
    read_bytes = calls = 0
    rss = cpu = 0.0
    for process in (me, *me.children(recursive=True)):
        try:
            io, mem, times = process.io_counters(), process.memory_info(), process.cpu_times()
        except (psutil.Error, AttributeError):  # a worker that just ended; io_counters is Linux's
            continue
        read_bytes += getattr(io, "read_chars", io.read_bytes)
        calls += io.read_count
        rss += mem.rss / 2**20
        cpu += times.user + times.system
    return read_bytes, calls, rss, cpu


def _first(build: Any) -> tuple[Any, Any, float, float]:
    built = time.perf_counter()
    loader = build()
    started = time.perf_counter()
    batches = iter(loader)
    first = next(batches)
    return loader, (batches, first), started - built, time.perf_counter() - started


def measure(spec: dict) -> dict:
    import numpy as np

    from benchmarks.harness.loaders import build, import_modules

    workload = WORKLOADS[spec["workload"]]
    workers = workers_value(spec["workers"])
    data = spec["data"]
    import_modules(spec["loader"])  # outside the clock, as a training script's imports are
    io0 = None
    loader, (batches, first), build_s, first_batch_s = _first(lambda: build(spec["loader"], workload, workers, data))
    key = workload.columns[0]  # the row key: id, or x of the scale table
    first_epoch = [np.asarray(first[key], dtype=np.int64)]
    state = dict(loader.state_dict()) if spec.get("resume") and spec["loader"].startswith("ours") else None
    rows, epochs, started = 0, 0, None
    seconds = float(spec["seconds"])
    while seconds > 0:
        for i, batch in enumerate(batches, 1):
            if epochs == 0:
                first_epoch.append(np.asarray(batch[key], dtype=np.int64))
            if started is None:
                if epochs == 0 and i + 1 < WARM_BATCHES:
                    continue
                io0, started = _tree(), time.perf_counter()
                continue
            rows += len(batch[key])
            if time.perf_counter() - started >= seconds:
                break
        else:
            epochs += 1
            batches = iter(loader)
            continue
        break
    elapsed = time.perf_counter() - started if started else float("nan")
    io1 = _tree()
    io0 = io0 or io1
    out: dict[str, Any] = {
        "build_s": build_s,
        "first_batch_s": first_batch_s,
        "rows_per_s": rows / elapsed if rows else None,
        "rows": rows,
        "seconds": elapsed,
        "epochs": epochs,
        "read_bytes": io1[0] - io0[0],
        "read_calls": io1[1] - io0[1],
        "cpu_s": io1[3] - io0[3],
        "rss_mb": io1[2],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    out.update(_quality(first_epoch, epochs >= 1, data, workers))
    del batches
    if state is not None:
        out |= _resumes(loader, state, data["expected"], int(spec["resume"]))
    if spec.get("again"):
        out["again_s"] = _first(lambda: build(spec["loader"], workload, workers, data))[3]
    out["versions"] = versions(spec["loader"])
    return out


def _resumes(loader: Any, state: dict, rows: int, reps: int) -> dict:
    """The first batch after resuming at 10% and at 90% of the epoch: the median of ``reps`` each,
    alternated (a resume takes a few ms: a median of 5 moved by a quarter between runs)."""
    times: dict[float, list[float]] = {0.1: [], 0.9: []}
    for _ in range(reps):
        for share in times:
            steps = min(int(rows * share) // BATCH, len(loader) - 1)  # a tiny table: its last batch
            loader.load_state_dict({**state, "rows_consumed": steps * BATCH, "steps": steps, "finished": False})
            started = time.perf_counter()
            next(iter(loader))
            times[share].append(time.perf_counter() - started)
    return {f"resume{int(share * 100)}_s": statistics.median(spent) for share, spent in times.items()}


def _quality(first_epoch: list, complete: bool, data: dict, workers: int) -> dict:
    import numpy as np

    seen = np.concatenate(first_epoch)
    check = "first epoch not finished in the time"
    if complete:
        unique, dropped = len(np.unique(seen)), data["expected"] - len(seen)  # drop_last: a partial batch a worker
        if unique == len(seen) and 0 <= dropped < BATCH * max(1, workers):
            check = "ok" if dropped == 0 else f"ok ({dropped} rows of a last partial batch dropped)"
        else:
            check = f"{len(seen):,} rows, {unique:,} distinct, {data['expected']:,} expected"
    full = [b for b in first_epoch if len(b) == BATCH]
    score = statistics.fmean(entropy_bits(b * CLASSES // data["table_rows"]) for b in full) if full else float("nan")
    return {"entropy": score, "quality": score / data["perfect"], "full_batches": len(full), "check": check}


def versions(loader: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from benchmarks.harness.registry import LOADERS

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "pylance", LOADERS[loader].dist):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "(not installed)"
    return out


if __name__ == "__main__":
    result = measure(json.loads(sys.argv[1]))
    sys.stdout.flush()
    print(json.dumps(result))
    os._exit(0)  # a peer's worker pool that does not stop must not hold the cell's result back
