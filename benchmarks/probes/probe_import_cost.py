"""What slows the race's read in process while the fork server imports, and what a fit sees (#51).

With a transform that may hold the GIL the fork server starts at ``setup`` and imports torch, Arrow
and Lance for seconds while the race reads in process (`lance_lightning.load.race`). This probe
splits what that read loses against ``num_workers=0`` into its two possible causes and shows the
user's path, each in its own fresh process (`probe_worker_race`'s workloads and data):

- ``path``: the race's own path with no server: a loader with ``num_workers=0`` and one with
  ``num_workers=2`` whose fork server never starts (the probe stubs `WorkerStart` and the early
  start), epochs read in turn; the median rows/s of each and their ratio.
- ``beside``: a ``num_workers=0`` loader read in blocks of epochs, alternately with nothing beside
  it and with a co-runner at nice 19: ``import`` (a fresh interpreter importing what the server
  imports, ``lance_lightning.load.dataset``; epochs are read until it exits) or ``loop`` (a
  pure-Python loop for as many seconds: CPU without the imports' memory traffic); the median
  rows/s with and without, and their ratio.
- ``fit``: `Trainer.fit` of a linear layer on the workload's data module for ``--epochs`` epochs,
  ``num_workers`` 0 and 2 (as shipped) in alternating fresh processes; each epoch's seconds.

Usage::

    uv run python benchmarks/probes/probe_import_cost.py --workload gil --blocks 6 --epochs 8 --runs 2 --out FILE
    uv run python benchmarks/probes/probe_import_cost.py --workload gil-heavy --parts fit --epochs 6 --runs 1 --out FILE
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(PROBE_DIR), str(PROBE_DIR.parent), str(PROBE_DIR.parent.parent)]

import probe_worker_race as race_probe  # noqa: E402

#: What each ``beside`` co-runner runs (``import`` ends by itself; ``loop`` runs `LOOP_S` seconds).
LOOP_S = 4.0
PARTS = ("path", "beside", "fit")
CO_RUNNERS = {
    "import": "import lance_lightning.load.dataset",
    "loop": f"import time\nend = time.perf_counter() + {LOOP_S}\nwhile time.perf_counter() < end: pass",
}


def _data() -> dict[str, str]:
    import common

    return {
        "vec": common.vec_dataset(common.DEFAULT_CACHE, race_probe.ROWS),
        "images": common.image_dataset(common.DEFAULT_CACHE, race_probe.IMAGES),
    }


def _epoch(loader: Any) -> float:
    started = time.perf_counter()
    rows = sum(len(batch["id"]) for batch in loader)
    return rows / (time.perf_counter() - started)


def path(workload: str, epochs: int) -> dict[str, Any]:
    """``num_workers=0`` against a raced ``num_workers=2`` whose server never starts, in turn."""
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)

    import lance_lightning.datamodule as datamodule
    from lance_lightning.load import handoff

    datamodule.start_server_early = lambda *args, **kwargs: None  # type: ignore[assignment]
    handoff.WorkerStart.start = lambda self: self  # type: ignore[method-assign]
    handoff.WorkerStart.ready = lambda self: False  # type: ignore[method-assign]
    data, loaders = _data(), {}
    for workers in (0, 2):
        module = race_probe._module(workload, data, workers)
        module.setup("fit")
        loaders[workers] = module.train_dataloader()
    rates: dict[int, list[float]] = {0: [], 2: []}
    for epoch in range(epochs):
        for workers in (0, 2) if epoch % 2 else (2, 0):
            rates[workers].append(_epoch(loaders[workers]))
    return {str(w): statistics.median(r[2:]) for w, r in rates.items()}  # the first two epochs warm up


def beside(workload: str, co_runner: str, blocks: int) -> dict[str, Any]:
    """A ``num_workers=0`` read with nothing beside it and with ``co_runner`` at nice 19, in turn."""
    import lightning.pytorch  # noqa: F401

    module = race_probe._module(workload, _data(), 0)
    module.setup("fit")
    loader = module.train_dataloader()
    for _ in range(2):
        _epoch(loader)
    rates: dict[str, list[float]] = {"alone": [], "beside": []}
    for _ in range(blocks):
        rates["alone"] += [_epoch(loader) for _ in range(4)]
        other = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-c", CO_RUNNERS[co_runner]], cwd=race_probe.REPO_ROOT
        )
        while other.poll() is None:
            rates["beside"].append(_epoch(loader))
    return {name: statistics.median(got) for name, got in rates.items()} | {"epochs beside": len(rates["beside"])}


def fit(workload: str, workers: int, epochs: int) -> dict[str, Any]:
    """Each epoch's seconds of a `Trainer.fit` of a linear layer on ``vec``, and what its race did."""
    import lightning.pytorch as pl
    import torch

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(128, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.layer(batch["vec"]).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class EpochEnds(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_start(self, *args: Any) -> None:
            self.times.append(time.perf_counter())

        def on_train_epoch_end(self, *args: Any) -> None:
            self.times.append(time.perf_counter())

    ends = EpochEnds()
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[ends],
    )
    trainer.fit(Linear(), datamodule=race_probe._module(workload, _data(), workers))
    race = getattr(trainer.train_dataloader, "race", None)
    return {
        "seconds": [later - earlier for earlier, later in zip(ends.times, ends.times[1:], strict=False)],
        "race": race_probe._described(race) if race is not None else "",
    }


def _call(expression: str) -> Any:
    """``expression`` (a call of this module) in a fresh process, its JSON result."""
    code = f"import json, sys; sys.path[:0] = {[str(PROBE_DIR)]!r}\nimport probe_import_cost as p\nprint(json.dumps(p.{expression}))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=race_probe.REPO_ROOT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{expression} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import common

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="gil", choices=tuple(race_probe.GIL_LOOPS))
    ap.add_argument("--path-epochs", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=6, help="blocks of epochs with a co-runner beside (each kind)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs of each fit")
    ap.add_argument("--runs", type=int, default=2, help="fits of each worker count, alternating")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    w = args.workload
    lines = [
        f"# What slows the race's read while the fork server imports ({w}), and what a fit sees (#51)",
        "",
        f"`{common.command_line()}` on {common.stamp()}; {common.machine(lightning=True)}; load average "
        f"{common.load_average()} at the start. Each part a fresh process; rows/s are medians.",
        "",
    ]
    if {"path", "beside"} & set(args.parts):
        lines += ["| part | without | with | ratio |", "|---|---:|---:|---:|"]
    if "path" in args.parts:
        got = _call(f"path({w!r}, {args.path_epochs})")
        lines.append(
            f"| the race's path, no server (0 workers / 2) | {got['0']:,.0f} | {got['2']:,.0f} | {got['2'] / got['0']:.2f}x |"
        )
        print(lines[-1], flush=True)
    for co_runner in CO_RUNNERS if "beside" in args.parts else ():
        got = _call(f"beside({w!r}, {co_runner!r}, {args.blocks})")
        lines.append(
            f"| 0 workers, a nice-19 `{co_runner}` beside ({got['epochs beside']} epochs beside) | "
            f"{got['alone']:,.0f} | {got['beside']:,.0f} | {got['beside'] / got['alone']:.2f}x |"
        )
        print(lines[-1], flush=True)
    if "fit" not in args.parts:
        common.write_result(args.out, "\n".join(lines))
        return
    lines += ["", f"`Trainer.fit`, seconds per epoch ({args.runs} runs each, alternating):", ""]
    lines += ["| num_workers | run | " + " | ".join(f"e{e + 1}" for e in range(args.epochs)) + " | total |"]
    lines += ["|---:|---:|" + "---:|" * (args.epochs + 1)]
    races = []
    for run in range(args.runs):
        for workers in (0, 2):
            got = _call(f"fit({w!r}, {workers}, {args.epochs})")
            cells = " | ".join(f"{s:.3f}" for s in got["seconds"])
            lines.append(f"| {workers} | {run + 1} | {cells} | {sum(got['seconds']):.2f} |")
            print(lines[-1], flush=True)
            races += [f"- run {run + 1}: {got['race']}"] if got["race"] else []
    lines += ["", "What each fit's race did (its end-of-fit statement):", "", *races]
    common.write_result(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
