"""The benchmark harness and its studies write every result table one way
(`benchmarks.harness.tables.table`), and each table still reads as the result files of record do:
rendered here from fixed figures, its lines are exactly those the studies' own string building
wrote for the same figures before the tables moved there (`EXPECTED`, taken from that code), so a
result file made again has the same columns, alignment and number formats, and the docs that quote
them stay true. No measurement runs: each study's table function gets its figures directly."""

# ruff: noqa: E501 - `EXPECTED` holds whole table lines, as wide as the result files' tables

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.harness import tables

NAN = float("nan")


def _params(**values: Any) -> Any:
    from benchmarks.harness.study import Params

    return Params(values, False, Path("/nowhere"), Path("/nowhere/out.md"))


def _table_lines(text: str | list[str]) -> list[str]:
    lines = text.splitlines() if isinstance(text, str) else text
    return [line for line in lines if line.startswith("|")]


# -- each study's tables, from fixed figures ----------------------------------------------------------
def harness_report() -> list[str]:
    from benchmarks.harness import report

    def rep(rows_per_s: float, **more: Any) -> dict:
        figures = {"rows": 3000, "rows_per_s": rows_per_s, "first_batch_s": 0.01234, "again_s": None}
        figures |= {"build_s": 0.5, "quality": 0.987, "read_bytes": 3 * 2**20, "read_calls": 45, "rss_mb": 1234.4}
        return figures | {"epochs": 2, "check": "exact"} | more

    resumed = {"resume10_s": 0.0123, "resume90_s": 0.0135}
    results = {
        "scan/ours/3k/2/local": [rep(123456.7, **resumed), rep(120000.2, **resumed)],
        "scan/lance.torch/3k/2/local": [rep(50000.0, cpu_s=0.6), rep(60000.0, cpu_s=0.9, rows=6000)],
        "scan/litdata/3k/2/local": [{"error": "no litdata"}],
        "shuffle/ours/3k/0/local": [rep(9876.5, rows=0, check="—")],
    }
    cells = [c.split("/") for c in results]
    raw = {"results": results, "cells": cells, "suite": None, "selector": "scan,shuffle", "stamp": "now"}
    raw |= {"seconds": 1.0, "command": "cmd", "machine": "m", "load_average": "1, 1, 1", "reps": 2}
    return report.render(raw | {"seconds_per_cell": 0.3}).splitlines()


def common_rows() -> list[str]:
    from benchmarks import common

    rows = [
        common.Row("epoch, RowShuffle", 1234567.8, "raw scan", 2345678.9, 0.526, 0.5, "a note"),
        common.Row("first batch", 99.5, "lance.torch", 100.4, 0.991, None),
        common.Row("filter 10%", 5000.0, "lance.torch", 1000.0, 5.0, 1.25),
    ]
    return common.markdown_table(rows).splitlines()


def filter_scan() -> list[str]:
    from benchmarks.studies.filter_scan import Cell, table

    cells = [
        Cell("none", "label < 1", "1%", "scan", (1234567.4, 654321.6, 1.887), 1.456, (1000.4, 900.6, 1.111)),
        Cell("BITMAP", "label < 50", "50%", "take", (100.0, 200.0, 0.5), 0.25, (10.0, 20.0, 0.5)),
    ]
    cells[0].first, cells[0].io = (0.01234, 0.00567, 2.176), ((1234, 56.7), (7, 0.4))
    cells[1].first, cells[1].io = (0.001, 0.002, 0.5), ((1, 0.0), (2, 1.5))
    return table(cells).splitlines()


def gpu() -> list[str]:
    import torch

    from benchmarks.studies import gpu_report

    decode = [
        {"side": 64, "cpu": 12345.6, "cores": 2, "torchcodec": 23456.7, "torchvision": None},
        {"side": 256, "cpu": 1000.0, "cores": 2, "torchcodec": 900.0, "torchvision": 1500.4},
    ]
    step = {"step_ms": 50.04, "wait_share": 0.01234, "steps": 40}
    variant = {"step_ms": 60.0, "wait_share": 0.3, "steps": 30, "cpu_share": 0.0, "priority": 0, "name": "fast"}
    fit = {"ready": {"step_ms": 48.0, "wait_share": 0.0, "steps": 40}, "batch": 256, "size": 224, "read": 5000.0}
    fit |= {"lance": step, "in_hooks": step | {"step_ms": 52.9}, "variants": [variant]}
    args = _params(reps=1)
    return gpu_report.report(args, torch.device("cpu"), decode, fit, None, None, 1.0).splitlines()


