"""The peers benchmark's workloads and one cell of it (one loader, workload and worker count).

Guarantees:
- Imports nothing but the standard library at module level: it runs in the project's environment
  and in the peers' own (``bench_peers.py --cell`` in a fresh process of either), each loader's
  packages imported only by the cell that uses them.
- `build_loader` builds the cell's loader the way its project documents it, every batch a dict
  holding an ``id`` tensor; the peers decode JPEGs with TorchCodec's batched ``decode_jpeg``
  (`decode_jpegs`), as ours does through ``DecodeImage``.
- `cell` keeps imports, data set opening and the first `WARM_BATCHES` batches outside the clock,
  then counts whole batches across epochs until ``seconds`` have passed; it reports rows/s, the
  first epoch's shuffle quality (`entropy_bits` of ``id * CLASSES // table_rows``) and whether that
  epoch delivered every expected row exactly once.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

WORKLOADS = ["scan", "shuffle", "filter", "jpeg"]
LOADERS = ["lance-lightning", "lance.torch", "litdata", "lancedb"]
PEERS = LOADERS[1:]
WORKERS = [0, 2]
BATCH = 256
WARM_BATCHES = 2
CLASSES = 100


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
    # threads crashes its workers ("DataLoader worker exited unexpectedly"). They are kept across
    # epochs, as ours are, where the peer allows it (LanceDB's StreamingDataLoader refuses).
    mp = {"multiprocessing_context": "forkserver", "persistent_workers": True} if workers else {}

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
        mp.pop("persistent_workers", None)
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
