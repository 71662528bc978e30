"""The peer side of the ``prepare`` study: one conversion of an image folder by LitData or Mosaic
Streaming, then the time to the first training batch through that peer's own loader.

It runs in the peers' own environment (not the project's: `benchmarks.harness.runner.ensure_peers`
makes it with ``uv venv`` + ``uv pip install``), one conversion
per fresh process, and prints one JSON object on its last line of stdout:
``{"seconds", "rows", "first_batch_s", "batch_rows", "versions"}``. Imports happen before any
timing; the folder's file list is read before the conversion's clock starts (each side gets the
same list of ``(path, label)`` pairs).

    python -m benchmarks.studies.prepare_peers {litdata,mds,mds-parallel} INPUT_DIR OUTPUT_DIR [--batch-size B] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def list_folder(root: Path) -> list[tuple[str, int]]:
    """``(path, label)`` for every file of ``root/<class>/``, classes and files sorted."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f), label) for label, c in enumerate(classes) for f in sorted((root / c).iterdir())]


def read_item(item: tuple[str, int]) -> dict:
    """One sample: the file's bytes (not decoded) and its label."""
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def convert_litdata(items: list[tuple[str, int]], out: Path, workers: int) -> None:
    from litdata import optimize

    optimize(
        fn=read_item,
        inputs=items,
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=workers,
        verbose=False,
    )


def collate(samples: list[dict]) -> dict:
    """A batch as both peers would hand it to a training step without decoding: the images' bytes as
    a list (LitData yields memoryviews of its chunk, which PyTorch's default collate rejects for
    unequal lengths) and the labels as a tensor."""
    import torch

    return {"image": [s["image"] for s in samples], "label": torch.tensor([s["label"] for s in samples])}


def first_batch_litdata(out: Path, batch_size: int) -> int:
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(input_dir=str(out), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=batch_size, num_workers=0, collate_fn=collate)
    batch = next(iter(loader))
    return len(batch["label"])


MDS_COLUMNS = {"image": "bytes", "label": "int"}


def _write_mds(items: list[tuple[str, int]], out: str) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=out, columns=MDS_COLUMNS, size_limit=64 << 20) as writer:
        for item in items:
            writer.write(read_item(item))


def convert_mds(items: list[tuple[str, int]], out: Path, workers: int) -> None:
    _write_mds(items, str(out))


def convert_mds_parallel(items: list[tuple[str, int]], out: Path, workers: int) -> None:
    """Mosaic's documented parallel form: one MDSWriter per process into ``out/<i>``, then
    ``merge_index`` writes the root index."""
    import multiprocessing as mp

    from streaming.base.util import merge_index

    step = -(-len(items) // workers)
    jobs = [(items[i * step : (i + 1) * step], str(out / str(i))) for i in range(workers)]
    with mp.get_context("fork").Pool(workers) as pool:
        pool.starmap(_write_mds, jobs)
    merge_index(str(out), keep_local=True)


def first_batch_mds(out: Path, batch_size: int) -> int:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=str(out), shuffle=True, batch_size=batch_size)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=0, collate_fn=collate)
    batch = next(iter(loader))
    return len(batch["label"])


CONVERT = {"litdata": convert_litdata, "mds": convert_mds, "mds-parallel": convert_mds_parallel}
FIRST = {"litdata": first_batch_litdata, "mds": first_batch_mds, "mds-parallel": first_batch_mds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", choices=sorted(CONVERT))
    ap.add_argument("input", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import litdata
    import PIL
    import streaming
    import torch
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    items = list_folder(args.input)
    started = time.perf_counter()
    CONVERT[args.peer](items, args.output, args.workers)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    batch_rows = FIRST[args.peer](args.output, args.batch_size)
    first = time.perf_counter() - started
    versions = {
        "litdata": litdata.__version__,
        "mosaicml-streaming": streaming.__version__,
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "python": sys.version.split()[0],
    }
    sys.stdout.flush()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rows": len(items),
                "first_batch_s": first,
                "batch_rows": batch_rows,
                "versions": versions,
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main()