def materialize() -> list[str]:
    from benchmarks.studies.materialize import Pattern, Run, report

    pattern = Pattern("NoShuffle (scan)", [Run(1.234, 2.0, [3.456, 2.5]), Run(1.3, 2.1, [3.0, 2.6])])
    pattern.view = [Run(0.5, 2.0, [0.9, 0.8]), Run(0.6, 2.2, [1.0, 0.7])]
    slow = Pattern("RowShuffle(clump_rows=64) (take)", [Run(1.0, 1.0, [1.0, 1.0])], [Run(9.0, 1.0, [1.0, 1.0])])
    return report([pattern, slow], _params(epochs=3, reps=2), 5000).splitlines()


def memory() -> list[str]:
    from benchmarks.studies.memory import report

    mb = 2**20
    runs = {
        0: SimpleNamespace(rows=[(1, 500 * mb, 400 * mb, 3.21), (2, 510 * mb, 450 * mb, 2.0), (3, 505 * mb, 0, 2.05)]),
        2: SimpleNamespace(rows=[(1, 900 * mb, 800 * mb, 5.0), (2, 1000 * mb, 990 * mb, 4.0), (3, 1100 * mb, 1, 4.0)]),
    }
    p = _params(epochs=3, rows=600, batch_size=64, interval=0.05)
    return report(runs, p, "uri", "psutil", 120.5).splitlines()


def object_store() -> list[str]:
    from benchmarks.studies.object_store import HEADS, SPECS, Phase

    cold, warm = Phase(1000, 0.5, 1234, 3 * 2**20, True), Phase(1000, 0.25, 12, 1536 * 2**20, False)
    row = ("RowShuffle()", 2, "on", "take", *cold.figures(), 1.2345, *warm.figures(), 0.5)
    return tables.table(
        HEADS, SPECS, [row, ("NoShuffle", 0, "off", "scan", *warm.figures(), 1.0, *cold.figures(), 1.0)]
    )


def packing() -> list[str]:
    from benchmarks.studies.packing import report

    row = {"documents": 10_000_000, "lengths": True, "shuffle": "RowShuffle", "tokens": 12_345_678_901}
    row |= {"windows": 6_000_000, "setup_s": 1.234, "index_bytes_per_doc": 8.04, "setup_peak_numpy_mb": 80.4}
    row |= {"peak_rss_mb": 512.6, "windows_per_s": 1234.5, "tokens_per_s": 2_345_678.9}
    unread = {k: v for k, v in row.items() if k not in ("windows_per_s", "tokens_per_s")} | {"lengths": False}
    shares = {"NoShuffle()": 1.0, "RowShuffle(seed=0)": 0.00123}
    return report([row, unread], shares, _params(max_len=512, seq_len=1024, batch_size=8, batches=20)).splitlines()


def planning() -> list[str]:
    from benchmarks.studies.planning import _report

    def run(n: int, outcome: str, scale: float) -> list[dict]:
        one = {"setup_s": 0.5 * scale, "first_batch_s": 0.75 * scale, "planning_cpu_s": 0.123 * scale}
        return [one | {"planning_bytes": 1_234_567 * scale, "outcome": outcome} for _ in range(n)]

    runs = {("off", 1): [run(1, "off", 1.0)], ("off", 4): [run(4, "off", 1.1)]}
    runs |= {("on", 1): [run(1, "computed", 1.0)], ("on", 4): [run(1, "computed", 1.0) + run(3, "loaded", 0.1)]}
    return _report(_params(processes=4, reps=1), 100_000, runs, ["1 1 1"]).splitlines()


def prepare() -> list[str]:
    from benchmarks.studies.prepare import SIDES, render

    def rep(rate: float) -> dict:
        return {"rows_per_s": rate, "seconds": 10_000 / rate, "bytes": 12_345_678 * 1.1, "first_batch_s": 0.0456}

    versions = {"litdata": "1", "mosaicml-streaming": "2", "torch": "3", "pillow": "4"}
    results = {side: [rep(1000.0 * (i + 1)), rep(1100.0 * (i + 1))] for i, side in enumerate(SIDES)}
    results["litdata"][0]["versions"] = versions
    raw = {"results": results, "images": 10_000, "input_bytes": 12_345_678, "loads": [1.0, 2.0], "reps": 2}
    raw |= {"classes": 10, "per_class": 1000, "batch_size": 256, "peer_env": "env"}
    return render(raw).splitlines()


