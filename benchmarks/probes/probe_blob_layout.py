"""Probe: when does Lance's blob encoding pay for a binary column `prepare` writes?

Backs the rule in ``lance_lightning/write`` (`folders.py`, `shards.py`) and docs/getting-data-in.md:
video and audio files, and WebDataset members averaging 1 MiB or more, are stored as blobs; images
and other small files as plain ``large_binary``. For each payload size, one dataset of random bytes
is written both ways (same rows, same fragments); then, alternating the two layouts, it times a
``take`` of random rows of the whole column (``read_blobs`` for the blob layout, the way
`lance_lightning.read.blobs` reads it), a read of every row in order (an epoch without shuffle),
and, for the large payload, reading the first 256 KiB of
each row (a plain column must read the whole value; a blob is read by range through ``take_blobs``).
Then the same payloads (8 KiB to 1 MiB) through this package's loader: epoch rows/s of a
`LanceDataModule` (batch 64, 2 reader threads, no transform) with `NoShuffle` and `RowShuffle`,
which reads blob columns with ``read_blobs`` (`lance_lightning.read.blobs`). Medians of
``--reps`` repetitions (``--loader-reps`` for the loader), warm page cache, one process.

    uv run python benchmarks/probes/probe_blob_layout.py --reps 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common

#: (label, bytes per row, rows in the dataset, rows taken per call)
SIZES = [
    ("8 KiB (a small JPEG)", 8 << 10, 2_000, 64),
    ("32 KiB", 32 << 10, 1_000, 64),
    ("110 KiB (an ImageNet JPEG)", 110 << 10, 600, 64),
    ("4 MiB (a short video)", 4 << 20, 60, 20),
]
PREFIX = 256 << 10


def write(path: Path, size: int, rows: int, blob: bool) -> None:
    import lance
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    values = [rng.bytes(size) for _ in range(rows)]
    field = pa.field("payload", pa.large_binary(), metadata={"lance-encoding:blob": "true"} if blob else None)
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "payload": pa.array(values, pa.large_binary())})
    lance.write_dataset(table.cast(pa.schema([pa.field("id", pa.int64()), field])), str(path))


def take_ms(path: Path, blob: bool, indices: list[int]) -> float:
    import lance

    dataset = lance.dataset(str(path))
    start = time.perf_counter()
    if blob:
        dataset.read_blobs("payload", indices=indices, preserve_order=True)
    else:
        dataset.take(indices, columns=["payload"])
    return (time.perf_counter() - start) * 1e3


def scan_ms(path: Path, blob: bool, rows: int) -> float:
    """Every row's value, in order (an epoch without shuffle)."""
    import lance

    dataset = lance.dataset(str(path))
    start = time.perf_counter()
    if blob:
        dataset.read_blobs("payload", indices=list(range(rows)), preserve_order=True)
    else:
        dataset.to_table(columns=["payload"])
    return (time.perf_counter() - start) * 1e3


def prefix_ms(path: Path, blob: bool, indices: list[int]) -> float:
    import lance

    dataset = lance.dataset(str(path))
    start = time.perf_counter()
    if blob:
        for file in dataset.take_blobs("payload", indices=indices):
            file.read_range(0, PREFIX)
    else:
        column = dataset.take(indices, columns=["payload"]).column("payload")
        [value.as_py()[:PREFIX] for value in column]
    return (time.perf_counter() - start) * 1e3


#: (label, bytes per row, rows) of the loader measurement.
LOADER_SIZES = [
    ("8 KiB", 8 << 10, 4_000),
    ("32 KiB", 32 << 10, 2_000),
    ("110 KiB", 110 << 10, 1_000),
    ("1 MiB", 1 << 20, 200),
]


def loader_rows_per_s(path: Path, shuffle: object) -> float:
    """Rows/s of one epoch of the package's train loader over ``path``."""
    from lance_lightning import LanceDataModule, LanceSource

    module = LanceDataModule(train=LanceSource(str(path)), batch_size=64, shuffle=shuffle, reader_threads=2)
    module.setup("fit")
    start, rows = time.perf_counter(), 0
    for batch in module.train_dataloader():
        rows += len(batch["id"])
    return rows / (time.perf_counter() - start)


