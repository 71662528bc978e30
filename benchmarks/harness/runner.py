"""Runs cells: each in a fresh process of its own environment, repetitions in a rotated loader order.

Guarantees:
- `run_cell` runs one cell as ``python -m benchmarks.harness.cell`` (ours with the running
  interpreter and the loader's environment settings, a peer with the peers' interpreter) in a new
  session, and returns its result, or ``{"error": ...}`` when it fails or gives no result within
  ``cell_timeout``; its whole process group (fork server and workers included) is killed when it
  ends, so nothing of it runs on beside the next cell.
- `ensure_peers` makes the peers' environment (``uv venv`` + ``uv pip install`` of `PEER_PACKAGES`)
  only when its interpreter cannot import them; none of them is a dependency of the package.
- `run` measures every cell ``reps`` times; within a repetition the cells of one workload, size,
  worker count and storage run back to back, the loaders' order rotated by one each repetition.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import data as tables
from benchmarks.harness.registry import LOADERS, Cell

ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = Path("/tmp/lance_lightning_peers/venv")
PEER_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ["litdata", "mosaicml-streaming", "pillow", "pylance", "lancedb", "torchcodec", "psutil"]
PEER_IMPORTS = "import litdata, streaming, lance, lancedb, torchcodec, psutil"


def ensure_peers(python: Path) -> None:
    """The peers' environment: made with ``uv`` when its interpreter cannot import the peers."""
    if python.exists() and subprocess.run([str(python), "-c", PEER_IMPORTS], capture_output=True).returncode == 0:
        return
    venv = python.parent.parent
    print(f"making the peers' environment {venv} (uv pip install {' '.join(PEER_PACKAGES)})", flush=True)
    if not python.exists():
        subprocess.run(["uv", "venv", "-q", "--python", "3.11", str(venv)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(python), *PEER_PACKAGES], check=True)


def run_cell(cell: Cell, data: dict, seconds: float, cell_timeout: float, peer_python: Path, options: dict) -> dict:
    loader = LOADERS[cell.loader]
    python = str(peer_python) if loader.peer else sys.executable
    spec = {"workload": cell.workload, "loader": cell.loader, "workers": cell.workers, "seconds": seconds}
    spec |= {"data": data, **options}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, **dict(loader.env)}
    returncode, stdout, stderr = run_in_session(
        [python, "-m", "benchmarks.harness.cell", json.dumps(spec)], env, cell_timeout
    )
    if returncode is None:
        return {"error": f"no result within {cell_timeout:g} s"}
    if returncode != 0:
        last = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or ["?"]
        return {"error": f"exit {returncode}: {last[0][:300]}", "stderr": stderr[-3000:]}
    return json.loads(stdout.strip().splitlines()[-1])


def run_in_session(command: list[str], env: dict, timeout: float) -> tuple[int | None, str, str]:
    """``command`` in a new session from the repository root: (its exit status, or None past
    ``timeout``; stdout; stderr). It ends with its process: the output goes to files, read once that
    process has exited, and then its whole group is killed (a peer's workers that outlive it, as its
    `os._exit` skips their shutdown, held pipes open: waiting for their end of file turned every
    LitData cell into "no result")."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            command, stdout=out, stderr=err, text=True, cwd=ROOT, env=env, start_new_session=True
        )
        try:
            returncode: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        out.seek(0)
        err.seek(0)
        return returncode, out.read(), err.read()


def run(
    cells: list[Cell],
    reps: int,
    seconds: float,
    cache: Path,
    cell_timeout: float,
    peer_python: Path = PEER_PYTHON,
    options: dict | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict]]:
    """Every cell ``reps`` times: {cell name: [result of each repetition]}; ``options`` go to each
    cell's measurement (``again``, ``resume``: `benchmarks.harness.cell`)."""
    if any(LOADERS[c.loader].peer for c in cells):
        ensure_peers(peer_python)
    began = time.perf_counter()
    prepared = {c.name: tables.prepare(c, cache, peer_python) for c in cells}
    log(f"data ready in {time.perf_counter() - began:.0f} s")
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.workload, c.size, c.workers, c.storage), []).append(c)
    results: dict[str, list[dict]] = {c.name: [] for c in cells}
    for rep in range(reps):
        for group in groups.values():
            shift = rep % len(group)
            for c in group[shift:] + group[:shift]:
                r = run_cell(c, prepared[c.name], seconds, cell_timeout, peer_python, options or {})
                r["load"] = os.getloadavg()[0]
                results[c.name].append(r)
                speed = f"{r['rows_per_s']:12,.0f} rows/s" if r.get("rows_per_s") else ""
                what = r.get("error") or f"first batch {r['first_batch_s']:.3f} s {speed} {r['check']}"
                log(f"rep {rep + 1} {c.name:40s} {what}")
    return results