def resume() -> list[str]:
    from benchmarks.studies.resume import report

    timings = {"fresh": [1.2344, 1.5, 1.0], 0.1: [0.25, 0.3, 0.2], 0.9: [0.26, 0.31, 0.19]}
    result = {"shuffle": "ShardShuffle(seed=0)", "targets": {0.1: [3, 4], 0.9: [27, 28]}, "timings": timings}
    result |= {"ratio": 1.04, "paired": 0.9876, "state_bytes": 321, "epoch_s": 12.34, "state": {"a": 1}}
    p = _params(
        rows=20_000, filter=None, batch_size=1024, workers=0, reps=3, steps_per_position=2, positions=[0.1, 0.9]
    )
    return report(p, "uri", [result, result | {"shuffle": "RowShuffle(seed=0)", "ratio": 1.5}]).splitlines()


def startup() -> list[str]:
    from benchmarks.studies.startup import table

    times = {"python -c 'import lance'": [0.5, 0.6, 0.55], "lance-lightning --help": [0.6, 0.7, 0.65]}
    times |= {"lance-lightning fit --help": [3.0, 3.1, 3.2], "uv run python -c pass": [0.1, 0.1, 0.1]}
    ratios = {"lance-lightning --help": [1.2, 1.1667, 1.3], "lance-lightning fit --help": [6.0, 5.9, 6.1]}
    return table(times, ratios | {"uv run python -c pass": [0.2, 0.2, 0.2]})


def transforms() -> list[str]:
    from benchmarks.studies.transforms import table

    scaling = {"kept": 3, "tried": 4, "two": 2345.6, "one": 1300.1, "ratio": 1.8, "others": 0.0123}
    plain = {"threads": 2, "workers0": {"ours": 5000.0, "plain": 1000.0, "ratio": 5.0, "others": 0.2}}
    plain["workers2"] = {"ours": 5000.0, "plain": 6000.0, "ratio": 0.83, "others": 0.0}
    lap = {
        f"{k}/{d}": {"wait_ms": 1.234, "fraction": 0.01, "step_ms": 12.3, "others": 0.05}
        for k in ("sleep", "matmul")
        for d in (0, 2)
    }
    mib = 2**20
    mem = {d: {"peaks": [500 * mib, 400 * mib, 410 * mib], "idle": 100 * mib, "bound": 50 * mib} for d in (2, 16)}
    return table(scaling, plain, lap, mem)[0].splitlines()


def decode_backends() -> list[str]:
    from benchmarks.studies.transforms_backends import table

    quiet = {"side": 64, "threads": 2, "torchcodec": 12345.6, "torchvision": 12000.4, "ratio": 1.0288}
    return table(
        [
            quiet | {"quiet": 3, "tried": 5, "others": 0.0123},
            quiet | {"threads": "1, CPU time", "ratio": 0.9, "quiet": None, "tried": 5, "others": None},
        ]
    )


def tuning() -> list[str]:
    from benchmarks.studies.tuning import markdown
    from benchmarks.studies.tuning_harness import Figure

    t = SimpleNamespace(figures=[Figure(1, "clumps", "1,234 rows/s", "no clumps", "999 rows/s", "1.24")])
    return markdown(t).splitlines()


