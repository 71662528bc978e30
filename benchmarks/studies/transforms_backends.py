"""Decode-backend comparison (the ``decode-backends`` study): TorchCodec against torchvision.

Guarantees: both backends decode the same in-memory JPEG batches and must give identical images
(asserted before any timing); every ratio is the median of interleaved pairs measured in this
process (quiet pairs only, as `transforms_workloads.quiet_paired`), plus one row per image side of
the decoding thread's own CPU time, which other processes' load barely changes. `backends_report`
returns the Markdown table and whether TorchCodec reached 0.97x torchvision everywhere; it writes
no file (the script does).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.study import Params
from benchmarks.harness.timing import QUIET, summary
from benchmarks.studies.transforms_workloads import BATCH, decode, quiet_paired
from lance_lightning import to_torch_batch
from lance_lightning.transforms import DecodeImage

BACKEND_SIDES = {64: 16, 256: 4}  # image side -> batches of BATCH JPEGs


def jpeg_batches(side: int, batches: int) -> list[dict[str, Any]]:
    """``batches`` batches of BATCH JPEGs (smooth random colour fields plus noise, quality 90) of
    ``side`` x ``side``, converted as the loader converts them (one uint8 `Ragged` each)."""
    import pyarrow as pa

    gen = torch.Generator().manual_seed(side)
    out = []
    for _ in range(batches):
        blobs = common.synthetic_jpegs(BATCH, side, gen)
        out.append(to_torch_batch(pa.table({"image": pa.array(blobs, pa.binary())})))
    return out


def decode_backends(reps: int) -> list[dict[str, Any]]:
    """TorchCodec vs torchvision `DecodeImage` throughput per image side and thread count."""
    results = []
    pools = {n: ThreadPoolExecutor(n, initializer=torch.set_num_threads, initargs=(1,)) for n in (1, 2)}
    transforms = {b: decode(b) for b in ("torchcodec", "torchvision")}
    for side, count in BACKEND_SIDES.items():
        batches = jpeg_batches(side, count)
        reference = transforms["torchvision"](batches[0])["image"]
        assert torch.equal(transforms["torchcodec"](batches[0])["image"], reference), "backends disagree"

        def run(backend: str, threads: int):
            def epoch() -> int:
                for _ in pools[threads].map(transforms[backend], batches):
                    pass
                return BATCH * count

            return epoch

        results.append(thread_cpu_rates(transforms, batches, side, 4 * reps))
        for threads in (1, 2):
            paired = quiet_paired(run("torchcodec", threads), run("torchvision", threads), reps, 0.3)
            results.append(
                {
                    "side": side,
                    "threads": threads,
                    "torchcodec": paired.rows_per_s,
                    "torchvision": paired.base_rows_per_s,
                    "ratio": paired.ratio,
                    "quiet": sum(load < QUIET for load in paired.loads),
                    "tried": paired.tried,
                    "others": max(paired.loads),
                }
            )
    for pool in pools.values():
        pool.shutdown()
    return results


def thread_cpu_rates(
    transforms: dict[str, DecodeImage], batches: list[dict[str, Any]], side: int, reps: int
) -> dict[str, Any]:
    """Images per second of the decoding thread's own CPU time (``time.thread_time``), each backend
    in turn on this thread, ``reps`` interleaved pairs: other processes' load delays a thread but
    barely changes the CPU time it needs, so this row stays comparable on a busy machine."""
    images = BATCH * len(batches)
    pairs = []
    for rep in range(reps):
        rates = {}
        for backend in ("torchcodec", "torchvision") if rep % 2 == 0 else ("torchvision", "torchcodec"):
            transforms[backend](batches[0])  # warm
            started = time.thread_time()
            for batch in batches:
                transforms[backend](batch)
            rates[backend] = images / (time.thread_time() - started)
        pairs.append((rates["torchcodec"], rates["torchvision"]))
    result = summary(pairs)
    return {
        "side": side,
        "threads": "1, CPU time",
        "torchcodec": result.rows_per_s,
        "torchvision": result.base_rows_per_s,
        "ratio": result.ratio,
        "quiet": None,
        "tried": reps,
        "others": None,
    }


def measure(p: Params) -> str:
    """The ``decode-backends`` study: `decode_backends`, then its table."""
    results = decode_backends(p.reps)
    import torchcodec
    import torchvision

    return "\n".join(
        [
            f"torchcodec {torchcodec.__version__}, torchvision {torchvision.__version__}.",
            "",
            *table(results),
            "",
            f"Each row: `DecodeImage(mean, std, backend=...)` (normalised float32 output, as in training) on the same "
            f"in-memory batches of {BATCH} JPEGs (smooth random colour fields plus noise, quality 90; "
            f"{', '.join(f'{n} batches at {s}x{s}' for s, n in BACKEND_SIDES.items())}), converted as the loader "
            "converts them (one uint8 `Ragged` per batch), on a pool of 1 or 2 threads with "
            "`torch.set_num_threads(1)`. Median of interleaved pairs (each side warmed up, then timed for at least "
            "0.3 s); only quiet pairs (other processes used < 5% of the CPUs, `benchmarks.harness.timing.OtherLoad`) count, all pairs when "
            "none was quiet ('quiet pairs' 0/n: the ratio is then measured under load and less certain). The "
            "'1, CPU time' rows divide the images by the decoding thread's own CPU time (`time.thread_time`, the median "
            "of interleaved pairs on one thread), which other processes' load barely changes. Both backends "
            "decode in one compiled loop without the GIL; they gave identical images (checked in the run). The "
            "torchvision row is the decoder `DecodeImage` used before TorchCodec, so ratio ≥ 0.97 means no regression.",
            "",
        ]
    )


def table(results: list[dict[str, Any]]) -> list[str]:
    """One row a JPEG side and thread count: img/s of each backend, their ratio and its target."""
    return tables.table(
        "JPEG side | threads | TorchCodec img/s | torchvision img/s | ratio | target | result | quiet pairs | others' CPU",
        "> > >,.0f >,.0f >.3f < ^ > >.0%",
        [
            (
                f"{r['side']}x{r['side']}",
                r["threads"],
                r["torchcodec"],
                r["torchvision"],
                r["ratio"],
                "≥ 0.97",
                "PASS" if r["ratio"] >= 0.97 else "FAIL",
                f"— ({r['tried']} pairs)" if r["quiet"] is None else f"{r['quiet']}/{r['tried']}",
                r["others"],
            )
            for r in results
        ],
    )
