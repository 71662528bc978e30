"""lance-lightning against its peers, side by side on the same data (issue #39).

Loaders: ours (``LanceDataModule``), pylance's ``lance.torch`` (``LanceDataset`` for ordered reads,
``SafeLanceDataset`` + ``DataLoader(shuffle=True)`` for shuffled ones, its documented row-shuffle
path), LitData (``optimize`` to its chunk format, then ``StreamingDataset`` + ``StreamingDataLoader``)
and LanceDB's ``StreamingDataset`` + ``StreamingDataLoader`` (its ``transform`` hook turns each Arrow
batch into rows). Workloads, batch 256, rows/s:

- ``scan``: 400k rows of ``id`` int64, ``label`` int32 uniform 0..99, ``vec`` 128 x float32
  (one plain ``lance.write_dataset``), in storage order;
- ``shuffle``: the same table in a true row shuffle (ours ``RowShuffle(seed=0)``; each peer's own
  row shuffle);
- ``filter``: ``label < 10`` (10% of rows), no shuffle. LitData has no predicate: it reads every
  row and its collate drops the others (its rows/s count the kept rows, as for everyone);
- ``jpeg``: 20k 64x64 RGB JPEGs shuffled and decoded to uint8 tensors; every loader decodes with
  TorchCodec's batched ``decode_jpeg`` (ours through ``DecodeImage``), in its workers.

Each cell (workload x workers {0, 2} x loader) runs in a fresh process: ours in the project's
environment, the peers in their own (``--peer-python``, made with ``uv venv`` + ``uv pip install``
of `PEER_PACKAGES` when missing; none of them is a dependency of the package). Imports, data set
opening and the first ``WARM_BATCHES`` batches (worker start) are outside the clock; the clock then
runs over whole batches, across epochs, until ``--seconds`` have passed. Cells run in a rotated
order, ``--reps`` times; the table shows median rows/s and the median of the per-repetition ratios
to the best peer of that workload and worker count.

Shuffle quality is the project's metric (``results/shuffle_quality.md``) applied to ``id`` order:
a row's "class" is ``id * 100 // table_rows`` (the table as if stored sorted by 100 labels), the
score is the mean per-batch entropy of that class over the first epoch's full batches divided by
that of a perfect shuffle of the same rows (1.0 = perfect, ~0.15 = storage order). Each cell also
checks that its first epoch delivered every expected row exactly once, and says so when not.

    uv run --no-sync python benchmarks/bench_peers.py [--reps 1] [--seconds 4]

``--quick``: 40k vector rows, 4k images, 1.5 s per cell, written under ``--cache-dir`` instead of
``results/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_VENV = Path("/tmp/lance_lightning_peers/venv")
PEER_PACKAGES = ["litdata", "mosaicml-streaming", "pillow", "pylance", "lancedb", "torchcodec", "psutil"]
WORKLOADS = ["scan", "shuffle", "filter", "jpeg"]
LOADERS = ["lance-lightning", "lance.torch", "litdata", "lancedb"]
PEERS = LOADERS[1:]
WORKERS = [0, 2]
BATCH = 256
WARM_BATCHES = 2
CLASSES = 100
TARGET = 1.2
LABELS = {
    "lance-lightning": "lance-lightning `LanceDataModule`",
    "lance.torch": "pylance `lance.torch`",
    "litdata": "LitData `StreamingDataset`",
    "lancedb": "LanceDB `StreamingDataset`",
}
WORKLOAD_LABELS = {
    "scan": "(1) sequential scan",
    "shuffle": "(2) row shuffle",
    "filter": "(3) filter `label < 10`",
    "jpeg": "(4) shuffled JPEG decode",
}


# -- shared by both environments ------------------------------------------------------------------
def entropy_bits(classes: Any) -> float:
    import numpy as np

    counts = np.bincount(classes, minlength=CLASSES)
    p = counts[counts > 0] / len(classes)
    return float(-(p * np.log2(p)).sum())


def decode_jpegs(blobs: list[bytes]) -> Any:
    """``(N, 3, H, W)`` uint8: TorchCodec's batched CPU decoder (what ``DecodeImage`` uses)."""
    import torch
    from torchcodec.decoders import decode_jpeg

    return torch.stack(decode_jpeg([torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]))


