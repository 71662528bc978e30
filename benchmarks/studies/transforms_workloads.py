"""Workloads of the batch-transform benchmark: each returns its measurements and never writes a file.

Guarantees: every ratio comes from back-to-back measurements of this process (`quiet_paired`,
`benchmarks.harness.timing.paired`), each side warmed up first, and only pairs taken while other processes used less
than `QUIET` of the CPUs count (all pairs when none was quiet; the counts are returned).
The decode transform is always `DecodeImage` with ImageNet normalisation (`decode`).

1. `decode_scaling`: `DecodeImage` on in-memory JPEG batches, a pool of 2 threads vs 1.
2. `against_plain`: one ``LanceDataModule`` epoch vs a plain ``DataLoader`` doing take + PIL.
3. `overlap`: the time ``next(loader)`` blocks per simulated step, prefetch on and off.
4. `memory_child`: peak RSS per epoch, run in a fresh process by the ``transforms`` study.

Used by the ``transforms`` study (and `quiet_paired` / `decode` by ``decode-backends``, `transforms_backends`).
"""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lance
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.harness.memory import RssSampler
from benchmarks.harness.timing import QUIET, OtherLoad, Paired, iterate, paired, rate
from lance_lightning import LanceDataModule, LanceSource, NoShuffle, RowShuffle, to_torch_batch
from lance_lightning.read.reader import group_rows
from lance_lightning.transforms import DecodeImage

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 256


def quiet_paired(candidate: Any, baseline: Any, reps: int, min_seconds: float) -> Paired:
    """`paired` keeping only pairs measured while quiet (up to 4x ``reps`` tried), each side warmed up first."""
    return paired(candidate, baseline, reps, min_seconds, warm=True, quiet=4, only_quiet=True)


def decode(backend: str = "auto") -> DecodeImage:
    return DecodeImage(column="image", mean=MEAN, std=STD, backend=backend)


# -- 1. decode scaling --------------------------------------------------------------------------
def decode_scaling(uri: str, reps: int) -> dict[str, Any]:
    table = lance.dataset(uri).to_table(columns=["image"], limit=BATCH * 16)
    # Converted as the loader converts them: each batch's JPEGs as one uint8 buffer (a `Ragged`).
    batches = [to_torch_batch(table.slice(i, BATCH)) for i in range(0, table.num_rows, BATCH)]
    transform = decode()
    pools = {n: ThreadPoolExecutor(n, initializer=torch.set_num_threads, initargs=(1,)) for n in (1, 2)}

    def run(threads: int):
        def epoch() -> int:
            for _ in pools[threads].map(transform, batches):
                pass
            return table.num_rows

        return epoch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for threads in (2, 1, 2, 1):  # warm up: allocator arenas, caches, TorchScript's first runs
            rate(run(threads), 0.25)
        result = quiet_paired(run(2), run(1), reps, min_seconds=0.2)
    finally:
        torch.set_num_threads(before)
        for pool in pools.values():
            pool.shutdown()
    return {
        "two": result.rows_per_s,
        "one": result.base_rows_per_s,
        "ratio": result.ratio,
        "kept": len(result.loads),
        "tried": result.tried,
        "others": max(result.loads),
        "raw": result.raw,
    }


