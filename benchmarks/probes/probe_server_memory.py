"""Probe: the memory and start of the fork server, forked from the training process or stock (#51).

Backs `lance_lightning.load.forked_server`. Each case is a fresh process, as a training script
is: it imports Lightning, holds ``--model-mib`` MiB of float32 "weights" (written, so resident),
builds a `LanceDataModule` (``num_workers=2``, persistent workers, the workers forced and every
batch from them, `probe_worker_race`'s 20-step Python transform), calls ``setup`` (which starts
the fork server), then frees the weights (as a model moved to the GPU frees its CPU copy), reads
``--epochs`` epochs of 10^5 rows and measures (psutil, Linux) the unique memory (USS) and
proportional memory (PSS) of the training process, the fork server and each worker; and the
seconds from ``setup`` to the end of the first epoch. Cases: the server forked
(the default) or stock (``LANCE_LIGHTNING_FORKED_SERVER=off``), with and without weights. The
forked server keeps the pages the training process had when it forked, so the weights freed
after ``setup`` stay in its USS.

    uv run python benchmarks/probes/probe_server_memory.py --model-mib 512 --out FILE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent
for _path in (str(PROBE_DIR), str(PROBE_DIR.parent), str(PROBE_DIR.parent.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import common  # noqa: E402
import probe_worker_race as race_probe  # noqa: E402

MIB = 2**20


def child(data: dict[str, str], model_mib: int, epochs: int) -> dict[str, Any]:
    """One case in this fresh process (see the module docstring)."""
    import lightning.pytorch  # noqa: F401  (a training script imports it at its top)
    import psutil
    import torch

    from lance_lightning.load.forked_server import private_bytes, running_server

    weights = torch.ones(model_mib * MIB // 4) if model_mib else None
    dm = race_probe._module("gil-light", data, 2)
    held_at_setup = private_bytes()
    started = time.perf_counter()
    dm.setup("fit")
    del weights  # the CPU copy of a model moved to the GPU
    loader = dm.train_dataloader()
    first = None
    for _ in range(epochs):
        for _batch in loader:
            pass
        first = first if first is not None else time.perf_counter() - started
    from multiprocessing import forkserver

    server = psutil.Process(forkserver._forkserver._forkserver_pid)
    workers = [p for p in server.children() if p.is_running()]

    def mem(process: psutil.Process) -> dict[str, float]:
        info = process.memory_full_info()
        return {"uss": info.uss / MIB, "pss": info.pss / MIB}

    return {
        "server": running_server(),
        "private_at_setup_mib": held_at_setup / MIB,
        "first_epoch_s": first,
        "trainer": mem(psutil.Process(os.getpid())),
        "fork_server": mem(server),
        "workers": [mem(p) for p in workers],
    }


def _case(data: dict[str, str], model_mib: int, epochs: int, forked: bool) -> dict[str, Any]:
    code = f"import json, probe_server_memory as p\nprint(json.dumps(p.child({data!r}, {model_mib}, {epochs})))"
    env = {"LANCE_LIGHTNING_WORKER_CHOICE": "workers", "LANCE_LIGHTNING_WORKER_HANDOFF": "off"}
    env["LANCE_LIGHTNING_FORKED_SERVER"] = "on" if forked else "off"
    return race_probe._run(code, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-mib", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = {"vec": common.vec_dataset(common.DEFAULT_CACHE, race_probe.ROWS)}
    lines = [
        "# The fork server's memory and start, forked or stock (#51)",
        "",
        f"`{common.command_line()}` on {common.machine()}.",
        "",
        "Each row a fresh process; MiB from psutil after the epochs (USS: pages no other process maps; PSS: "
        "shared pages split between the processes mapping them). The weights are freed after `setup`.",
        "",
        "| server | weights (MiB) | private at setup (MiB) | setup to end of epoch 1 (s) | trainer USS | trainer PSS | "
        "server USS | server PSS | workers USS (each) | workers PSS (sum) | all PSS (sum) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model_mib in (0, args.model_mib):
        for forked in (True, False):
            found = _case(data, model_mib, args.epochs, forked)
            workers = found["workers"]
            each = ", ".join(f"{w['uss']:,.0f}" for w in workers)
            total = found["trainer"]["pss"] + found["fork_server"]["pss"] + sum(w["pss"] for w in workers)
            lines.append(
                f"| {found['server']} | {model_mib} | {found['private_at_setup_mib']:,.0f} | "
                f"{found['first_epoch_s']:.2f} | {found['trainer']['uss']:,.0f} | {found['trainer']['pss']:,.0f} | "
                f"{found['fork_server']['uss']:,.0f} | {found['fork_server']['pss']:,.0f} | {each} | "
                f"{sum(w['pss'] for w in workers):,.0f} | {total:,.0f} |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
