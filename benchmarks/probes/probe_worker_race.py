"""num_workers=2 against num_workers=0, epoch by epoch of a fresh loader (#51), and where the time goes.

A probe until the harness (``python -m benchmarks``) measures each epoch of a fresh loader: its
cells measure rows/s across epochs after a warm-up, not the first epoch alone.

Each cell is a fresh Python process, as a training script is: it imports Lightning, builds a
`LanceDataModule` (persistent workers, batch 256), calls ``setup`` (which starts the fork server)
and reads ``--epochs`` epochs of its train loader, timing each from ``iter`` to its last batch
(rows/s). Per workload three cells run back to back: ``num_workers=0``; ``num_workers=2`` forced
to the worker path (``LANCE_LIGHTNING_WORKER_CHOICE=workers``: the workers read once up, as before
the race); ``num_workers=2`` as shipped (the measured race, `lance_lightning.load.race`). The
figure of record is, per epoch, race / max(0 workers, worker path) (target >= 0.9), and for the
Python transform that holds the GIL race / 0 workers (target >= 1.5 from the second epoch).

Workloads (10^5 rows of 128 float32 unless said): ``scan``; ``filter`` (``label < 10``: 10%);
``shuffle`` (`RowShuffle`); ``jpeg`` (2x10^4 64x64 JPEGs, row shuffle, `DecodeImage`);
``gil-light``, ``gil`` and ``gil-heavy`` (scan plus a pure-Python per-row loop of 20, 60 or 600
steps: `PythonRows`).

``--where`` also measures where the time of a first epoch with workers goes: interpreter start,
the imports (torch, the package's reader: what the fork server imports, Lightning), the fork
server until it forks (`WorkerStart`), and the first epoch of the worker path waiting for the
workers (``LANCE_LIGHTNING_WORKER_HANDOFF=off``); and the limits a workload meets: Lance's own
``to_table`` on the same columns, a memory copy of the same bytes.

Usage::

    python benchmarks/probes/probe_worker_race.py [--epochs 3] [--reps 1] [--alternating 10] [--busy 2] [--where]   # writes results/worker_race.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
BENCH_DIR = PROBE_DIR.parent  # benchmarks/: the shared harness `common`
REPO_ROOT = BENCH_DIR.parent
for _path in (str(PROBE_DIR), str(BENCH_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

RESULT = BENCH_DIR / "results" / "worker_race.md"
ROWS, IMAGES, BATCH = 100_000, 20_000, 256
#: Rows of the take measured for the row shuffle's limit.
TAKE_ROWS = 20_000
WORKLOADS = ("scan", "filter", "shuffle", "jpeg", "gil-light", "gil", "gil-heavy")
#: Pure-Python loops per row of each GIL-holding workload (`PythonRows`).
GIL_LOOPS = {"gil-light": 20, "gil": 60, "gil-heavy": 600}
#: Read from an S3-compatible server on loopback behind a proxy adding `S3_LATENCY_S` per request.
S3_WORKLOADS = ("scan-s3", "shuffle-s3")
S3_ROWS, S3_LATENCY_S = 20_000, 0.02
CELLS = (("0 workers", 0, "race"), ("worker path", 2, "workers"), ("race", 2, "race"))


class PythonRows:
    """A transform in pure Python that holds the GIL: ``loops`` multiply-adds per row on its id."""

    def __init__(self, loops: int = 60) -> None:
        self.loops = loops

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        out = []
        for value in batch["id"].tolist():
            for _ in range(self.loops):
                value = (value * 31 + 7) % 1_000_003
            out.append(value)
        batch["hashed"] = torch.tensor(out)
        return batch


def _module(workload: str, data: dict[str, str], num_workers: int) -> Any:
    from lance_lightning import LanceDataModule, LanceSource, NoShuffle, RowShuffle
    from lance_lightning.transforms import DecodeImage

    jpeg, s3 = workload == "jpeg", workload.endswith("-s3")
    source = LanceSource(
        data["images"] if jpeg else data["s3"] if s3 else data["vec"],
        columns=["id", "image"] if jpeg else ["id", "vec"],
        filter="label < 10" if workload == "filter" else None,
        storage_options=json.loads(data["s3_options"]) if s3 else None,
    )
    transform = (
        DecodeImage(column="image") if jpeg else PythonRows(GIL_LOOPS[workload]) if workload in GIL_LOOPS else None
    )
    return LanceDataModule(
        train=source,
        batch_size=BATCH,
        shuffle=RowShuffle(seed=0) if workload in ("shuffle", "jpeg", "shuffle-s3") else NoShuffle(),
        num_workers=num_workers,
        persistent_workers=True,
        transform=transform,
    )


def child(workload: str, data: dict[str, str], num_workers: int, epochs: int) -> dict[str, Any]:
    """One cell in this fresh process: each epoch's rows/s, and what the race did."""
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)

    dm = _module(workload, data, num_workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    rates, seconds = [], []
    for _ in range(epochs):
        started = time.perf_counter()
        rows = sum(len(batch["id"]) for batch in loader)
        seconds.append(time.perf_counter() - started)
        rates.append(rows / seconds[-1])
    race = _described(loader.race) if loader.race is not None else ""
    return {"rates": rates, "seconds": sum(seconds), "race": race}


def _described(race: Any) -> str:
    """The race's end-of-fit statement and the GIL share its gate measured."""
    share = race.rates.gil_share()
    return race.describe(done=True) + (f" [GIL share measured: {share:.0%}]" if share is not None else "")


def _run(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path[:0] = {[str(PROBE_DIR), str(BENCH_DIR), str(REPO_ROOT)]!r}\n{code}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO_ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cell failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternating(workload: str, data: dict[str, str], epochs: int) -> dict[str, Any]:
    """In this fresh process, a loader with ``num_workers=0`` and one with ``num_workers=2`` (as
    shipped: the race), epochs read in turn (which goes first alternates): each one's median rows/s.
    The same machine state falls on both, so the ratio shows what ``num_workers=2`` costs once both
    run, apart from the noise between fresh processes."""
    import statistics

    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)

    loaders = {}
    for workers in (0, 2):
        dm = _module(workload, data, workers)
        dm.setup("fit")
        loaders[workers] = dm.train_dataloader()
    rates: dict[int, list[float]] = {0: [], 2: []}
    for epoch in range(epochs):
        for workers in (0, 2) if epoch % 2 else (2, 0):
            started = time.perf_counter()
            rows = sum(len(batch["id"]) for batch in loaders[workers])
            rates[workers].append(rows / (time.perf_counter() - started))
    return {"rates": {w: statistics.median(r) for w, r in rates.items()}, "race": _described(loaders[2].race)}


def cell(workload: str, data: dict[str, str], num_workers: int, choice: str, epochs: int) -> dict[str, Any]:
    code = (
        "import json, probe_worker_race as b\n"
        f"print(json.dumps(b.child({workload!r}, {data!r}, {num_workers}, {epochs})))"
    )
    return _run(code, {"LANCE_LIGHTNING_WORKER_CHOICE": choice})


def _seconds(code: str) -> float:
    """Wall seconds of a fresh ``python -c code`` (interpreter start included)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, capture_output=True)
    return time.perf_counter() - started


def where(data: dict[str, str]) -> dict[str, Any]:
    """Where a first epoch with workers goes, and the limits of each workload (see the docstring)."""
    found: dict[str, Any] = {}
    found["interpreter start (python -c pass)"] = _seconds("pass")
    for name, module in (
        ("import torch", "torch"),
        ("import the reader (the fork server's preload)", "lance_lightning.load.dataset"),
        ("import lightning.pytorch", "lightning.pytorch"),
    ):
        found[name] = _seconds(f"import {module}") - found["interpreter start (python -c pass)"]
    code = (
        "import json, time, lance_lightning.load.dataset\n"
        "from lance_lightning.load.lean_start import worker_context\n"
        "from lance_lightning.load.handoff import WorkerStart\n"
        "t = time.perf_counter(); WorkerStart(worker_context('forkserver', None)).start().wait()\n"
        "print(json.dumps({'s': time.perf_counter() - t}))"
    )
    found["fork server forked from this process: start until it forks"] = _run(code)["s"]
    found["stock fork server: start until it forks"] = _run(code, {"LANCE_LIGHTNING_FORKED_SERVER": "off"})["s"]
    code = f"import json, probe_worker_race as b\nprint(json.dumps(b.child('scan', {data!r}, 2, 1)))"
    waited = _run(code, {"LANCE_LIGHTNING_WORKER_HANDOFF": "off"})["rates"][0]
    found["first scan epoch waiting for 2 workers (s)"] = ROWS / waited
    stock = {"LANCE_LIGHTNING_WORKER_HANDOFF": "off", "LANCE_LIGHTNING_FORKED_SERVER": "off"}
    found["first scan epoch waiting for 2 workers of the stock server (s)"] = ROWS / _run(code, stock)["rates"][0]
    found["limits"] = _run(f"import json, probe_worker_race as b\nprint(json.dumps(b.limits({data!r})))")
    return found


def limits(data: dict[str, str]) -> dict[str, float]:
    """Lance's single-call ``to_table`` rows/s on each workload's columns, its take of random rows
    (the row shuffle's), a memory copy of a scan's bytes (GB/s), and DecodeImage's rows/s on one thread."""
    import lance
    import numpy as np
    import torch

    from lance_lightning.transforms import DecodeImage

    out: dict[str, float] = {}
    ds = lance.dataset(data["vec"])
    for name, kwargs in (("scan", {}), ("filter", {"filter": "label < 10"})):
        started = time.perf_counter()
        table = ds.to_table(columns=["id", "vec"], **kwargs)
        out[f"lance to_table {name} rows/s"] = table.num_rows / (time.perf_counter() - started)
    # The row shuffle's floor: Lance's take of random rows, a batch's worth (sorted) per call.
    order = np.random.default_rng(0).permutation(ROWS)[:TAKE_ROWS]
    started = time.perf_counter()
    for first in range(0, len(order), BATCH):
        ds.take(np.sort(order[first : first + BATCH]).tolist(), columns=["id", "vec"])
    out[f"lance take of random rows ({BATCH} a call) rows/s"] = len(order) / (time.perf_counter() - started)
    block = np.random.default_rng(0).random((ROWS, 128), dtype=np.float32)
    started = time.perf_counter()
    for _ in range(5):
        block.copy()
    out["memory copy GB/s"] = 5 * block.nbytes / (time.perf_counter() - started) / 1e9
    out["scan bytes per row"] = 128 * 4 + 8
    images = lance.dataset(data["images"]).to_table(columns=["image"], limit=2048).column("image").to_pylist()
    decode = DecodeImage(column="image")
    torch.set_num_threads(1)
    started = time.perf_counter()
    for first in range(0, len(images), BATCH):
        decode({"image": images[first : first + BATCH]})
    out["DecodeImage rows/s on 1 thread"] = len(images) / (time.perf_counter() - started)
    return out


def _median_rates(runs: list[dict[str, Any]]) -> list[float]:
    """Each epoch's median rows/s over ``runs`` of one cell."""
    import statistics

    return [statistics.median(rates) for rates in zip(*(run["rates"] for run in runs), strict=True)]


def main() -> None:
    import common

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1, help="runs of each cell, interleaved: the median per epoch")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS + S3_WORKLOADS)
    ap.add_argument("--where", action="store_true", help="also measure where the time goes, and the limits")
    ap.add_argument(
        "--alternating",
        type=int,
        default=0,
        metavar="EPOCHS",
        help="also read EPOCHS epochs of num_workers=0 and 2 in turn in one process per workload (`alternating`)",
    )
    ap.add_argument(
        "--busy", type=int, default=0, help="N busy-loop processes, each in its own session, beside every cell"
    )
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    data = {"vec": common.vec_dataset(args.cache_dir, ROWS), "images": common.image_dataset(args.cache_dir, IMAGES)}
    from benchmarks.harness.contention import BusyLoops

    with contextlib.ExitStack() as stack:
        if set(args.workloads) & set(S3_WORKLOADS):
            data.update(_s3_copy(stack, data["vec"]))
        busy = stack.enter_context(BusyLoops(args.busy))
        _measure(args, data, busy.describe())