# -- one cell, in a fresh process ----------------------------------------------------------------
def build_loader(loader: str, workload: str, workers: int, data: dict) -> Any:
    """The loader of one cell; its batches are dicts holding an ``id`` tensor."""
    jpeg = workload == "jpeg"
    shuffle = workload in ("shuffle", "jpeg")
    uri = data["images"] if jpeg else data["vec"]
    columns = ["id", "image", "label"] if jpeg else ["id", "label", "vec"]
    where = "label < 10" if workload == "filter" else None
    if loader == "lance-lightning":
        from lance_lightning import LanceDataModule, LanceSource, NoShuffle, RowShuffle
        from lance_lightning.transforms import DecodeImage

        dm = LanceDataModule(
            train=LanceSource(uri, columns=columns, filter=where),
            batch_size=BATCH,
            shuffle=RowShuffle(seed=0) if shuffle else NoShuffle(),
            num_workers=workers,
            transform=DecodeImage(column="image") if jpeg else None,
        )
        dm.setup("fit")
        return dm.train_dataloader()
    from functools import partial

    from torch.utils.data import DataLoader

    tensors = partial(_tensors, jpeg)
    # The peers' workers start by forkserver, as ours do: forking a process that already runs Lance's
    # threads crashes its workers ("DataLoader worker exited unexpectedly").
    mp = {"multiprocessing_context": "forkserver"} if workers else {}

    if loader == "lance.torch":
        from lance.torch.data import LanceDataset, SafeLanceDataset

        if shuffle:  # the map-style dataset: one `take` of the batch's rows, then `to_pylist`
            return DataLoader(
                SafeLanceDataset(uri), batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=tensors, **mp
            )
        extra = {} if where is None else {"filter": where}
        ds = LanceDataset(uri, batch_size=BATCH, columns=columns, **extra)

        return DataLoader(ds, batch_size=None, num_workers=workers, worker_init_fn=_shard if workers else None, **mp)
    if loader == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(input_dir=data["litdata_images" if jpeg else "litdata_vec"], shuffle=shuffle, seed=0)
        kept = partial(_kept, jpeg, where is not None)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=kept, **mp)
    if loader == "lancedb":
        import lancedb
        from lancedb.streaming import StreamingDataLoader, StreamingDataset

        table = lancedb.connect(str(Path(uri).parent)).open_table(Path(uri).stem)

        ds = StreamingDataset(
            table,
            num_splits=max(1, workers),
            shuffle=shuffle,
            shuffle_seed=0,
            columns=columns,
            filter=where,
            transform=partial(_lancedb_rows, jpeg),
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, **mp)
    raise ValueError(loader)


def _tensors(jpeg: bool, rows: list[dict]) -> dict:
    """A batch from per-row dicts, as the peers' row APIs hand them out."""
    import numpy as np
    import torch

    out = {"id": torch.tensor([r["id"] for r in rows])}
    if jpeg:
        out["image"] = decode_jpegs([bytes(r["image"]) for r in rows])
    else:
        out["label"] = torch.tensor([r["label"] for r in rows])
        out["vec"] = torch.from_numpy(np.stack([np.asarray(r["vec"], dtype=np.float32) for r in rows]))
    return out


def _kept(jpeg: bool, filtered: bool, rows: list[dict]) -> dict:
    """LitData's filter: the collate drops the rows with ``label >= 10``."""
    return _tensors(jpeg, [r for r in rows if r["label"] < 10] if filtered else rows)


def _shard(_: int) -> None:
    """``lance.torch``'s ``LanceDataset`` in a worker: its share of batches (else each reads all)."""
    import torch

    info = torch.utils.data.get_worker_info()
    info.dataset.rank, info.dataset.world_size = info.id, info.num_workers
    info.dataset.shard_granularity = "batch"


