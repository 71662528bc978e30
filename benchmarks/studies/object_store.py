"""Object-store benchmark: every strategy from a real S3-compatible server behind a latency proxy,
with the remote cache on and off, at workers 0 and 2: rows/s, requests, bytes and amplification.

Set-up: an S3 server on 127.0.0.1 (started here: ``server=moto``, the tests' server, or
``ministack``, `benchmarks.ministack_server`, whose cost per ranged GET does not grow with the object as
moto's does) holds one Lance dataset of ``rows`` rows of
about 524 bytes (``id`` int64, ``label = id % 100`` int32 with a bitmap index, ``payload`` 512
uint8) in one data file (``rows_per_file`` to split it). The 1% filters are ``id % 100 = 7``
(evaluated on the ``id`` column) and ``label = 7`` (answered by the index). Every
request goes through `tests.fault_proxy.FaultProxy` with ``latency_ms`` of added latency (20 ms
by default, a cross-zone object store's order of magnitude); the proxy counts the GET requests and
the body bytes it returns. For each configuration a fresh data module is planned (``setup``: the
copy into the cache happens here when the cache applies) and two epochs of the train loader are
read, without a trainer:

- **cold** = setup + epoch 0 (what the first epoch of a run costs, the copy included);
- **warm** = epoch 1 (the same process, the next epoch).

``amplification`` is the bytes the store sent over the bytes of the rows delivered (rows x the
rows' Arrow size): 1.0 reads every row's bytes once. An epoch stops after ``epoch_cap_s``
seconds; rows/s then counts the rows read until then (marked ``capped``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from benchmarks.harness import tables
from benchmarks.harness.study import Params
from benchmarks.ministack_server import MiniStackServer
from lance_lightning import (
    BufferShuffle,
    LanceDataModule,
    LanceSource,
    NoShuffle,
    RemoteCache,
    RowShuffle,
    ShardShuffle,
)
from tests.fault_proxy import FaultProxy
from tests.s3_server import S3Server

SERVERS = {"moto": S3Server, "ministack": MiniStackServer}

BATCH = 256
COLUMNS = ["id", "label", "payload"]
HEADS = (
    "pattern | workers | cache | read | cold rows/s | cold requests | cold MiB | cold amplification "
    "| warm rows/s | warm requests | warm MiB | x NoShuffle rows/s (cold)"
)
SPECS = "< > < < > >, >,.1f >.2f > >, >,.1f >.2f"
#: Read patterns: the name a run selects (``--set patterns=scan,row``) -> the table's label and the reading.
PATTERNS: dict[str, tuple[str, dict[str, Any]]] = {
    "scan": ("NoShuffle", {"shuffle": lambda: NoShuffle()}),
    "shard": ("ShardShuffle(4096)", {"shuffle": lambda: ShardShuffle(shard_rows=4096, seed=1)}),
    "buffer": ("BufferShuffle(8192)", {"shuffle": lambda: BufferShuffle(buffer_rows=8192, seed=1)}),
    "row": ("RowShuffle()", {"shuffle": lambda: RowShuffle(seed=1)}),
    "filter": ("1% filter (take)", {"shuffle": lambda: NoShuffle(), "filter": "id % 100 = 7"}),
    "filter-indexed": ("1% filter, indexed (take)", {"shuffle": lambda: NoShuffle(), "filter": "label = 7"}),
}


@dataclass
class Phase:
    rows: int
    seconds: float
    requests: int
    bytes: int
    capped: bool

    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def figures(self) -> tuple[str, int, float]:
        """The table's rows/s (marked when the epoch was capped), requests and MiB."""
        return f"{self.rate():,.0f}{' (capped)' if self.capped else ''}", self.requests, self.bytes / 2**20


