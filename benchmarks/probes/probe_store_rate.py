"""How many ranged GETs per second the benchmark's S3 server (moto on loopback) answers.

Not a loader benchmark (`python -m benchmarks all` does not run it): it measures the ceiling that
``bench_object_store.py`` runs under. For objects of each ``--sizes-mib``, ``--requests`` GETs of
512 bytes at 4 KiB strides (a sparse take's pattern) are sent by ``--threads`` concurrent boto3
clients, straight to the server (no latency proxy). moto reads the whole object for every ranged
GET, so its rate falls with the object's size and does not rise with concurrency: a read pattern
that needs N requests from a file of that size takes at least N / rate seconds there, whatever
the loader does. A cloud object store serves such requests concurrently.

It also times one Lance ``take`` of 100 rows 100 apart (a 1% selection of a 20,000-row, 10 MiB
file, read through a handle with ``block_size=4096``: one GET per row) through the latency proxy
at 200 ms per request: sent one at a time they would take at least 20 s.

Usage: ``uv run python benchmarks/probes/probe_store_rate.py [--sizes-mib 5 49] [--threads 1 32]``
Writes ``benchmarks/results/store_rate.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import boto3  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks import common
from tests.fault_proxy import FaultProxy  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

SPARSE_ROWS, SPARSE_DELAY_S = 20_000, 0.2


def rate(client: object, key: str, requests: int, threads: int) -> float:
    """Ranged GETs per second of ``requests`` 512-byte ranges of ``key`` over ``threads`` clients."""

    def get(i: int) -> int:
        answer = client.get_object(Bucket="bench", Key=key, Range=f"bytes={i * 4096}-{i * 4096 + 511}")
        return len(answer["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        assert sum(pool.map(get, range(requests))) == 512 * requests
    return requests / (time.perf_counter() - started)


def sparse_take(s3: S3Server) -> tuple[int, float]:
    """(GETs, seconds) of one Lance take of 100 rows 100 apart, each GET delayed `SPARSE_DELAY_S`."""
    uri = "s3://bench/sparse.lance"
    payload = np.random.default_rng(0).integers(0, 255, 512 * SPARSE_ROWS, dtype=np.uint8)
    table = pa.table({"payload": pa.FixedSizeListArray.from_arrays(pa.array(payload), 512)})
    lance.write_dataset(table, uri, storage_options=s3.storage_options())
    with FaultProxy.serving(s3.endpoint, SPARSE_DELAY_S) as proxy:
        options = {**s3.storage_options(), "aws_endpoint": proxy.endpoint, "block_size": "4096"}
        dataset = lance.dataset(uri, storage_options=options)
        dataset.take([0], columns=["payload"])  # metadata first
        gets, started = proxy.gets, time.perf_counter()
        dataset.take(np.arange(7, SPARSE_ROWS, 100)[:100], columns=["payload"])
        return proxy.gets - gets, time.perf_counter() - started


def main(args: argparse.Namespace) -> None:
    lines = [
        "# The benchmark server's ceiling: ranged GETs per second (moto on loopback)",
        "",
        f"Command: `{common.command_line()}`  ",
        f"Machine: {common.machine()}  ",
        f"{args.requests} GETs of 512-byte ranges 4 KiB apart, straight to the server (no latency proxy).",
        "",
        "| object | concurrent clients | ranged GETs/s |",
        "|---:|---:|---:|",
    ]
    with S3Server.serving("bench") as s3:
        options = s3.storage_options()
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint,
            aws_access_key_id=options["aws_access_key_id"],
            aws_secret_access_key=options["aws_secret_access_key"],
            region_name="us-east-1",
        )
        for size in args.sizes_mib:
            key = f"object-{size}"
            client.put_object(Bucket="bench", Key=key, Body=np.random.default_rng(0).bytes(size << 20))
            for threads in args.threads:
                lines.append(f"| {size} MiB | {threads} | {rate(client, key, args.requests, threads):,.0f} |")
                print(lines[-1], flush=True)
        gets, seconds = sparse_take(s3)
    lines += [
        "",
        f"One Lance take of 100 rows 100 apart through the proxy at {SPARSE_DELAY_S * 1000:.0f} ms per request: "
        f"{gets} GETs in {seconds:.2f} s (at least {gets * SPARSE_DELAY_S:.0f} s if sent one at a time).",
    ]
    print(lines[-1])
    common.write_result(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[5, 49])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR / "store_rate.md")
    main(parser.parse_args())