def _lancedb_rows(jpeg: bool, batch: Any) -> list[dict]:
    """LanceDB's ``transform``: one Arrow batch to per-row dicts (images decoded in one call)."""
    ids = batch.column("id").to_numpy()
    if jpeg:
        images = decode_jpegs([v.as_py() for v in batch.column("image")])
        return [{"id": ids[i], "image": images[i]} for i in range(len(ids))]
    vec = batch.column("vec").values.to_numpy().reshape(len(ids), -1)
    labels = batch.column("label").to_numpy()
    return [{"id": ids[i], "label": labels[i], "vec": vec[i]} for i in range(len(ids))]


def cell(loader: str, workload: str, workers: int, data: dict, seconds: float) -> dict:
    """Build the cell's loader, skip `WARM_BATCHES`, then count rows until ``seconds`` have passed
    (whole batches, across epochs); the first epoch's ids give the shuffle quality and the check."""
    import numpy as np

    expected = data["expected"][workload]
    table_rows = data["table_rows"]["jpeg" if workload == "jpeg" else "vec"]
    built = time.perf_counter()
    dl = build_loader(loader, workload, workers, data)
    first_epoch: list[Any] = []
    rows = 0
    started = None
    epochs = 0
    first_batch_s = None
    while True:
        for i, batch in enumerate(dl):
            ids = batch["id"]
            if epochs == 0:
                first_epoch.append(np.asarray(ids, dtype=np.int64))
                if i == 0:
                    first_batch_s = time.perf_counter() - built
            if started is None:
                if epochs == 0 and i + 1 < WARM_BATCHES:
                    continue
                started = time.perf_counter()
                continue
            rows += len(ids)
            if time.perf_counter() - started >= seconds:
                break
        else:
            epochs += 1
            if not first_epoch:
                raise RuntimeError("the loader yielded no batch in an epoch")
            continue
        break
    elapsed = time.perf_counter() - started
    seen = np.concatenate(first_epoch)
    complete = epochs >= 1
    check = "first epoch not finished in the time"
    if complete:
        unique = len(np.unique(seen))
        dropped = expected - len(seen)  # drop_last: at most a partial batch per worker
        if unique == len(seen) and 0 <= dropped < BATCH * max(1, workers):
            check = "ok" if dropped == 0 else f"ok ({dropped} rows of a last partial batch dropped)"
        else:
            check = f"{len(seen):,} rows, {unique:,} distinct, {expected:,} expected"
    full = [b for b in first_epoch if len(b) == BATCH]
    score = statistics.fmean(entropy_bits(b * CLASSES // table_rows) for b in full) if full else float("nan")
    return {
        "rows_per_s": rows / elapsed,
        "rows": rows,
        "seconds": elapsed,
        "epochs": epochs,
        "entropy": score,
        "full_batches": len(full),
        "check": check,
        "first_batch_s": first_batch_s,
        "versions": versions(loader),
    }


def versions(loader: str) -> dict:
    import torch

    out = {"torch": torch.__version__, "python": sys.version.split()[0]}
    names = {"lance-lightning": "lance_lightning", "lance.torch": "lance", "litdata": "litdata", "lancedb": "lancedb"}
    module = __import__(names[loader])
    out[loader] = getattr(module, "__version__", "?")
    if loader != "lance-lightning":
        import lance

        out["pylance"] = lance.__version__
    return out


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
        cmd = [str(args.peer_python), __file__, "--peer-prepare", uri, str(out)]
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


# -- the run -------------------------------------------------------------------------------------
def run_cell(loader: str, workload: str, workers: int, data: dict, args: argparse.Namespace) -> dict:
    python = sys.executable if loader == "lance-lightning" else str(args.peer_python)
    cmd = [python, __file__, "--cell", loader, workload, str(workers), "--seconds", str(args.seconds)]
    cmd += ["--data", json.dumps(data)]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)} if loader == "lance-lightning" else None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", env=env, timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.cell_timeout} s"}
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["?"]
        return {"error": f"exit {done.returncode}: {last[0][:300]}", "stderr": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict:
    began = time.perf_counter()
    import common

    ensure_peers(args.peer_python)
    data = prepare_data(args)
    print(f"data ready in {time.perf_counter() - began:.0f} s", flush=True)
    cells = [(w, n, lo) for w in WORKLOADS for n in WORKERS for lo in LOADERS]
    results: dict[str, list[dict]] = {}
    loads = []
    for rep in range(args.reps):
        shift = rep % len(LOADERS)
        for workload, workers, _ in cells[:: len(LOADERS)]:
            for loader in LOADERS[shift:] + LOADERS[:shift]:
                r = run_cell(loader, workload, workers, data, args)
                results.setdefault(f"{workload}|{workers}|{loader}", []).append(r)
                loads.append(os.getloadavg()[0])
                what = r.get("error") or f"{r['rows_per_s']:10,.0f} rows/s  H={r['entropy']:.2f}  {r['check']}"
                print(f"rep {rep + 1} {workload:8s} w={workers} {loader:16s} {what}", flush=True)
    return {
        "results": results,
        "data": {k: v for k, v in data.items() if k != "expected"} | {"expected": data["expected"]},
        "rows": args.rows,
        "images": args.images,
        "image_bytes": image_bytes(data["images"]),
        "reps": args.reps,
        "seconds_per_cell": args.seconds,
        "loads": loads,
        "seconds": time.perf_counter() - began,
        "command": common.command_line(),
        "machine": common.machine(lightning=True),
        "stamp": common.stamp(),
        "load_average": common.load_average(),
        "peer_env": str(args.peer_python.parent.parent),
    }


def image_bytes(uri: str) -> float:
    import lance
    import pyarrow.compute as pc

    column = lance.dataset(uri).to_table(columns=["image"]).column("image")
    return float(pc.mean(pc.binary_length(column)).as_py())


def render(raw: dict) -> str:
    results, perfect = raw["results"], raw["data"]["perfect"]

    def ok(key: str) -> list[dict]:
        return [r for r in results.get(key, []) if "error" not in r]

    def med(key: str) -> float:
        got = ok(key)
        return statistics.median(r["rows_per_s"] for r in got) if got else float("nan")

    def best_peer(workload: str, workers: int) -> str | None:
        speeds = {p: med(f"{workload}|{workers}|{p}") for p in PEERS}
        speeds = {p: s for p, s in speeds.items() if not math.isnan(s)}
        return max(speeds, key=speeds.get) if speeds else None

    def ratio(key: str, best: str | None, workload: str, workers: int) -> float:
        """Median over repetitions of this cell's rows/s over the best peer's in the same repetition."""
        if best is None:
            return float("nan")
        base = results.get(f"{workload}|{workers}|{best}", [])
        pairs = [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(results.get(key, []), base) if "error" not in a | b]
        return statistics.median(pairs) if pairs else float("nan")

    lines = [
        "| workload | workers | loader | rows/s | vs best peer | shuffle quality | first epoch |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    verdicts, failures = [], []
    for workload in WORKLOADS:
        for workers in WORKERS:
            best = best_peer(workload, workers)
            for loader in LOADERS:
                key = f"{workload}|{workers}|{loader}"
                got = ok(key)
                if not got:
                    errors = {r.get("error", "?") for r in results.get(key, [])}
                    failures.append(f"{workload}, {workers} workers, {LABELS[loader]}: {'; '.join(errors)}")
                    lines.append(f"| {WORKLOAD_LABELS[workload]} | {workers} | {LABELS[loader]} | did not run | | | |")
                    continue
                x = ratio(key, best, workload, workers)
                mark = " (best peer)" if loader == best else ""
                quality = statistics.median(r["entropy"] for r in got) / perfect[workload]
                lines.append(
                    f"| {WORKLOAD_LABELS[workload]} | {workers} | {LABELS[loader]}{mark} | {med(key):,.0f} | "
                    f"{x:.2f} | {quality:.2f} | {got[0]['check']} |"
                )
                if loader == "lance-lightning" and workers == 2:
                    verdict = "pass" if x >= TARGET else "miss"
                    verdicts.append(f"{WORKLOAD_LABELS[workload]}: {x:.2f}x {LABELS.get(best, best)} — **{verdict}**")
    versions: dict[str, str] = {}
    for rs in results.values():
        for r in rs:
            versions.update(r.get("versions", {}))
    text = [
        "# lance-lightning against its peers (issue #39)",
        "",
        f"Run {raw['stamp']}, {raw['seconds']:.0f} s, by `benchmarks/bench_peers.py`.",
        "",
        f"Command: `{raw['command']}`",
        "",
        f"Machine: {raw['machine']}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        + f". Peers run in their own environment (`{raw['peer_env']}`), ours in the project's.",
        "",
        f"Load average at the end (1, 5, 15 min): {raw['load_average']}; 1-minute load after each cell "
        f"{min(raw['loads']):.2f}–{max(raw['loads']):.2f} (a shared 2-core VM).",
        "",
        f"Data: {raw['rows']:,} rows (`id`, `label` 0..99, `vec` 128 x float32) in one plain "
        f"`lance.write_dataset`; {raw['images']:,} JPEGs 64x64 RGB, {raw['image_bytes']:,.0f} bytes each on "
        f"average. Batch {BATCH}. Each cell is a fresh process; {raw['reps']} repetition(s) in a rotated loader "
        f"order, {raw['seconds_per_cell']} s of timed reading per cell after {WARM_BATCHES} warm-up batches. "
        "rows/s: median; vs best peer: median of per-repetition ratios to the fastest peer of the same "
        "workload and worker count (above 1: faster than it). Shuffle quality: mean per-batch entropy of "
        "`id * 100 // rows` over the first epoch's full batches, over that of a perfect shuffle (1.00 "
        "perfect, about 0.15 storage order; `results/shuffle_quality.md`). First epoch: every expected row "
        "exactly once.",
        "",
        *lines,
        "",
        f"## Target: with 2 workers, at least {TARGET}x the best peer",
        "",
        *[f"- {v}" for v in verdicts],
        "",
        "## How far these figures can be trusted",
        "",
        "- The 2-worker peer cells are dominated by worker start-up, not by reading. Each peer's "
        "`DataLoader` starts 2 forkserver workers per epoch (no `persistent_workers`); ours keeps its "
        "workers. When an epoch ends inside the timed window (first epoch `ok`), that restart is inside the clock, and in a "
        "short window on a loaded machine it is most of the clock (pylance `lance.torch` scan: 868k rows/s "
        "with no workers, 21k with 2). The 2-worker ratios overstate our lead; the 0-worker ratios are the "
        "fair read. Before quoting a 2-worker pass, rerun with the peers' `persistent_workers=True`, a "
        "longer `--seconds` and the timed window kept inside the first epoch.",
        "- The timed-out cells were not investigated (no traceback: the process was still running at the "
        "limit). LanceDB's `StreamingDataset` ran at 20-35k rows/s where it ran at all; with a filter or "
        "with image columns it gave no result within the limit.",
        "- LitData's filter cells have no shuffle quality: its collate drops rows, so no batch is full.",
        "",
        "## Could not run",
        "",
        *([f"- {f}" for f in failures] or ["- Every cell ran."]),
    ]
    return "\n".join(text) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--cell-timeout", type=float, default=120.0)
    ap.add_argument("--peer-python", type=Path, default=PEERS_VENV / "bin" / "python")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/lance_lightning_bench/peers"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cell", nargs=3, metavar=("LOADER", "WORKLOAD", "WORKERS"))
    ap.add_argument("--data")
    ap.add_argument("--peer-prepare", nargs=2, metavar=("URI", "OUTPUT"))
    args = ap.parse_args()
    if args.cell:
        loader, workload, workers = args.cell
        result = cell(loader, workload, int(workers), json.loads(args.data), args.seconds)
        sys.stdout.flush()
        print(json.dumps(result))
        return
    if args.peer_prepare:
        args.uri, args.output = args.peer_prepare
        peer_prepare(args)
        return
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    if args.quick:
        args.rows, args.images, args.seconds = 40_000, 4_000, 1.5
        args.cache_dir = args.cache_dir / "quick"
    out = args.out or (args.cache_dir / "peers.md" if args.quick else HERE / "results" / "peers.md")
    raw = measure(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(raw))
    out.with_suffix(".raw").write_text(json.dumps(raw, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