def _s3_copy(stack: contextlib.ExitStack, local: str) -> dict[str, str]:
    """The first `S3_ROWS` rows of ``local`` on an S3 server on loopback (moto, the tests' server), read through a proxy
    adding `S3_LATENCY_S` per request: the dataset's URI and storage options (JSON)."""
    import lance

    from tests.fault_proxy import FaultProxy
    from tests.s3_server import S3Server

    s3 = stack.enter_context(S3Server.serving("bench"))
    proxy = stack.enter_context(FaultProxy.serving(s3.endpoint, S3_LATENCY_S))
    uri = "s3://bench/vec.lance"
    lance.write_dataset(lance.dataset(local).to_table(limit=S3_ROWS), uri, storage_options=s3.storage_options())
    return {"s3": uri, "s3_options": json.dumps({**s3.storage_options(), "aws_endpoint": proxy.endpoint})}


def _measure(args: argparse.Namespace, data: dict[str, str], contention: str) -> None:
    import statistics

    import common

    lines = [
        "# num_workers=2 against num_workers=0, epoch by epoch of a fresh loader (#51)",
        "",
        f"`{common.command_line()}` on {common.stamp()}; {common.machine(lightning=True)}; load average "
        f"{common.load_average()} at the start (2 cores shared with other jobs: single runs, noisy).",
        *([contention] if contention else []),
        "",
        f"rows/s per epoch (each cell a fresh process, run {args.reps} time(s) interleaved with the others: the "
        "median; persistent workers; batch 256). ratio = race / max(0 workers, worker path); the GIL-holding "
        "transform's gain = race / 0 workers.",
        "",
        "| workload | epoch | 0 workers | worker path | race | ratio (>= 0.9) | race / 0 workers |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    decisions, totals = [], []
    for workload in args.workloads:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in CELLS}
        for _ in range(args.reps):  # interleaved: a change in the machine's load falls on every cell
            for name, workers, choice in CELLS:
                runs[name].append(cell(workload, data, workers, choice, args.epochs))
        got = {name: {"rates": _median_rates(done), "race": done[-1]["race"]} for name, done in runs.items()}
        for epoch in range(args.epochs):
            zero, path, race = (got[name]["rates"][epoch] for name, _, _ in CELLS)
            lines.append(
                f"| {workload} | {epoch + 1} | {zero:,.0f} | {path:,.0f} | {race:,.0f} | "
                f"{race / max(zero, path):.2f}x | {race / zero:.2f}x |"
            )
            print(lines[-1], flush=True)
        decisions.append(f"- {workload}: {got['race']['race']}")
        zero, path, race = (statistics.median(run["seconds"] for run in runs[name]) for name, _, _ in CELLS)
        totals.append(
            f"| {workload} | {zero:.2f} | {path:.2f} | {race:.2f} | {zero / race:.2f}x | {path / race:.2f}x |"
        )
    lines += ["", "What the race did (its own figures: the training loop's rows/s, whole cycles):", "", *decisions]
    lines += [
        "",
        f"Seconds to read all {args.epochs} epochs from the first `iter` (what a user waits for), and the race's "
        "speed over each other cell's:",
        "",
        "| workload | 0 workers | worker path | race | race vs 0 workers | race vs worker path |",
        "|---|---:|---:|---:|---:|---:|",
        *totals,
    ]
    if args.alternating:
        lines += [
            "",
            f"## num_workers=2 against 0 in one process, {args.alternating} epochs each in turn (median rows/s)",
            "",
            "| workload | 0 workers | 2 workers (race) | ratio |",
            "|---|---:|---:|---:|",
        ]
        for workload in args.workloads:
            code = (
                "import json, probe_worker_race as b\n"
                f"print(json.dumps(b.alternating({workload!r}, {data!r}, {args.alternating})))"
            )
            got = _run(code, {"LANCE_LIGHTNING_WORKER_CHOICE": "race"})
            zero, two = got["rates"]["0"], got["rates"]["2"]
            lines.append(f"| {workload} | {zero:,.0f} | {two:,.0f} | {two / zero:.2f}x |")
            print(lines[-1], flush=True)
    if args.where:
        found = where(data)
        lim = found.pop("limits")
        lines += ["", "## Where the time goes (seconds, one fresh process each)", ""]
        lines += [f"- {name}: {value:.2f}" for name, value in found.items()]
        lines += ["", "## Limits (one run)", ""]
        lines += [f"- {name}: {value:,.2f}" for name, value in lim.items()]
    common.write_result(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
