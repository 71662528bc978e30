"""The gpu study's data and its decode section: the JPEG datasets every section reads, and images/s of
`DecodeImage` on the device (each backend) against CPU decode on one thread per core.

Guarantees: `image_dataset` writes a dataset once per (rows, side) and reuses it; `decode_rates`
gives one row per JPEG side with the CPU rate and each backend's rate (None where the backend does
not import here). The study's entry point and its description: `benchmarks.studies.gpu`.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import lance
import numpy as np
import pyarrow as pa
import torch

from benchmarks import common
from lance_lightning import to_torch_batch
from lance_lightning.produce.producer import pin_batch
from lance_lightning.transforms import DecodeImage, decoders

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 256
CLASSES = 10


# -- data ------------------------------------------------------------------------------------------
def jpegs(rows: int, side: int, seed: int = 0) -> list[bytes]:
    """``rows`` `common.synthetic_jpegs` (quality 90) of ``side`` x ``side``."""
    gen = torch.Generator().manual_seed(seed)
    out: list[bytes] = []
    for first in range(0, rows, 256):
        out.extend(common.synthetic_jpegs(min(256, rows - first), side, gen))
    return out


def image_dataset(root: Path, rows: int, side: int) -> str:
    """A Lance dataset of ``rows`` ``side`` x ``side`` JPEGs (``image``) and labels, written once
    (the JPEGs are made in chunks of 1,024 on a thread per core)."""
    path = root / f"gpu_images_{rows}_{side}.lance"
    if common.table_ready(path, rows, None):
        return str(path)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        chunks = pool.map(lambda first: jpegs(min(1024, rows - first), side, seed=first), range(0, rows, 1024))
        blobs = [blob for chunk in chunks for blob in chunk]
    labels = np.arange(rows, dtype=np.int64) % CLASSES
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": pa.array(labels)})
    lance.write_dataset(table, str(path), mode="overwrite")
    return str(path)


# -- 1. decode ---------------------------------------------------------------------------------------
def timed_rate(fn: Any, images: int, device: torch.device, min_seconds: float) -> float:
    """Images per second of ``fn()`` (which decodes ``images``), repeated for ``min_seconds``."""
    fn()  # warm-up: compiles, starts threads, creates the nvJPEG handles
    sync(device)
    started, calls = time.perf_counter(), 0
    while True:
        fn()
        calls += 1
        sync(device)
        if time.perf_counter() - started >= min_seconds:
            return calls * images / (time.perf_counter() - started)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


BACKENDS: tuple[Literal["torchcodec", "torchvision"], ...] = ("torchcodec", "torchvision")


def backend_imports(backend: str) -> bool:
    """Whether ``backend`` can decode here (TorchCodec may have no build for this torch)."""
    return backend == "torchvision" or decoders._torchcodec() is not None


def versions() -> str:
    import torchvision

    codec = decoders._torchcodec()
    codec_version = __import__("torchcodec").__version__ if codec is not None else "not importable here"
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__}, "
        f"torchcodec {codec_version}, pylance {lance.__version__}"
    )


def decode_rates(device: torch.device, sides: list[int], batches: int, min_seconds: float) -> list[dict[str, Any]]:
    cores = os.cpu_count() or 1
    pool = ThreadPoolExecutor(cores, initializer=torch.set_num_threads, initargs=(1,))
    rows = []
    for side in sides:
        data = [
            to_torch_batch(pa.table({"image": pa.array(jpegs(BATCH, side, seed=i), pa.binary())}))
            for i in range(batches)
        ]
        if device.type == "cuda":
            data = [pin_batch(batch) for batch in data]
        cpu = DecodeImage(normalize=False)

        def on_cpu() -> None:
            list(pool.map(cpu, data))

        rate: dict[str, Any] = {
            "side": side,
            "cpu": timed_rate(on_cpu, BATCH * batches, torch.device("cpu"), min_seconds),
            "cores": cores,
        }
        for backend in BACKENDS:
            if not backend_imports(backend):
                rate[backend] = None
                continue
            gpu = DecodeImage(normalize=False, device=str(device), backend=backend)

            def on_device(gpu: DecodeImage = gpu) -> None:
                for batch in data:
                    gpu(batch)

            rate[backend] = timed_rate(on_device, BATCH * batches, device, min_seconds)
        rows.append(rate)
    pool.shutdown()
    return rows
