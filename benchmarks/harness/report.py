"""A run's result file: one table of every cell (medians over repetitions), a suite's verdict, and
the raw results beside it as JSON.

Guarantees:
- `render` shows each cell by its name, so a figure leads back to the command that reruns it
  (``uv run python -m benchmarks run <cell>``); rows/s is the median over repetitions and "vs best
  peer" the median of per-repetition ratios to the fastest peer of the same workload, size,
  workers and storage; a cell that did not run says so with its error, never a blank figure.
- The header says when, the exact command, the machine and versions, and the load.
"""

from __future__ import annotations

import json
import math
import statistics
from functools import partial
from pathlib import Path

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.registry import LOADERS, PEERS, SUITES, WORKLOADS, Cell

HEADS = (
    "cell | workload | loader | rows/s | vs best peer | first batch s | again s | build s | shuffle quality "
    "| CPU ms / 1k rows | MiB read / 1k rows | reads / 1k rows | RSS MiB | epochs | first epoch"
)
SPECS = "< < < >,.0f > >.3f >.3f >.3f >.2f >,.0f >.2f >.1f >,.0f > <"
RESUME_HEADS = " | resume 10% s | resume 90% s | 90%/10% | RSS over unfiltered NoShuffle MiB"
RESUME_SPECS = " >.4f >.4f >.2f >.0f"


def _ok(results: dict, cell: Cell) -> list[dict]:
    return [r for r in results.get(cell.name, []) if "error" not in r]


def _median(values: list) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else float("nan")


def _best_peer(results: dict, cell: Cell, cells: list[Cell]) -> Cell | None:
    peers = [c for c in cells if c.loader in PEERS and (c.workload, c.size, c.workers, c.storage) == _key(cell)]
    speeds = {c: _med(results, c, "rows_per_s") for c in peers}
    speeds = {c: s for c, s in speeds.items() if not math.isnan(s)}
    return max(speeds, key=speeds.get) if speeds else None


def _key(cell: Cell) -> tuple:
    return (cell.workload, cell.size, cell.workers, cell.storage)


def ratio_to_best_peer(results: dict, cell: Cell, cells: list[Cell]) -> float:
    best = _best_peer(results, cell, cells)
    if best is None:
        return float("nan")
    pairs = [
        a["rows_per_s"] / b["rows_per_s"]
        for a, b in zip(results.get(cell.name, []), results.get(best.name, []))
        if a.get("rows_per_s") and b.get("rows_per_s")
    ]
    return _median(pairs)


def _med(results: dict, cell: Cell, key: str) -> float:
    return _median([r.get(key) for r in _ok(results, cell)])


def _per_1k_rows(got: list[dict], key: str, scale: float = 1.0) -> float:
    """The median over repetitions of ``key`` (times ``scale``) per 1,000 rows read in the window."""
    return _median([r[key] * scale * 1000 / r["rows"] for r in got if r.get(key) is not None and r.get("rows")])


def _over_scan(results: dict, cell: Cell) -> float:
    """The cell's RSS minus that of the unfiltered storage-order read of the same table (ours)."""
    base = Cell(
        f"{cell.workload.split('-')[0]}-scan" if cell.workload.startswith("x-") else "scan", "ours", *_key(cell)[1:]
    )
    return _med(results, cell, "rss_mb") - _med(results, base, "rss_mb")


def table(results: dict, cells: list[Cell]) -> tuple[list[str], list[str]]:
    resumes = any("resume10_s" in r for rs in results.values() for r in rs)
    heads, specs = (HEADS + RESUME_HEADS, SPECS + RESUME_SPECS) if resumes else (HEADS, SPECS)
    rows, failures = [], []
    for c in cells:
        got = _ok(results, c)
        wl, lo = WORKLOADS[c.workload].label, LOADERS[c.loader].label
        if not got:
            errors = {r.get("error", "?") for r in results.get(c.name, [])}
            failures.append(f"`{c.name}`: {'; '.join(errors) or 'not run'}")
            rows.append([f"`{c.name}`", wl, lo, "did not run", *[""] * (len(specs.split()) - 4)])
            continue
        per_1k = got[0]["rows"] / 1000 or None  # a cell that read no rows has no per-row figures
        med = partial(_med, results, c)
        x = tables.cell(ratio_to_best_peer(results, c, cells), ".2f", "")
        row = [
            f"`{c.name}`",
            wl,
            lo,
            med("rows_per_s"),
            x + (" (best peer)" if _best_peer(results, c, cells) == c else ""),
        ]
        row += [med(key) for key in ("first_batch_s", "again_s", "build_s", "quality")]
        per_row = partial(_per_1k_rows, got)
        reads = [per_row("cpu_s", 1000), per_row("read_bytes", 2**-20), per_row("read_calls")] if per_1k else [""] * 3
        row += [*reads, med("rss_mb"), got[0]["epochs"], got[0]["check"] if per_1k else "—"]
        if resumes:
            r10, r90 = med("resume10_s"), med("resume90_s")
            row += [r10, r90, r90 / r10, _over_scan(results, c)]
        rows.append(row)
    return tables.table(heads, specs, rows, missing=""), failures