def write_table(uri: str, rows: int, options: dict[str, str], rows_per_file: int) -> int:
    """Write the dataset, a million rows at a time; return the Arrow bytes per row of the read columns."""
    gen = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), ("label", pa.int32()), ("payload", pa.list_(pa.uint8(), 512))])

    def batches() -> Any:
        for start in range(0, rows, 1_000_000):
            ids = np.arange(start, min(rows, start + 1_000_000), dtype=np.int64)
            payload = pa.FixedSizeListArray.from_arrays(
                pa.array(gen.integers(0, 255, 512 * len(ids), dtype=np.uint8)), 512
            )
            yield pa.record_batch([pa.array(ids), pa.array((ids % 100).astype(np.int32)), payload], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    lance.write_dataset(reader, uri, storage_options=options, max_rows_per_file=rows_per_file)
    lance.dataset(uri, storage_options=options).create_scalar_index("label", "BITMAP")
    return 8 + 4 + 512


def read_epoch(loader: Any, cap_s: float) -> tuple[int, bool]:
    rows, started = 0, time.perf_counter()
    for batch in loader:
        rows += len(batch["id"])
        if time.perf_counter() - started > cap_s:
            return rows, True
    return rows, False


def measure_one(
    p: Params, uri: str, options: dict, proxy: FaultProxy, pattern: dict[str, Any], workers: int, cache: Path | None
) -> tuple[Phase, Phase, str]:
    remote_cache = RemoteCache(directory=str(cache)) if cache is not None else RemoteCache(enabled=False)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=COLUMNS, filter=pattern.get("filter"), storage_options=options),
        batch_size=BATCH,
        shuffle=pattern["shuffle"](),
        drop_last=False,
        num_workers=workers,
        remote_cache=remote_cache,
    )
    phases = []
    for epoch in range(2):
        gets, sent, started = proxy.gets, proxy.bytes_sent, time.perf_counter()
        if epoch == 0:
            dm.setup("fit")
        rows, capped = read_epoch(dm.train_dataloader(), p.epoch_cap_s)
        phases.append(Phase(rows, time.perf_counter() - started, proxy.gets - gets, proxy.bytes_sent - sent, capped))
    method = dm.plans["train"].method
    dm.teardown("fit")
    return phases[0], phases[1], method


def measure(p: Params) -> str:
    unknown = sorted(set(p.patterns) - set(PATTERNS))
    if unknown or p.server not in SERVERS:
        raise ValueError(f"patterns are {', '.join(PATTERNS)} (not {unknown}); servers {', '.join(SERVERS)}")
    lines = [
        f"{p.rows:,} rows, {p.latency_ms:g} ms per request, server: {p.server}. "
        "cold = setup (plan, and the copy when the cache applies) + epoch 0; warm = epoch 1. "
        "amplification = bytes sent by the store / bytes of the rows delivered.",
        "",
    ]
    rows: list[tuple] = []
    with SERVERS[p.server].serving("bench") as s3, FaultProxy.serving(s3.endpoint, p.latency_ms / 1e3) as proxy:
        options = {**s3.storage_options(), "aws_endpoint": proxy.endpoint}
        uri = "s3://bench/table.lance"
        row_bytes = write_table(uri, p.rows, s3.storage_options(), p.rows_per_file or p.rows)
        baseline: dict[int, float] = {}
        with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
            for key in p.patterns:
                name, pattern = PATTERNS[key]
                for workers in p.workers:
                    for cached in (mode == "on" for mode in p.cache_modes):
                        cache = Path(tmp) / f"{name}-{workers}" if cached else None
                        cold, warm, method = measure_one(p, uri, options, proxy, pattern, workers, cache)
                        if name == "NoShuffle" and workers not in baseline:  # a scan: the cache never applies
                            baseline[workers] = cold.rate()
                        amplification = cold.bytes / max(1, cold.rows * row_bytes)
                        against_scan = cold.rate() / baseline.get(workers, cold.rate())
                        cells = (*cold.figures(), amplification, *warm.figures(), against_scan)
                        rows.append((name, workers, "on" if cached else "off", method, *cells))
                        print(tables.table(HEADS, SPECS, rows[-1:])[-1], flush=True)
    lines += tables.table(HEADS, SPECS, rows)
    return "\n".join(lines)