def video() -> list[str]:
    import numpy as np

    from benchmarks.studies import video_tables as vt
    from benchmarks.studies.video_bytes import ClipCost, DecodeSplit, S3Rows
    from benchmarks.studies.video_data import ARGS, LANCE_READ_AHEAD, Data, VideoSet
    from benchmarks.studies.video_readers import Phase
    from benchmarks.studies.video_speed import MemoryRun, Speed

    data = Data(VideoSet("short", 8, 48, 12, 4), [], "", np.array([100_000.0, 120_000.0]), [])
    saved = dict(vars(ARGS))
    ARGS.workers, ARGS.frames, ARGS.sets = [0, 2], 16, [data]
    try:
        speed = Speed()
        for workers in (0, 2):
            for kind in ("lance", "whole", "files"):
                key = ("short", workers, kind)
                speed.rates[key], speed.ratios[key] = [12.34, 15.0], [1.0, 0.876]
                speed.per_clip[key], speed.first[key] = (40_000.0, 3.5), Phase(10, 2.0, 400_000.0, 35.0)
        speed.stages[("short", 0, "lance")] = [(1.23, 4.56), (1.5, 5.0)]
        cost = ClipCost(1.0, 2.34, 5000.0, 2.0, 60_000.0, 7.0, 12.3, 4.56, 50_000.0, 20_000.0, 1.0, 3.4, 0.5, NAN)
        s3 = S3Rows({("short", w): (Phase(5, 1.0, 1e6, 50.0), Phase(5, 0.5, 5e5, 25.0)) for w in (0, 2)})
        s3.whole[("short", 0)] = (Phase(5, 2.0, 2e6, 10.0),)
        s3.costs["short"] = [(LANCE_READ_AHEAD, cost)]
        splits = {"short": DecodeSplit(12.34, 5.67, 8.9, 7.8, 13.0)}
        memory = [MemoryRun("long", 2, 24, [500.4, 510.6, 512.0], None, 99.6), MemoryRun("short", 0, 8, [400.0], 3, 5)]
        return [
            *vt.bytes_table([data], speed, s3),
            *vt.costs_table([data], {"short": [(0, cost)]}, s3),
            *vt.split_table(splits),
            *vt.speed_table([data], speed, "files"),
            *vt.memory_table(memory),
        ]
    finally:
        vars(ARGS).clear()
        vars(ARGS).update(saved)


CASES = {
    f.__name__: f
    for f in (
        harness_report,
        common_rows,
        filter_scan,
        gpu,
        materialize,
        memory,
        object_store,
        packing,
        planning,
        prepare,
        resume,
        startup,
        transforms,
        decode_backends,
        tuning,
        video,
    )
}

