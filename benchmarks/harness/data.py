"""The tables cells read, written once under the cache folder, and what a cell needs to check itself.

Guarantees:
- `prepare` (in the project's environment) returns, for one cell, its table's URI and, for a peer
  that reads its own format, that format of the same rows (LitData's ``optimize`` chunks, MosaicML's
  MDS shards), each written once in the peers' environment by ``python -m benchmarks.harness.data``;
  with the rows an epoch must deliver (``expected``) and a perfect shuffle's batch entropy on
  those rows (``perfect``), against which a cell's shuffle quality is scored.
- Tables: ``vec_<rows>.lance`` (``id`` int64, ``label`` int32 uniform 0..99, ``vec`` 128 x float32,
  one plain ``lance.write_dataset``: what every peer can open) and ``images_<rows>.lance``
  (`benchmarks.common.image_dataset`'s 64x64 JPEGs), under ``<cache>/lancedb/`` (LanceDB opens a
  folder of tables); the scale table ``<cache>/scale/x_<rows>.lance`` (`benchmarks.common.scale_dataset`:
  one int64 column ``x = row``). A table's first column is its row key (``id``, ``x``).
- Imports nothing but the standard library at module level (the peers' environment runs it).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.registry import WORKLOADS, Cell

BATCH = 256
CLASSES = 100
ROOT = Path(__file__).resolve().parents[2]
_PREPARED: dict[tuple, dict] = {}  # (table, rows, filter, loader's format): prepare's answer, once a run


def entropy_bits(classes: Any) -> float:
    import numpy as np

    counts = np.bincount(classes, minlength=CLASSES)
    p = counts[counts > 0] / len(classes)
    return float(-(p * np.log2(p)).sum())


def vec_table(cache: Path, rows: int) -> str:
    return plain_vec_table(cache / "lancedb" / f"vec_{rows}.lance", rows)


def plain_vec_table(path: Path, rows: int, seed: int = 0, index: str | None = None) -> str:
    """``rows`` rows of ``id``, ``label`` (uniform 0..99) and ``vec`` (128 float32) drawn from ``seed``,
    in one plain ``lance.write_dataset``, with a scalar ``index`` on ``label`` if given; written once."""
    import lance
    import numpy as np
    import pyarrow as pa

    from benchmarks import common

    if common.table_ready(path, rows, "label" if index else None):
        return str(path)
    rng = np.random.default_rng(seed)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 128, dtype=np.float32)), 128)
    ids = pa.array(np.arange(rows, dtype=np.int64))
    table = pa.table({"id": ids, "label": pa.array(rng.integers(0, 100, rows, dtype=np.int32)), "vec": vec})
    ds = lance.write_dataset(table, str(path), mode="overwrite")
    if index is not None:
        ds.create_scalar_index("label", index)
    return str(path)


def image_table(cache: Path, rows: int) -> str:
    from benchmarks import common

    path = cache / "lancedb" / f"images_{rows}.lance"
    if not path.exists():
        source = common.image_dataset(cache, rows, log=lambda _: None)
        os.makedirs(path.parent, exist_ok=True)
        os.symlink(source, path)
    return str(path)


def prepare(cell: Cell, cache: Path, peer_python: Path | None) -> dict:
    """What the cell's process needs: URIs, the expected rows, a perfect shuffle's entropy."""
    import lance
    import numpy as np

    workload = WORKLOADS[cell.workload]
    rows = cell.rows
    fmt_of = {"litdata": "litdata", "mosaic": "mds"}
    key = (workload.table, rows, workload.filter, fmt_of.get(cell.loader))
    if key in _PREPARED:
        return _PREPARED[key]
    if workload.table == "x":
        from benchmarks import common

        uri = common.scale_dataset(cache / "scale", rows)
    else:
        uri = (image_table if workload.table == "images" else vec_table)(cache, rows)
    data: dict[str, Any] = {"uri": uri, "table_rows": rows}
    fmt = fmt_of.get(cell.loader)
    if fmt is not None:
        out = cache / fmt / Path(uri).stem
        if not (out / "index.json").exists():
            cmd = [str(peer_python), "-m", "benchmarks.harness.data", fmt, uri, str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"{fmt} conversion of {uri} failed:\n{done.stderr[-3000:]}")
        data[fmt] = str(out)
    ids = np.arange(rows)
    if workload.filter is not None:
        key = workload.columns[0]
        ids = lance.dataset(uri).to_table(columns=[key], filter=workload.filter).column(key).to_numpy()
    data["expected"] = len(ids)
    rng = np.random.default_rng(1)
    scores = []
    for _ in range(4):
        perm = rng.permutation(ids)
        scores += [entropy_bits(perm[i : i + BATCH] * CLASSES // rows) for i in range(0, len(perm) - BATCH + 1, BATCH)]
    data["perfect"] = statistics.fmean(scores) if scores else float("nan")
    _PREPARED[key] = data
    return data


def _rows(item: tuple[str, int, int]) -> Any:
    import lance
    import numpy as np

    uri, start, stop = item
    for row in lance.dataset(uri).take(list(range(start, stop))).to_pylist():
        if "vec" in row:
            row["vec"] = np.asarray(row["vec"], dtype=np.float32)
        yield row


def convert(fmt: str, uri: str, out: Path) -> None:
    """In the peers' environment: LitData's or MosaicML's format of a Lance table, written once."""
    import lance

    rows = lance.dataset(uri).count_rows()
    ranges = [(uri, s, min(rows, s + 2048)) for s in range(0, rows, 2048)]
    if fmt == "litdata" and not (out / "index.json").exists():
        from litdata import optimize

        optimize(fn=_rows, inputs=ranges, output_dir=str(out), chunk_bytes="64MB", num_workers=2, verbose=False)
    elif fmt == "mds" and not (out / "index.json").exists():
        from streaming import MDSWriter

        images = "image" in lance.dataset(uri).schema.names
        columns = {"id": "int64", "label": "int32", **({"image": "bytes"} if images else {"vec": "ndarray:float32"})}
        with MDSWriter(out=str(out), columns=columns, size_limit="64mb") as writer:
            for item in ranges:
                for row in _rows(item):
                    writer.write(row)


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
