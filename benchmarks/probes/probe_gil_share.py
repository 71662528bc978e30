"""The race's GIL share, as shipped (CPU seconds) and as it was (each call's wall time) (#51).

The race (`lance_lightning.load.race`) starts workers only where the transform's share of the
work the GIL serializes could make the read `START_GAIN` times faster. Each cell
is a fresh process, as a training script is: it reads the train loader of a 10^5-row scan (128
float32 a row, batch 256, ``num_workers=2``, the race as shipped) under a training step (a linear
layer's forward, backward and SGD step on the batch: the Python a Lightning step runs, holding the
GIL between torch ops), and stops at the race's first gate check, once its window is measured.
It records the share two ways over the same calls: as shipped (`Rates.gil_share`: the transform's
CPU seconds a call over those plus the loop thread's CPU seconds a batch) and as it was before
(each call's wall seconds over the loop's wall seconds a batch, at most 1: the wait to take the
GIL back after a torch op released it counted as the transform's).

Transforms: ``tensor`` adds one tensor a batch (``torch.full``, as the tests' `RecordProcess`);
``gil-light``, ``gil`` and ``gil-heavy`` are the pure-Python loops of 20, 60 and 600 steps a row
(`probe_worker_race.PythonRows`).

Usage::

    python benchmarks/probes/probe_gil_share.py [--reps 5] [--busy 2] [--out FILE]   # writes results/gil_share.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
BENCH_DIR = PROBE_DIR.parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(PROBE_DIR), str(BENCH_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

RESULT = BENCH_DIR / "results" / "gil_share.md"
TRANSFORMS = ("tensor", "gil-light", "gil", "gil-heavy")


class OneTensor:
    """Adds ``pid`` (one ``torch.full`` a batch): a transform that takes a sliver of the loop."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch


def child(name: str, data: str) -> dict[str, Any]:
    """One cell in this fresh process: both shares at the race's first gate check, and its verdict."""
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)
    import torch
    from probe_worker_race import GIL_LOOPS, PythonRows

    from lance_lightning import LanceDataModule, LanceSource
    from lance_lightning.load import handoff, race

    wall = {"seconds": 0.0, "calls": 0}

    class BothTimed(handoff.GilTimed):
        def __call__(self, batch: Any) -> Any:
            started = time.perf_counter()
            try:
                return super().__call__(batch)
            finally:
                wall["seconds"] += time.perf_counter() - started
                wall["calls"] += 1

    handoff.GilTimed = BothTimed  # type: ignore[misc]
    found: dict[str, Any] = {}
    gate = race.Race.may_start_workers

    def checked(self: Any) -> bool:
        opens = gate(self)
        rates = self.rates
        if rates.in_process is not None and not found:
            per_batch = rates.window[2] / rates.window[0]
            found.update(
                cpu=rates.gil_share(),
                wall=min(1.0, wall["seconds"] / max(wall["calls"], 1) / per_batch),
                opens=opens,
                loop_ms=1000 * per_batch,
            )
        return opens

    race.Race.may_start_workers = checked  # type: ignore[method-assign]
    transform = OneTensor() if name == "tensor" else PythonRows(GIL_LOOPS[name])
    dm = LanceDataModule(
        train=LanceSource(data, columns=["id", "vec"]), batch_size=256, num_workers=2, transform=transform
    )
    dm.setup("fit")
    model = torch.nn.Linear(128, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for batch in dm.train_dataloader():
        loss = model(batch["vec"]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if found:
            break
    return found


def main() -> None:
    import common

    from benchmarks.harness.contention import BusyLoops

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per transform, interleaved")
    ap.add_argument(
        "--busy", type=int, default=0, help="N busy-loop processes, each in its own session, beside every cell"
    )
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    from probe_worker_race import ROWS

    data = common.vec_dataset(args.cache_dir, ROWS)
    load = common.load_average()
    cells: dict[str, list[dict[str, Any]]] = {name: [] for name in TRANSFORMS}
    with contextlib.ExitStack() as stack:
        busy = stack.enter_context(BusyLoops(args.busy))
        for _ in range(args.reps):
            for name in TRANSFORMS:
                cells[name].append(common.run_child([str(PROBE_DIR / "probe_gil_share.py"), "--child", name, data]))

    def spread(runs: list[dict[str, Any]], key: str) -> str:
        values = [run[key] for run in runs]
        return f"{statistics.median(values):.0%} ({min(values):.0%}-{max(values):.0%})"

    lines = [
        "# The race's GIL share: CPU seconds (as shipped) against each call's wall time (before) (#51)",
        "",
        f"`{common.command_line()}` on {common.stamp()}; {common.machine(lightning=True)}; load average {load} at "
        f"the start. {busy.describe() or 'Nothing else ran beside it.'}",
        "",
        f"A {ROWS:,}-row scan, batch 256, `num_workers=2`, a linear layer's training step a batch; each cell a fresh "
        f"process, {args.reps} interleaved runs: the median share (min-max) at the race's first gate check. The "
        "gate opens at 40% (Amdahl's 1.25x on 2 workers and 2 cores).",
        "",
        "| transform | CPU share (as shipped) | wall share (before) | gate opened | loop ms a batch |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, runs in cells.items():
        opened = sum(bool(run["opens"]) for run in runs)
        loop_ms = statistics.median(run["loop_ms"] for run in runs)
        lines.append(
            f"| `{name}` | {spread(runs, 'cpu')} | {spread(runs, 'wall')} | {opened} of {len(runs)} | {loop_ms:.2f} |"
        )
    common.write_result(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        main()
