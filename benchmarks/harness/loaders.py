"""Each registered loader built for one cell, the way its project documents it.

Guarantees:
- `build` returns an iterable of batches, each a dict holding the table's key column (``id`` or
  ``x``) as a tensor; the peers decode
  JPEGs with TorchCodec's batched ``decode_jpeg`` (`decode_jpegs`), as ours does through
  ``DecodeImage``, in their workers. Both give the same uint8 ``(N, 3, H, W)`` images: ours
  decodes with ``normalize=False`` (its default also scales to float in [0, 1], work the peers'
  cells do not do).
- Imports nothing but the standard library at module level: it runs in the project's environment
  (ours) and in the peers' own, each loader's packages imported only by the cell that uses it.
- The peers' workers start by forkserver, as ours do (forking a process that already runs Lance's
  threads crashes its workers), and are kept across epochs where the peer allows it (LanceDB's
  ``StreamingDataLoader`` refuses ``persistent_workers``).

``data`` is what `benchmarks.harness.data.prepare` wrote for the cell: the table's URI and, for
LitData and MosaicML, their own formats of the same rows.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness.registry import Workload

BATCH = 256


def decode_jpegs(blobs: list[bytes]) -> Any:
    """``(N, 3, H, W)`` uint8: TorchCodec's batched CPU decoder (what ``DecodeImage`` uses)."""
    import torch
    from torchcodec.decoders import decode_jpeg

    return torch.stack(decode_jpeg([torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]))


#: The modules each loader imports, imported before its cell's clock starts.
IMPORTS = {
    "ours": (
        "lance_lightning.datamodule",
        "lance_lightning.source",
        "lance_lightning.plan.strategies",
        "lance_lightning.transforms",
    ),
    "lance.torch": ("lance.torch.data", "torch.utils.data"),
    "litdata": ("litdata",),
    "lancedb": ("lancedb", "lancedb.streaming"),
    "mosaic": ("streaming", "torch.utils.data"),
    "lance-take": ("lance_lightning.datamodule", "lance_lightning.source", "lance_lightning.read.reader"),
}


def import_modules(loader: str) -> None:
    import importlib

    for module in IMPORTS["ours" if loader.startswith("ours") else loader]:
        importlib.import_module(module)


def build(loader: str, workload: Workload, workers: int, data: dict) -> Any:
    """The cell's loader; its batches are dicts holding an ``id`` tensor."""
    if loader.startswith("ours"):  # the variants differ by their process's environment only
        return _ours(workload, workers, data)
    builders = {"lance.torch": _lance_torch, "litdata": _litdata, "lancedb": _lancedb, "mosaic": _mosaic}
    return {**builders, "lance-take": _lance_take}[loader](workload, workers, data)


def _ours(workload: Workload, workers: int, data: dict) -> Any:
    return _ours_module(workload, data, workers).train_dataloader()


def _ours_module(workload: Workload, data: dict, workers: int = 0) -> Any:
    """Our data module for the cell, set up (``setup("fit")``)."""
    import lance_lightning as ll
    from lance_lightning.transforms import DecodeImage

    dm = ll.LanceDataModule(
        train=ll.LanceSource(data["uri"], columns=list(workload.columns), filter=workload.filter),
        batch_size=BATCH,
        shuffle=getattr(ll, workload.strategy)(**dict(workload.strategy_args)),
        num_workers=workers,
        transform=DecodeImage(column="image", normalize=False) if workload.decode else None,
    )
    dm.setup("fit")
    return dm