def verdicts(suite: str | None, results: dict, cells: list[Cell]) -> list[str]:
    if suite is None or not SUITES[suite].verdict:
        return []
    out = [f"## Target: {SUITES[suite].target}", ""]
    if SUITES[suite].verdict == "best-peer":
        for c in cells:
            if c.loader.startswith("ours") and c.workers == "2":
                x = ratio_to_best_peer(results, c, cells)
                out.append(f"- `{c.name}`: {x:.2f}x the best peer: **{'pass' if x >= 1.2 else 'miss'}**")
    if SUITES[suite].verdict == "scale":
        out += _scale_verdicts(results, cells)
    if SUITES[suite].verdict == "worker-start":
        for c in cells:
            if c.workers == "2":
                zero = Cell(c.workload, c.loader, c.size, "0", c.storage)
                extra = _med(results, c, "first_batch_s") - _med(results, zero, "first_batch_s")
                mark = f"**{'pass' if extra <= 2.0 else 'FAIL'}**" if c.loader == "ours" else "(info)"
                out.append(f"- `{c.name}`: first batch {extra:.3f} s later than with 0 workers {mark}")
    return [*out, ""]


def render(raw: dict) -> str:
    results, cells = raw["results"], [Cell(*c) for c in raw["cells"]]
    suite = raw.get("suite")
    lines, failures = table(results, cells)
    versions: dict[str, str] = {}
    for rs in results.values():
        for r in rs:
            versions.update(r.get("versions", {}))
    loads = [r["load"] for rs in results.values() for r in rs if "load" in r] or [float("nan")]
    about = SUITES[suite].about if suite else "the cells its selectors name"
    text = [
        f"# {suite or raw['selector']}: {about}",
        "",
        f"Run {raw['stamp']}, {raw['seconds']:.0f} s, by the benchmark harness (`benchmarks/harness/`).",
        "",
        f"Command: `{raw['command']}`",
        "",
        f"Machine: {raw['machine']}. Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".",
        "",
        f"Load average at the end (1, 5, 15 min): {raw['load_average']}; 1-minute load after each cell "
        f"{min(loads):.2f}-{max(loads):.2f}.",
        "",
        *([raw["contention"], ""] if raw.get("contention") else []),
        f"Cells are `workload/loader/size/workers/storage`; each ran in a fresh process, {raw['reps']} "
        f"repetition(s), {raw['seconds_per_cell']:g} s of timed reading after 2 warm-up batches, batch 256. "
        "rows/s, first batch (`iter(loader)` to its first batch), again (a second loader in the same "
        "process), build (the loader made: our setup) and memory are medians; vs best peer: median of the "
        "per-repetition ratios to the fastest peer of the same workload, size and workers. Shuffle quality: "
        "the first epoch's mean per-batch entropy of `id * 100 // rows` over a perfect shuffle's (1.00 "
        "perfect, about 0.15 storage order). Reads: the process tree's read system calls and their bytes "
        "(`/proc/<pid>/io`) over the run, per 1,000 rows timed; CPU: the tree's user and system CPU time over "
        "the timed window, per 1,000 rows. First epoch: every expected row exactly once.",
        "",
        *lines,
        "",
        *verdicts(suite, results, cells),
        "## Could not run",
        "",
        *([f"- {f}" for f in failures] or ["- Every cell ran."]),
    ]
    return "\n".join(text) + "\n"


def write(raw: dict, out: Path) -> Path:
    common.write_result(out, render(raw))
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return out


def _scale_verdicts(results: dict, cells: list[Cell]) -> list[str]:
    """Each target of the scale suite at each size, for ours."""
    out = []
    for size in dict.fromkeys(c.size for c in cells):
        ours = [c for c in cells if c.size == size and c.loader == "ours" and _ok(results, c)]
        plain = [c for c in ours if not c.workload.endswith("-f10")]
        shuffle = [c for c in ours if c.workload == "x-shuffle"]
        checks = [
            (
                "setup + first batch, no filter, slowest order (s)",
                [_med(results, c, "build_s") + _med(results, c, "first_batch_s") for c in plain],
                1.0,
            ),
            ("RowShuffle memory over NoShuffle (MiB)", [_over_scan(results, c) for c in shuffle], 64),
            (
                "resume 90% / 10%, highest",
                [_med(results, c, "resume90_s") / _med(results, c, "resume10_s") for c in ours],
                1.2,
            ),
            (
                "memory over NoShuffle with the filter, highest (MiB)",
                [_over_scan(results, c) for c in ours if c not in plain],
                256,
            ),
        ]
        for name, values, bound in checks:
            values = [v for v in values if not math.isnan(v)]
            if values:
                verdict = "PASS" if max(values) <= bound else "FAIL"
                out.append(f"- {size} rows, {name}: {max(values):.2f} (<= {bound}): **{verdict}**")
    return out