# -- 2. against plain PyTorch ----------------------------------------------------------------------
class PlainImages(Dataset):
    """What a user writes without the plugin: one ``take`` and one PIL decode per row."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.rows = lance.dataset(uri).count_rows()
        self.ds: Any = None
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        if self.ds is None:
            self.ds = lance.dataset(self.uri)  # opened in the process that reads (workers too)
        row = self.ds.take([index], columns=["image", "label"])
        image = Image.open(io.BytesIO(row.column("image")[0].as_py())).convert("RGB")
        x = torch.from_numpy(np.asarray(image)).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std, int(row.column("label")[0].as_py())


def against_plain(uri: str, reps: int) -> dict[str, Any]:
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"]),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=0),
        transform=decode(),
    )
    ours = iterate(dm.train_dataloader())
    plain0 = iterate(DataLoader(PlainImages(uri), batch_size=BATCH, shuffle=True, num_workers=0))
    workers = DataLoader(
        PlainImages(uri),
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="forkserver",
        persistent_workers=True,
    )
    plain2 = iterate(workers)
    plain2()  # start the persistent workers outside the timings
    out = {"threads": dm.reader_threads}
    for name, baseline in (("workers0", plain0), ("workers2", plain2)):
        with OtherLoad() as load:
            result = paired(ours, baseline, reps, min_seconds=0.1)
        out[name] = {
            "ours": result.rows_per_s,
            "plain": result.base_rows_per_s,
            "ratio": result.ratio,
            "others": load.share,
        }
    return out


# -- 3. overlap ---------------------------------------------------------------------------------------
def matmul_step(seconds: float) -> Any:
    """A busy CPU step of about ``seconds`` (1-thread matmul), calibrated here."""
    a = torch.randn(256, 256)
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < 0.2:
        a @ a
        n += 1
    per = 0.2 / n
    repeats = max(1, round(seconds / per))

    def step() -> None:
        for _ in range(repeats):
            a @ a

    return step


def overlap_loader(uri: str, batch_size: int, threads: int) -> Any:
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"]),
        batch_size=batch_size,
        shuffle=NoShuffle(),
        transform=decode(),
        reader_threads=threads,
        prefetch_batches=4,
    )
    return dm.train_dataloader()


def prepare_seconds(uri: str, batch_size: int) -> float:
    """Seconds per batch to read + decode with prefetch off (all on the calling thread)."""
    loader = overlap_loader(uri, batch_size, threads=0)
    started, n = time.perf_counter(), 0
    for _ in loader:
        n += 1
    return (time.perf_counter() - started) / n


def quiet_waited(uri: str, batch_size: int, threads: int, step: Any, tries: int = 3) -> dict[str, float]:
    """`waited` on a fresh loader, retried while other processes used >= `QUIET` of the CPUs."""
    for _ in range(tries):
        with OtherLoad() as load:
            result = waited(overlap_loader(uri, batch_size, threads), step)
        if load.share < QUIET:
            break
    return {**result, "others": load.share}


def waited(loader: Any, step: Any) -> dict[str, float]:
    iterator = iter(loader)
    next(iterator)  # the pipeline's start-up is not a steady-state wait
    wait, steps, busy = 0.0, 0, 0.0
    while True:
        asked = time.perf_counter()
        try:
            next(iterator)
        except StopIteration:
            break
        got = time.perf_counter()
        wait += got - asked
        steps += 1
        step()
        busy += time.perf_counter() - got
    return {"wait_ms": 1000 * wait / steps, "step_ms": 1000 * busy / steps, "fraction": wait / busy}


def overlap(uri: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    batch_size = 128
    for _ in range(3):  # calibrate: one batch ~10 ms on one thread
        per_batch = prepare_seconds(uri, batch_size)
        batch_size = max(16, int(round(batch_size * 0.010 / per_batch / 16)) * 16)
    per_batch = prepare_seconds(uri, batch_size)
    steps = {"sleep": lambda: time.sleep(0.020), "matmul": matmul_step(0.020)}
    out: dict[str, Any] = {"batch_size": batch_size, "prepare_ms": 1000 * per_batch}
    for kind, step in steps.items():
        for threads in (2, 0):
            out[f"{kind}/{threads}"] = quiet_waited(uri, batch_size, threads, step)
    return out


# -- 4. memory (each setting in a fresh process) -----------------------------------------------------
#: Bytes of one decoded batch (float32, 3 x 64 x 64 per image).
DECODED_BATCH_BYTES = BATCH * 3 * 64 * 64 * 4
#: Seconds each training step of the memory runs takes: longer than a batch takes to prepare, so the
#: read-ahead queue is full (the most memory it can hold) for the whole epoch.
MEMORY_STEP_S = 0.02


def memory_child(uri: str, depth: int, epochs: int) -> dict[str, Any]:
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"]),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=0),
        transform=decode(),
        prefetch_batches=depth,
    )
    loader = dm.train_dataloader()
    sampler = RssSampler(0.005, children=False)
    idle = sampler.reset()
    sampler.start()
    peaks = []
    for _ in range(epochs):
        sampler.reset()
        for _batch in loader:
            time.sleep(MEMORY_STEP_S)  # a model step: the read-ahead queue fills up to its depth
        peaks.append(sampler.reset())
    sampler.stop()
    plan = dm.plans["train"]
    raw_row = lance.dataset(uri).to_table(columns=["image", "label"], limit=1000).nbytes / 1000
    bound = depth * DECODED_BATCH_BYTES + dm.prefetch_groups * group_rows(plan, dm.take_group_bytes) * raw_row
    return {"idle": idle, "peaks": peaks, "bound": bound}