def _lance_take(workload: Workload, workers: int, data: dict) -> Any:
    """An epoch of hand-written ``dataset.take`` calls, each of as many random rows as our reader's
    full read group, sorted (a "batch" is one call's rows): the row shuffle's reference."""
    import lance
    import numpy as np
    import torch

    from lance_lightning.read.reader import group_rows

    dm = _ours_module(workload, data)
    rows, key = data["table_rows"], workload.columns[0]
    group, dataset = min(rows, group_rows(dm.plans["train"])), lance.dataset(data["uri"])

    class Epoch:
        def __iter__(self) -> Any:
            rng = np.random.default_rng(0)
            for _ in range(max(1, rows // group)):
                taken = dataset.take(np.sort(rng.choice(rows, group, replace=False)), columns=[key])
                yield {key: torch.from_numpy(taken.column(key).to_numpy())}

    return Epoch()


def _mp(workers: int) -> dict:
    return {"multiprocessing_context": "forkserver", "persistent_workers": True} if workers else {}


def _lance_torch(workload: Workload, workers: int, data: dict) -> Any:
    if workload.shuffled:  # the map-style dataset: one `take` of the batch's rows, then `to_pylist`
        from lance.torch.data import SafeLanceDataset
        from torch.utils.data import DataLoader

        tensors = partial(_tensors, workload.decode)
        dataset = SafeLanceDataset(data["uri"])
        return DataLoader(
            dataset, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=tensors, **_mp(workers)
        )
    return lance_torch(data["uri"], workload.columns, BATCH, workload.filter, workers)


def lance_torch(uri: str, columns: Any, batch_size: int, filter: str | None = None, workers: int = 0) -> Any:
    """pylance's own ``lance.torch.data.LanceDataset`` (with ``filter`` when given) in a plain
    ``DataLoader(batch_size=None)``, each worker reading its share of batches: the ``lance.torch``
    peer of the cells, and of the read and filter-scan studies (0 workers)."""
    from lance.torch.data import LanceDataset
    from torch.utils.data import DataLoader

    extra = {} if filter is None else {"filter": filter}
    ds = LanceDataset(uri, batch_size=batch_size, columns=list(columns), **extra)
    return DataLoader(
        ds, batch_size=None, num_workers=workers, worker_init_fn=_shard if workers else None, **_mp(workers)
    )


def _litdata(workload: Workload, workers: int, data: dict) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(input_dir=data["litdata"], shuffle=workload.shuffled, seed=0)
    kept = partial(_kept, workload.decode, workload.filter is not None)  # no predicate: its collate drops rows
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=kept, **_mp(workers))


def _lancedb(workload: Workload, workers: int, data: dict) -> Any:
    import lancedb
    from lancedb.streaming import StreamingDataLoader, StreamingDataset

    uri = Path(data["uri"])
    ds = StreamingDataset(
        lancedb.connect(str(uri.parent)).open_table(uri.stem),
        num_splits=max(1, workers),
        shuffle=workload.shuffled,
        shuffle_seed=0,
        columns=list(workload.columns),
        filter=workload.filter,
        transform=partial(_lancedb_rows, workload.decode),
    )
    mp = _mp(workers)
    mp.pop("persistent_workers", None)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, **mp)


def _mosaic(workload: Workload, workers: int, data: dict) -> Any:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=data["mds"], shuffle=workload.shuffled, shuffle_seed=0, batch_size=BATCH)
    kept = partial(_kept, workload.decode, workload.filter is not None)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=kept, **_mp(workers))


def _tensors(jpeg: bool, rows: list[dict]) -> dict:
    """A batch from per-row dicts, as the peers' row APIs hand them out."""
    import numpy as np
    import torch

    out = {"id": torch.tensor([int(r["id"]) for r in rows])}
    if jpeg:
        out["image"] = decode_jpegs([bytes(r["image"]) for r in rows])
    else:
        out["label"] = torch.tensor([int(r["label"]) for r in rows])
        out["vec"] = torch.from_numpy(np.stack([np.asarray(r["vec"], dtype=np.float32) for r in rows]))
    return out


def _kept(jpeg: bool, filtered: bool, rows: list[dict]) -> dict:
    """A peer without a predicate: the collate drops the rows with ``label >= 10``."""
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