def loader_lines(root: str, reps: int) -> list[str]:
    from lance_lightning import NoShuffle, RowShuffle

    lines = []
    for label, size, rows in LOADER_SIZES:
        paths = {blob: Path(root) / f"loader-{size}-{blob}.lance" for blob in (False, True)}
        for blob, path in paths.items():
            write(path, size, rows, blob)
        rates: dict[tuple[str, bool], list[float]] = {}
        for rep in range(reps):
            for blob in (rep % 2 == 0, rep % 2 == 1):
                for name, shuffle in (("scan", NoShuffle()), ("row", RowShuffle(seed=rep))):
                    rates.setdefault((name, blob), []).append(loader_rows_per_s(paths[blob], shuffle))
        median = {key: statistics.median(values) for key, values in rates.items()}
        lines.append(
            f"| {label} | {rows} | {median[('scan', False)]:,.0f} | {median[('scan', True)]:,.0f} | "
            f"{median[('scan', False)] / median[('scan', True)]:.2f} | {median[('row', False)]:,.0f} | "
            f"{median[('row', True)]:,.0f} | {median[('row', False)] / median[('row', True)]:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--loader-reps", type=int, default=3)
    args = parser.parse_args()
    import random

    lines = []
    with tempfile.TemporaryDirectory(prefix="blob-layout-") as root:
        for label, size, rows, taken in SIZES:
            paths = {blob: Path(root) / f"{size}-{blob}.lance" for blob in (False, True)}
            for blob, path in paths.items():
                write(path, size, rows, blob)
            disk = {blob: sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) for blob, path in paths.items()}
            rng = random.Random(size)
            times: dict[tuple[str, bool], list[float]] = {}
            for rep in range(args.reps):
                indices = sorted(rng.sample(range(rows), taken))
                for blob in (rep % 2 == 0, rep % 2 == 1):  # alternate which layout goes first
                    times.setdefault(("take", blob), []).append(take_ms(paths[blob], blob, indices))
                    times.setdefault(("scan", blob), []).append(scan_ms(paths[blob], blob, rows))
                    if size >= 1 << 20:
                        times.setdefault(("prefix", blob), []).append(prefix_ms(paths[blob], blob, indices))
            median = {key: statistics.median(values) for key, values in times.items()}
            prefix = (
                f"{median[('prefix', False)]:,.1f} / {median[('prefix', True)]:,.1f}"
                if ("prefix", True) in median
                else "—"
            )
            lines.append(
                f"| {label} | {taken} of {rows} | {median[('take', False)]:,.1f} | {median[('take', True)]:,.1f} | "
                f"{median[('take', False)] / median[('take', True)]:.2f} | "
                f"{median[('scan', False)]:,.1f} | {median[('scan', True)]:,.1f} | "
                f"{median[('scan', False)] / median[('scan', True)]:.2f} | {prefix} | "
                f"{disk[False] / 1e6:,.1f} / {disk[True] / 1e6:,.1f} |"
            )
        loader = loader_lines(root, args.loader_reps)
    text = "\n".join(
        [
            "# Blob or plain binary for `prepare`'s large columns",
            "",
            f"{common.stamp()}. Command: `uv run python benchmarks/probes/probe_blob_layout.py --reps {args.reps} "
            f"--loader-reps {args.loader_reps}`",
            "",
            f"Machine: {common.machine()}. Load average at the end: {common.load_average()}. Random bytes, one "
            "fragment, warm page cache, medians of the repetitions (the layouts alternate which goes first).",
            "",
            "| payload | rows taken | take, plain ms | take, blob ms | plain / blob | scan all, plain ms | "
            "scan all, blob ms | plain / blob | first 256 KiB of each, plain / blob ms | on disk, plain / blob MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *lines,
            "",
            "## Through the package's loader (epoch rows/s, batch 64, 2 reader threads)",
            "",
            "| payload | rows | NoShuffle plain | NoShuffle blob | plain / blob | RowShuffle plain | RowShuffle blob | "
            "plain / blob |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *loader,
            "",
            "Reading: in the first table (milliseconds) plain / blob above 1 means the blob layout is faster; in "
            "the second (rows/s) it means plain binary is faster. Through the loader plain binary led from 8 to "
            "110 KiB and blobs at 1 MiB, so `prepare` stores video and audio, and WebDataset members averaging "
            "1 MiB or more, as blobs, and images and small files as plain binary.",
        ]
    )
    print(text)
    common.write_result(common.RESULTS_DIR / "blob_layout.md", text)


if __name__ == "__main__":
    main()
