"""How long a training read keeps retrying an object store that fails, with the default settings.

Not a speed benchmark (`python -m benchmarks all` does not run it): it measures the bound the retry guide in
docs/object-stores.md states, on a real S3 server (moto) on loopback, with the default
`RetryPolicy` and Lance's default client timeouts:

- ``gone``: the server is killed (connections refused) and stays gone: seconds until
  `DataReadError`.
- ``stalled``: the server is frozen with SIGSTOP (connections accepted, never answered) and stays
  frozen: seconds until `DataReadError`.
- ``outage``: the server is frozen for ``--outage-s`` seconds, then resumed: whether the read
  finishes with the right rows, and in how long.

Usage: ``uv run python benchmarks/probes/probe_retry_bound.py [--cases gone,stalled,outage] [--outage-s 60]``
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import lance  # noqa: E402
import numpy as np  # noqa: E402

from lance_lightning import LanceSource  # noqa: E402
from lance_lightning.errors import DataReadError  # noqa: E402
from lance_lightning.read.lance_io import read_ranges  # noqa: E402
from lance_lightning.read.retry import DEFAULT_POLICY  # noqa: E402
from lance_lightning.source import pin_source  # noqa: E402
from tests.helpers import make_table  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

ROWS = 4000


def _probe(case: str, outage_s: float) -> str:
    with S3Server.serving("data") as server:
        uri = f"s3://data/{case}.lance"
        lance.write_dataset(make_table(ROWS), uri, storage_options=server.storage_options(), max_rows_per_file=500)
        pinned = pin_source(LanceSource(uri, columns=["id"], storage_options=server.storage_options()), "train")
        read_ranges(pinned, [(0, 10)])  # the read handle is open and warm
        pid = server.pid
        if case == "gone":
            server._process.kill()
            server._process.wait()
        else:
            os.kill(pid, signal.SIGSTOP)
        if case == "outage":
            threading.Timer(outage_s, os.kill, (pid, signal.SIGCONT)).start()
        started = time.monotonic()
        try:
            table = read_ranges(pinned, [(1000, 2000)])
            ok = table.column("id").to_numpy().tolist() == list(np.arange(1000, 3000))
            outcome = f"read {table.num_rows} rows ({'right' if ok else 'WRONG'} rows)"
        except DataReadError as error:
            outcome = f"DataReadError after {error.attempts} attempt(s)"
        finally:
            if case == "stalled":
                os.kill(pid, signal.SIGCONT)
        return f"{case:8} {time.monotonic() - started:7.1f} s  {outcome}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gone,stalled,outage")
    parser.add_argument("--outage-s", type=float, default=60.0)
    args = parser.parse_args()
    policy = DEFAULT_POLICY
    print(
        f"RetryPolicy: attempts={policy.attempts}, backoff {policy.initial_backoff_s}..{policy.max_backoff_s} s, "
        f"deadline_s={policy.deadline_s}; Lance client defaults (timeout 30 s per request)"
    )
    for case in args.cases.split(","):
        print(_probe(case, args.outage_s), flush=True)


if __name__ == "__main__":
    main()