EXPECTED: dict[str, str] = {
    # Changes from the old code: a row that did not run writes its empty cells `|  |`, as every
    # other empty cell (it wrote `| |` there); markdown reads both the same. The per-1k-rows
    # figures are medians of each repetition's own ratio (they divided the median by the first
    # repetition's rows), and CPU ms / 1k rows is new (blank for results recorded without it).
    "harness_report": """
| cell | workload | loader | rows/s | vs best peer | first batch s | again s | build s | shuffle quality | CPU ms / 1k rows | MiB read / 1k rows | reads / 1k rows | RSS MiB | epochs | first epoch | resume 10% s | resume 90% s | 90%/10% | RSS over unfiltered NoShuffle MiB |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|
| `scan/ours/3k/2/local` | (1) sequential scan | lance-lightning `LanceDataModule` | 121,728 | 2.23 | 0.012 |  | 0.500 | 0.99 |  | 1.00 | 15.0 | 1,234 | 2 | exact | 0.0123 | 0.0135 | 1.10 | 0 |
| `scan/lance.torch/3k/2/local` | (1) sequential scan | pylance `lance.torch` | 55,000 | 1.00 (best peer) | 0.012 |  | 0.500 | 0.99 | 175 | 0.75 | 11.2 | 1,234 | 2 | exact |  |  |  | 0 |
| `scan/litdata/3k/2/local` | (1) sequential scan | LitData `StreamingDataset` | did not run |  |  |  |  |  |  |  |  |  |  |  |  |  |  |  |
| `shuffle/ours/3k/0/local` | (2) row shuffle | lance-lightning `LanceDataModule` | 9,876 |  | 0.012 |  | 0.500 | 0.99 |  |  |  | 1,234 | 2 | — |  |  |  |  |
""",
    "common_rows": """
| scenario | rows/s | baseline | baseline rows/s | ratio | target | result |
|---|---:|---|---:|---:|---:|:---:|
| epoch, RowShuffle | 1,234,568 | raw scan | 2,345,679 | 0.53 | ≥ 0.5 | PASS |
| first batch | 100 | lance.torch | 100 | 0.99 | — | info |
| filter 10% | 5,000 | lance.torch | 1,000 | 5.00 | ≥ 1.25 | PASS |
""",
    "filter_scan": """
| index | filter | ours epoch rows/s | lance.torch rows/s | ratio (≥ 1.3) | per CPU second | setup + epoch: ours / lance.torch rows/s | ratio | first batch: ours / lance.torch ms | ratio (≤ 2) | result | read requests (MB) an epoch: ours / lance.torch |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|
| none | `label < 1` (1%) | 1,234,567 | 654,322 | 1.89 | 1.46 | 1,000 / 901 | 1.11 | 12.3 / 5.7 | 2.18 | FAIL | 1,234 (57) / 7 (0) |
| BITMAP | `label < 50` (50%) | 100 | 200 | 0.50 | 0.25 | 10 / 20 | 0.50 | 1.0 / 2.0 | 0.50 | FAIL | 1 (0) / 2 (2) |
""",
    "gpu": """
| JPEG side | CPU, one thread per core | device, TorchCodec | device, torchvision | device / CPU (best) |
|---:|---:|---:|---:|---:|
| 64x64 | 12,346 (2 threads) | 23,457 | — (does not import) | 1.90x |
| 256x256 | 1,000 (2 threads) | 900 | 1,500 | 1.50x |
| fed from | step time | / on-device (target ≤ 1.05x) | between steps, waiting for data (target < 2%) | steps timed |
|---|---:|---:|---:|---:|
| Lance (RowShuffle, decode on the device, `device_ahead=2`) | 50.0 ms | 1.042x (PASS) | 1.23% (PASS) | 40 |
| Lance, copy and decode in the loop's hooks (`device_ahead=0`) | 52.9 ms | 1.102x (FAIL) | 1.23% (PASS) | 40 |
| Lance, `device_ahead=2`, as above (`fast`) | 60.0 ms | 1.250x (FAIL) | 30.00% (FAIL) | 30 |
| batches already on the device | 48.0 ms | 1x | 0.00% | 40 |
""",
    "materialize": """
| read pattern | S3: setup (s) | S3: epoch (s) | S3: 3 epochs (s) | view: setup + copy (s) | view: epoch (s) | view: 3 epochs (s) | ratio S3/view, 3 epochs | break-even epochs |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
| NoShuffle (scan) | 1.27 | 2.89 | 12.0 | 0.55 | 0.85 | 5.2 | 2.31 | 1 |
| RowShuffle(clump_rows=64) (take) | 1.00 | 1.00 | 5.0 | 9.00 | 1.00 | 13.0 | 0.38 | > 1000 |
""",
    "memory": """
| num_workers | peak RSS epoch 3 / epoch 2 | target | result | epoch 2 peak (MiB) | epoch 3 peak (MiB) | growth (MiB) | max over epochs 2..3 (MiB) |
|---:|---:|---:|:---:|---:|---:|---:|---:|
| 0 | 0.990 | ≤ 1.05 | PASS | 510.0 | 505.0 | -5.0 | 510.0 |
| 2 | 1.100 | ≤ 1.05 | FAIL | 1000.0 | 1100.0 | +100.0 | 1100.0 |
| epoch | peak RSS (MiB) | RSS at epoch end (MiB) | seconds |
|---:|---:|---:|---:|
| 1 | 500.0 | 400.0 | 3.2 |
| 2 | 510.0 | 450.0 | 2.0 |
| 3 | 505.0 | 0.0 | 2.0 |
| epoch | peak RSS (MiB) | RSS at epoch end (MiB) | seconds |
|---:|---:|---:|---:|
| 1 | 900.0 | 800.0 | 5.0 |
| 2 | 1000.0 | 990.0 | 4.0 |
| 3 | 1100.0 | 0.0 | 4.0 |
""",
    "object_store": """
| pattern | workers | cache | read | cold rows/s | cold requests | cold MiB | cold amplification | warm rows/s | warm requests | warm MiB | x NoShuffle rows/s (cold) |
|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
| RowShuffle() | 2 | on | take | 2,000 (capped) | 1,234 | 3.0 | 1.23 | 4,000 | 12 | 1,536.0 | 0.50 |
| NoShuffle | 0 | off | scan | 4,000 | 12 | 1,536.0 | 1.00 | 2,000 (capped) | 1,234 | 3.0 | 1.00 |
""",
    "packing": """
| documents | token counts from | shuffle | tokens | windows | setup s | index B/document | setup peak MB | peak RSS MB | windows/s | tokens/s |
|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
| 10,000,000 | `lengths_column` | RowShuffle | 12,345,678,901 | 6,000,000 | 1.23 | 8.0 | 80 | 513 | 1,234 | 2,345,679 |
| 10,000,000 | token lists (no lengths_column) | RowShuffle | 12,345,678,901 | 6,000,000 | 1.23 | 8.0 | 80 | 513 | — | — |
| strategy | neighbours in the stream |
|---|---:|
| `NoShuffle()` | 1.000 |
| `RowShuffle(seed=0)` | 0.001 |
""",
    "planning": """
| survey cache | processes | surveys computed | planning MB (total) | planning CPU s (total) | setup s (slowest) | first batch s (slowest) |
|---|---:|---:|---:|---:|---:|---:|
| off | 1 | 1 | 1.23 | 0.12 | 0.50 | 0.75 |
| off | 4 | 4 | 5.43 | 0.54 | 0.55 | 0.83 |
| on | 1 | 1 | 1.23 | 0.12 | 0.50 | 0.75 |
| on | 4 | 1 | 1.60 | 0.16 | 0.50 | 0.75 |
| survey cache | planning bytes | planning CPU | first batch (slowest) | result |
|---|---:|---:|---:|:---:|
| off | 4.40 | 4.40 | 1.10 | (before) |
| on | 1.30 | 1.30 | 1.00 | PASS |
""",
    "prepare": """
| converter | rows/s | vs ours | seconds | bytes on disk | vs input | first batch (ms) | vs ours |
|---|---:|---:|---:|---:|---:|---:|---:|
| lance-lightning `prepare` (2 threads) | 1,050 | — | 9.55 | 13,580,246 | 1.100 | 46 | — |
| LitData `optimize` (2 processes) | 2,100 | 2.00 | 4.77 | 13,580,246 | 1.100 | 46 | 1.00 |
| Mosaic `MDSWriter` (1 process) | 3,150 | 3.00 | 3.18 | 13,580,246 | 1.100 | 46 | 1.00 |
| Mosaic `MDSWriter` x2 + `merge_index` (2 processes) | 4,200 | 4.00 | 2.39 | 13,580,246 | 1.100 | 46 | 1.00 |
| rep | lance-lightning | litdata | mds | mds-parallel |
|---|---:|---:|---:|---:|
| 1 | 1,000 rows/s, 46 ms | 2,000 rows/s, 46 ms | 3,000 rows/s, 46 ms | 4,000 rows/s, 46 ms |
| 2 | 1,100 rows/s, 46 ms | 2,200 rows/s, 46 ms | 3,300 rows/s, 46 ms | 4,400 rows/s, 46 ms |
""",
    "resume": """
| strategy | position | step | rows consumed | time to first batch (ms, median) | min–max (ms) |
|---|---:|---:|---:|---:|---:|
| 'ShardShuffle(seed=0)' | fresh fit | 0 | 0 | 1234 | 1000–1500 |
| 'ShardShuffle(seed=0)' | 10% | 3–4 | 3,072 | 250 | 200–300 |
| 'ShardShuffle(seed=0)' | 90% | 27–28 | 27,648 | 260 | 190–310 |
| 'RowShuffle(seed=0)' | fresh fit | 0 | 0 | 1234 | 1000–1500 |
| 'RowShuffle(seed=0)' | 10% | 3–4 | 3,072 | 250 | 200–300 |
| 'RowShuffle(seed=0)' | 90% | 27–28 | 27,648 | 260 | 190–310 |
| strategy | t90/t10 | paired t90/t10 | target | result | cursor state (bytes, pickled) | epoch with checkpoints (s) |
|---|---:|---:|---:|:---:|---:|---:|
| 'ShardShuffle(seed=0)' | 1.040 | 0.988 | ≤ 1.2 | PASS | 321 | 12.3 |
| 'RowShuffle(seed=0)' | 1.500 | 0.988 | ≤ 1.2 | FAIL | 321 | 12.3 |
""",
    "startup": """
| command | median wall time (s) | ratio to `import lance` | target |
|---|---:|---:|---|
| python -c 'import lance' | 0.55 | 1.00 |  |
| lance-lightning --help | 0.65 | 1.20 | pass |
| lance-lightning fit --help | 3.10 | 6.00 |  |
| uv run python -c pass | 0.10 | 0.20 |  |
""",
    "transforms": """
| scenario | measured | baseline | ratio | target | result | others' CPU |
|---|---|---|---:|---|:---:|---:|
| decode, 2 threads (3 of 4 pairs quiet) | 2,346 img/s | 1 thread: 1,300 img/s | 1.80x | ≥ 1.7x | PASS | 1.2% |
| image epoch, LanceDataModule (2 reader threads) | 5,000 img/s | plain DataLoader take+PIL, 0 workers: 1,000 img/s | 5.00x faster | > 1x | PASS | 20.0% |
| image epoch, LanceDataModule (2 reader threads) | 5,000 img/s | plain DataLoader take+PIL, 2 forkserver workers: 6,000 img/s | 0.83x faster | > 1x | FAIL | 0.0% |
| overlap, sleep step (idle host, like a GPU step): wait per step, prefetch on | 1.23 ms = 1.0% of 12.3 ms | prefetch off: 1.23 ms = 1.0% | 1x less waiting | < 5% of step | PASS | 5.0% |
| overlap, busy 1-thread matmul step: wait per step, prefetch on | 1.23 ms = 1.0% of 12.3 ms | prefetch off: 1.23 ms = 1.0% | 1x less waiting | < 5% of step | info | 5.0% |
| memory, prefetch_batches=2: peak RSS epoch 5 vs 1 | 410 MB (peaks 400, 410; warm-up epoch 500) | epoch 1: 400 MB; growth over idle 310 MB, of which queue 50 MB | 1.025 | ≤ 1.05 (flat) | PASS | — |
| memory, prefetch_batches=16: peak RSS epoch 5 vs 1 | 410 MB (peaks 400, 410; warm-up epoch 500) | epoch 1: 400 MB; growth over idle 310 MB, of which queue 50 MB | 1.025 | ≤ 1.05 (flat) | PASS | — |
| memory, bounded by the depth: mean epoch peak added per batch of depth (2 → 16) | 0.0 MB | one decoded batch: 12.0 MB | 0.00 | ≤ 2 batches | PASS | — |
""",
    "decode_backends": """
| JPEG side | threads | TorchCodec img/s | torchvision img/s | ratio | target | result | quiet pairs | others' CPU |
|---:|---:|---:|---:|---:|---|:---:|---:|---:|
| 64x64 | 2 | 12,346 | 12,000 | 1.029 | ≥ 0.97 | PASS | 3/5 | 1% |
| 64x64 | 1, CPU time | 12,346 | 12,000 | 0.900 | ≥ 0.97 | FAIL | — (5 pairs) | — |
""",
    "tuning": """
| # | scenario | measured | baseline | baseline measured | ratio |
|---:|---|---:|---|---:|---:|
| 1 | clumps | 1,234 rows/s | no clumps | 999 rows/s | 1.24 |
""",
    "video": """
| videos | where | reader | workers | clips/s | KiB per clip | requests per clip | × whole video | × clip's share |
|---|---|---|---:|---:|---:|---:|---:|---:|
| short | local | this loader, first epoch | 0 | 5.0 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | local | this loader, later epochs | 0 | 13.7 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | local | this loader, first epoch | 2 | 5.0 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | local | this loader, later epochs | 2 | 13.7 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | local | whole blob per clip (`read_blobs`) | 0 | 13.7 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | local | MP4 file on disk, PyAV (unbuffered file) | 0 | 13.7 | 39.1 | 3.5 | 0.36 | 1.1 |
| short | S3 +20 ms | this loader, epoch 0 | 0 | 5.0 | 195.3 | 10.0 | 1.82 | 5.5 |
| short | S3 +20 ms | this loader, epoch 1 | 0 | 10.0 | 97.7 | 5.0 | 0.91 | 2.7 |
| short | S3 +20 ms | this loader, epoch 0 | 2 | 5.0 | 195.3 | 10.0 | 1.82 | 5.5 |
| short | S3 +20 ms | this loader, epoch 1 | 2 | 10.0 | 97.7 | 5.0 | 0.91 | 2.7 |
| short | S3 +20 ms | whole blob per clip (`read_blobs`) | 0 | 2.5 | 390.6 | 2.0 | 3.64 | 10.9 |
| videos | where | BlobFile read-ahead | `take_blobs`: requests / ms | `open_video`: KiB / requests | cold clip: KiB / requests / ms (I/O ms) | warm clip: KiB / requests / ms (I/O ms) | PyAV asked, cold + warm (KiB) |
|---|---|---:|---:|---:|---:|---:|---:|
| short | local | 0 KiB | 1.0 / 2.3 | 4.9 / 2.0 | 58.6 / 7.0 / 12.3 (4.6) | 19.5 / 1.0 / 3.4 (0.5) | 48.8 + — |
| short | S3 +20 ms | 512 KiB (Lance's default) | 1.0 / 2.3 | 4.9 / 2.0 | 58.6 / 7.0 / 12.3 (4.6) | 19.5 / 1.0 / 3.4 (0.5) | 48.8 + — |
| videos | clip (`decode_video_clip`) ms | decoding its frames only ms | conversion, resize, copy ms (the difference) | frames + the clip's converted with `threads=1` ms | frames + the clip's converted by one reused `VideoReformatter` ms | frames decoded per clip |
|---|---:|---:|---:|---:|---:|---:|
| short | 12.3 | 5.7 | 6.7 | 8.9 | 7.8 | 13 |
| videos | workers | reader | clips/s (median) | × this loader (median of rounds) | KiB per clip | first epoch clips/s | read / decode ms per clip (the loader's metrics) |
|---|---:|---|---:|---:|---:|---:|---:|
| short | 0 | this loader (`LanceDataModule(clips=VideoClips(...))`, reader_threads default) | 13.7 | 0.94 | 39.1 | 5.0 | 1.4 / 4.8 |
| short | 0 | plain DataLoader: whole blob per clip (`read_blobs`) + PyAV from BytesIO | 13.7 | 0.94 | 39.1 | 5.0 | — |
| short | 0 | plain DataLoader: MP4 files on disk + PyAV (TorchCodec cannot run here, see below) | 13.7 | 0.94 | 39.1 | 5.0 | — |
| short | 2 | this loader (`LanceDataModule(clips=VideoClips(...))`, reader_threads default) | 13.7 | 0.94 | 39.1 | 5.0 | — |
| short | 2 | plain DataLoader: whole blob per clip (`read_blobs`) + PyAV from BytesIO | 13.7 | 0.94 | 39.1 | 5.0 | — |
| short | 2 | plain DataLoader: MP4 files on disk + PyAV (TorchCodec cannot run here, see below) | 13.7 | 0.94 | 39.1 | 5.0 | — |
| videos | workers | epochs | RSS after epoch 1 / 2 / last (MiB) | max after epoch ≥ 2 (MiB) | last / epoch 2 | containers open at the end (main process) | seconds |
|---|---:|---:|---:|---:|---:|---:|---:|
| long (24) | 2 | 3 | 500 / 511 / 512 | 512 | 1.003 | — | 100 |
| short (8) | 0 | 1 | 400 / 400 / 400 | 400 | 1.000 | 3 | 5 |
""",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_table_reads_as_the_result_files_of_record(name: str) -> None:
    assert _table_lines(CASES[name]()) == EXPECTED[name].strip().splitlines()


# -- the one table writer ------------------------------------------------------------------------------
def test_a_table_aligns_formats_and_marks_what_is_missing() -> None:
    rows = [("a", 1234.5, None, 0.25, "PASS"), ("b", NAN, 7, 1.0, "FAIL")]
    assert tables.table("name | rows/s | n | share | result", "< >,.0f > >.0% ^", rows) == [
        "| name | rows/s | n | share | result |",
        "|---|---:|---:|---:|:---:|",
        "| a | 1,234 | — | 25% | PASS |",
        "| b | — | 7 | 100% | FAIL |",
    ]
    assert tables.table("x", ">.1f", [(NAN,)], missing="") == ["| x |", "|---:|", "|  |"]
    assert tables.cell(math.inf, ".1f") == "inf" and tables.cell("as is", ",.0f") == "as is"


@pytest.mark.parametrize(
    ("heads", "specs", "rows", "said"),
    [
        ("a | b", ">", [], "2 heads and 1 specs"),
        ("a | b", "> >", [(1,)], "a row of 1 values for 2 columns"),
        ("a | b", "> >", [(1, 2, 3)], "a row of 3 values for 2 columns"),
    ],
)
def test_a_table_refuses_what_would_shift_its_columns(heads: str, specs: str, rows: list, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        tables.table(heads, specs, rows)


def test_a_cell_ends_with_its_process_though_a_child_holds_its_output() -> None:
    """A cell's result is read once its own process exits, and then its group is killed: a LitData
    cell's workers outlived the cell's `os._exit` holding its output pipes, and waiting for their
    end of file gave "no result within 90 s" for every LitData cell. Here the command leaves a
    child that sleeps past the timeout with its stdout: the result still comes (not None, which
    the timeout gives), and the child is gone."""
    import sys

    import psutil

    from benchmarks.harness.runner import run_in_session

    command = [
        sys.executable,
        "-c",
        "import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "print(p.pid, flush=True); print('{\"ok\": 1}', flush=True); os._exit(0)",
    ]
    returncode, stdout, stderr = run_in_session(command, dict(os.environ), timeout=200)
    assert returncode == 0, (returncode, stdout, stderr)
    pid, result = stdout.splitlines()
    assert result == '{"ok": 1}'
    try:
        psutil.Process(int(pid)).wait(timeout=60)  # killed with the session
    except psutil.NoSuchProcess:
        pass
    assert run_in_session([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), timeout=1)[0] is None
