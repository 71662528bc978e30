"""The peers benchmark's two environments: the peers' virtualenv, the shared data, running a cell.

Guarantees:
- `ensure_peers` makes the peers' environment (``uv venv`` + ``uv pip install`` of `PEER_PACKAGES`)
  only when its interpreter cannot import them; none of them is a dependency of the package.
- `prepare_data` writes every table once under the cache folder (a plain Lance vector table,
  `common.image_dataset`'s JPEGs, and LitData's chunk format of both, made in the peers'
  environment by ``bench_peers.py --peer-prepare``) and computes each workload's expected rows and
  a perfect shuffle's entropy on the same rows.
- `run_cell` runs one cell in a fresh process (``bench_peers.py --cell``: ours with the running
  interpreter, the peers with ``--peer-python``) and returns its result, or ``{"error": ...}``
  when it fails or gives no result within ``--cell-timeout``; the cell's whole process group
  (its fork server and workers included) is killed when it ends. Ours runs with
  ``LANCE_LIGHTNING_WORKER_HANDOFF=off``: with workers, every batch is a worker's.
- Imports nothing but the standard library and `peers_workloads` at module level (the peers'
  environment imports it too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from peers_workloads import BATCH, CLASSES, entropy_bits

HERE = Path(__file__).resolve().parent
#: The script every subprocess of the benchmark runs (``--cell``, ``--peer-prepare``).
SCRIPT = HERE / "bench_peers.py"
PEERS_VENV = Path("/tmp/lance_lightning_peers/venv")
PEER_PACKAGES = ["litdata", "mosaicml-streaming", "pillow", "pylance", "lancedb", "torchcodec", "psutil"]


# -- data, in the project's environment ------------------------------------------------------------
def vec_table(cache: Path, rows: int) -> str:
    """``cache/lancedb/vec_<rows>.lance``: one plain ``lance.write_dataset`` (written once)."""
    import lance
    import numpy as np
    import pyarrow as pa

    path = cache / "lancedb" / f"vec_{rows}.lance"
    if path.exists() and lance.dataset(str(path)).count_rows() == rows:
        return str(path)
    rng = np.random.default_rng(0)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 128, dtype=np.float32)), 128)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "label": pa.array(rng.integers(0, 100, rows, dtype=np.int32)),
            "vec": vec,
        }
    )
    lance.write_dataset(table, str(path), mode="overwrite")
    return str(path)


def image_table(cache: Path, rows: int) -> str:
    """``cache/lancedb/images_<rows>.lance``: `common.image_dataset`'s JPEGs (id, image, label)."""
    import common

    path = cache / "lancedb" / f"images_{rows}.lance"
    if not path.exists():
        source = common.image_dataset(cache, rows, log=lambda _: None)
        os.makedirs(path.parent, exist_ok=True)
        os.symlink(source, path)
    return str(path)


def peer_prepare(args: argparse.Namespace) -> None:
    """In the peers' environment: LitData's chunk format of a Lance table, written once."""
    import lance
    from litdata import optimize

    out = Path(args.output)
    if (out / "index.json").exists():
        return
    rows = lance.dataset(args.uri).count_rows()
    starts = list(range(0, rows, 2048))
    optimize(
        fn=_litdata_rows,
        inputs=[(args.uri, s, min(rows, s + 2048)) for s in starts],
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=2,
        verbose=False,
    )


def _litdata_rows(item: tuple[str, int, int]) -> Any:
    import lance

    uri, start, stop = item
    table = lance.dataset(uri).take(list(range(start, stop)))
    for row in table.to_pylist():
        if "vec" in row:
            import numpy as np

            row["vec"] = np.asarray(row["vec"], dtype=np.float32)
        yield row


def ensure_peers(python: Path) -> None:
    """The peers' environment: ``uv venv`` + ``uv pip install`` of `PEER_PACKAGES` (a no-op when all import)."""
    probe = "import litdata, lance, lancedb, torchcodec, psutil"
    if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return
    venv = python.parent.parent
    print(f"making the peers' environment {venv} (uv pip install {' '.join(PEER_PACKAGES)})", flush=True)
    if not python.exists():
        subprocess.run(["uv", "venv", "-q", "--python", "3.11", str(venv)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(python), *PEER_PACKAGES], check=True)


def prepare_data(args: argparse.Namespace) -> dict:
    import lance
    import numpy as np

    cache = args.cache_dir
    vec = vec_table(cache, args.rows)
    images = image_table(cache, args.images)
    data: dict[str, Any] = {"vec": vec, "images": images}
    for key, uri in (("litdata_vec", vec), ("litdata_images", images)):
        out = cache / "litdata" / Path(uri).stem
        cmd = [str(args.peer_python), str(SCRIPT), "--peer-prepare", uri, str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp")
        if done.returncode != 0:
            raise RuntimeError(f"LitData optimize of {uri} failed:\n{done.stderr[-3000:]}")
        data[key] = str(out)
    labels = lance.dataset(vec).to_table(columns=["id", "label"])
    kept = labels.filter(np.asarray(labels.column("label")) < 10).column("id").to_numpy()
    data["expected"] = {"scan": args.rows, "shuffle": args.rows, "filter": len(kept), "jpeg": args.images}
    data["table_rows"] = {"vec": args.rows, "jpeg": args.images}
    rng = np.random.default_rng(1)
    ids = {"scan": np.arange(args.rows), "filter": kept, "jpeg": np.arange(args.images)}
    data["perfect"] = {}
    for workload, every in ids.items():
        n = data["table_rows"]["jpeg" if workload == "jpeg" else "vec"]
        scores = []
        for _ in range(4):
            perm = rng.permutation(every)
            scores += [entropy_bits(perm[i : i + BATCH] * CLASSES // n) for i in range(0, len(perm) - BATCH + 1, BATCH)]
        data["perfect"][workload] = statistics.fmean(scores)
    data["perfect"]["shuffle"] = data["perfect"]["scan"]
    return data


def run_cell(loader: str, workload: str, workers: int, data: dict, args: argparse.Namespace) -> dict:
    python = sys.executable if loader == "lance-lightning" else str(args.peer_python)
    cmd = [python, str(SCRIPT), "--cell", loader, workload, str(workers), "--seconds", str(args.seconds)]
    cmd += ["--data", json.dumps(data)]
    # Ours with workers waits for them, as the peers' loaders do: the timed window measures the
    # worker path, not the batches the training process reads while they start (the hand-over).
    handoff = {"LANCE_LIGHTNING_WORKER_HANDOFF": "off"}
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), **handoff} if loader == "lance-lightning" else None
    # Its own session: a cell that times out is killed with every process it started (its fork
    # server and workers), so none of them runs on beside the next cells.
    cell_process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp", env=env, start_new_session=True
    )
    try:
        stdout, stderr = cell_process.communicate(timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.cell_timeout} s"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cell_process.pid, signal.SIGKILL)
        cell_process.communicate()
    if cell_process.returncode != 0:
        last = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or ["?"]
        return {"error": f"exit {cell_process.returncode}: {last[0][:300]}", "stderr": stderr[-3000:]}
    return json.loads(stdout.strip().splitlines()[-1])
