"""Probe: which of the installed Lance's ways to store a binary column `prepare` should use, and from
which value size (issue #52).

Three encodings of one ``large_binary`` column of random values, with an ``id`` column beside it:
``inline`` (plain large_binary, file format 2.2), ``blob-v2`` (``lance-encoding:blob`` metadata on
format 2.2: this pylance stores it as the ``lance.blob.v2`` extension type, values in blob files
beside the data file) and ``blob-v1`` (the same metadata on format 2.1: the older blob encoding, values
inside the data file). For each value size (4 KiB, 64 KiB, 1 MiB; about 48 MiB of values each) it
times, medians of ``--reps`` alternating repetitions in one process with a warm page cache:
- write: ``lance.write_dataset`` of the table (values already in memory);
- scan other: a scan of the ``id`` column alone (an epoch that filters or counts);
- take: 64 random rows' values (``read_blobs`` for blobs, ``take`` for inline);
- range: the first 16 KiB of 16 random rows (``take_blobs`` + ``read`` for blobs; inline must
  take whole values).

    uv run python benchmarks/probes/probe_blob_encoding.py --reps 5 --out benchmarks/results/blob_encoding.md
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

SIZES = [("4 KiB", 4 << 10), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20)]
TOTAL = 48 << 20
ENCODINGS = ("inline", "blob-v1", "blob-v2")
RANGE = 16 << 10


def table(size: int):  # noqa: ANN201
    import numpy as np
    import pyarrow as pa

    rows = max(16, TOTAL // size)
    data = np.random.default_rng(0).integers(0, 256, rows * size, dtype=np.uint8).tobytes()
    values = pa.array([data[i * size : (i + 1) * size] for i in range(rows)], pa.large_binary())
    return pa.table({"id": pa.array(range(rows), pa.int64()), "value": values})


def write(path: Path, data, encoding: str):  # noqa: ANN001, ANN201
    import lance
    import pyarrow as pa

    metadata = None if encoding == "inline" else {"lance-encoding:blob": "true"}
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.large_binary(), metadata=metadata)])
    version = "2.1" if encoding == "blob-v1" else "2.2"
    return lance.write_dataset(
        data.cast(schema), str(path), schema=schema, data_storage_version=version, mode="overwrite"
    )


def timed(fn) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def measure(ds, encoding: str, rows: int, rng: random.Random) -> dict[str, float]:  # noqa: ANN001
    take = sorted(rng.sample(range(rows), min(64, rows)))
    few = sorted(rng.sample(range(rows), min(16, rows)))
    out = {"scan other": timed(lambda: ds.to_table(columns=["id"]))}
    if encoding == "inline":
        out["take"] = timed(lambda: ds.take(take, columns=["value"]))
        out["range"] = timed(lambda: [v.as_py()[:RANGE] for v in ds.take(few, columns=["value"])["value"]])
    else:
        out["take"] = timed(lambda: ds.read_blobs("value", indices=take))
        out["range"] = timed(lambda: [f.read(RANGE) for f in ds.take_blobs("value", indices=few)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import lance

    lines = [
        f"pylance {lance.__version__}; medians of {args.reps} alternating repetitions, ms; ~48 MiB of values per size",
        "",
        "| value size | encoding | stored as | write | scan other column | take 64 values | first 16 KiB of 16 |",
        "|---|---|---|---|---|---|---|",
    ]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in SIZES:
            data = table(size)
            times: dict[str, dict[str, list[float]]] = {e: {} for e in ENCODINGS}
            stored: dict[str, str] = {}
            for _ in range(args.reps):
                for encoding in ENCODINGS:
                    path = Path(tmp) / f"{size}-{encoding}.lance"
                    start = time.perf_counter()
                    ds = write(path, data, encoding)
                    times[encoding].setdefault("write", []).append((time.perf_counter() - start) * 1000)
                    stored[encoding] = str(ds.schema.field("value").type)
                    for key, ms in measure(ds, encoding, data.num_rows, rng).items():
                        times[encoding].setdefault(key, []).append(ms)
            for encoding in ENCODINGS:
                med = {k: statistics.median(v) for k, v in times[encoding].items()}
                lines.append(
                    f"| {label} | {encoding} | `{stored[encoding]}` | {med['write']:.1f} | {med['scan other']:.2f} "
                    f"| {med['take']:.2f} | {med['range']:.2f} |"
                )
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
