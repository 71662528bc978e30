"""GPU benchmark: decode on the GPU, an image-classification fit fed from Lance, copies that overlap.

Needs a CUDA device; records into ``benchmarks/results/gpu.md``, naming the device:

1. Decode: `DecodeImage(device="cuda")` images/s (each backend; one batched nvJPEG call per batch
   of 256) against CPU decode on a pool of one thread per core of this machine (`DecodeImage()`,
   ``torch.set_num_threads(1)``), 64x64 and 256x256 JPEGs.
2. Fit: torchvision ResNet-18, mixed precision (bf16), batch 256, 224x224 inputs, fed by
   ``LanceDataModule`` (RowShuffle, JPEGs decoded and resized on the GPU as its
   ``device_transform``). Measured over the steps after a warm-up: the step time, and the share
   of it the training loop spent between steps (fetching the batch, copying it, decoding: waiting
   for data; target < 2%); then the same fit fed from batches already on the GPU (target: Lance
   step time <= 1.05x). ``--variants`` adds rows for other ways of feeding the same fit, each
   timed in the same run: ``cpu=F`` decodes the first fraction F of each batch on CPU threads
   while the GPU decodes the rest (``DecodeImage(cpu_share=F)``; ``threads=N`` sets the threads),
   ``prio`` trains on a high-priority CUDA stream (so the decode's kernels yield to the model's),
   joined by ``+``. ``--model2`` adds the same rows for a second fit where the data path matters
   more: ResNet-18 at 128x128 (JPEGs of 144x144), batch ``--batch2``.
3. Copies: `DeviceTransfer` (the data module's side-stream copy) of a pinned batch against a
   plain ``pinned.to("cuda", non_blocking=True)`` of the same bytes, timed with CUDA events
   (target >= 0.8x the bandwidth); and proof of overlap: a copy issued by `DeviceTransfer` while
   matmuls run, timed with CUDA events on both streams (the overlapped time against the two
   alone).

The ``gpu`` study: ``python -m benchmarks run gpu --record`` on a CUDA machine (~5 minutes;
``benchmarks/gpu_session.sh`` is the device session that ran it), ``--set variants=cpu=0.25,prio
--set model2=true --set batch2=1024`` for more rows, ``--set device=cpu --set rows=64 --set
steps=3`` for a CPU smoke run.

``device=cpu`` runs the same code at tiny sizes on the CPU (the decode and fit sections, with
the CPU in place of the GPU; the copy sections need CUDA and are skipped): a test runs it, so the
study stays runnable where no GPU is. Without CUDA and without ``device=cpu`` it is refused in one
line (exit status 2) before anything is measured.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from benchmarks import common
from benchmarks.harness import tables
from benchmarks.harness.registry import SelectError
from benchmarks.harness.study import Params
from lance_lightning import LanceDataModule, LanceSource, RowShuffle, to_torch_batch
from lance_lightning.device.transfer import DeviceTransfer
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


BACKENDS = ("torchcodec", "torchvision")


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

        rate = {
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


# -- 2. fit --------------------------------------------------------------------------------------------
class ResNet(pl.LightningModule):
    """ResNet-18; with ``priority`` (CUDA, e.g. -1) it trains on a stream of that priority."""

    def __init__(self, priority: int = 0) -> None:
        super().__init__()
        import torchvision

        self.net = torchvision.models.resnet18(num_classes=CLASSES).to(memory_format=torch.channels_last)
        self.priority = priority
        self._streams: Any = None

    def on_train_start(self) -> None:
        if self.priority and self.device.type == "cuda":
            previous = torch.cuda.current_stream(self.device)
            stream = torch.cuda.Stream(self.device, priority=self.priority)
            stream.wait_stream(previous)
            torch.cuda.set_stream(stream)
            self._streams = (previous, stream)

    def on_train_end(self) -> None:
        if self._streams is not None:
            previous, stream = self._streams
            previous.wait_stream(stream)
            torch.cuda.set_stream(previous)
            self._streams = None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        images = batch["image"].contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(images), batch["label"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class StepClock(pl.Callback):
    """Host times of each batch's start and end; the device is synchronised only at the window's edges."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.starts: list[float] = []
        self.ends: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, idx: int) -> None:
        if idx == self.warmup:
            sync(module.device)
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sync(module.device)
        self.ends[-1] = time.perf_counter()

    def result(self) -> dict[str, float]:
        """Step time over the steps after the warm-up, and the share spent between steps."""
        w = self.warmup
        total = self.ends[-1] - self.starts[w]
        steps = len(self.starts) - w
        between = sum(start - end for start, end in zip(self.starts[w + 1 :], self.ends[w:]))
        return {"step_ms": 1e3 * total / steps, "wait_share": between / total, "steps": steps}


class DeviceBatches:
    """``count`` batches already on the device, cycled ``steps`` times (the no-data-loading baseline)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Any:
        return (self.batches[i % len(self.batches)] for i in range(self.steps))


def parse_variant(text: str) -> dict[str, Any]:
    """``cpu=F``, ``threads=N``, ``prio`` joined by ``+`` (see the module docstring)."""
    out: dict[str, Any] = {"name": text, "cpu_share": 0.0, "cpu_threads": None, "priority": 0}
    for part in text.split("+"):
        key, _, value = part.partition("=")
        try:
            if key == "cpu" and value:
                out["cpu_share"] = float(value)
            elif key == "threads" and value:
                out["cpu_threads"] = int(value)
            elif key == "prio" and not value:
                out["priority"] = -1
            else:
                raise ValueError(part)
        except ValueError:
            raise SelectError(f"{text!r}: a variant is cpu=F (0..1), threads=N, prio, joined by '+'") from None
    return out


def variant_label(variant: dict[str, Any]) -> str:
    parts = []
    if variant["cpu_share"]:
        threads = variant["cpu_threads"] or decoders_threads()
        parts.append(f"first {100 * variant['cpu_share']:.0f}% of each batch decoded on {threads} CPU threads")
    if variant["priority"]:
        parts.append(f"training on a stream of priority {variant['priority']}")
    return "Lance, `device_ahead=2`, " + ", ".join(parts or ["as above"]) + f" (`{variant['name']}`)"


def decoders_threads() -> int:
    from lance_lightning.transforms.host_share import default_threads

    return default_threads()


def fit_rates(
    uri: str,
    device: torch.device,
    size: int,
    batch: int,
    steps: int,
    warmup: int,
    threads: int,
    variants: list[dict[str, Any]] = (),  # type: ignore[assignment]
    in_hooks: bool = True,
) -> dict[str, Any]:
    on = str(device) if device.type == "cuda" else None
    decode = DecodeImage(size=size, mean=MEAN, std=STD, device=on)
    kwargs = fit_trainer_kwargs(device.type, steps)

    def module(device_ahead: int, transform: DecodeImage = decode) -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(uri, columns=["image", "label"]),
            batch_size=batch,
            shuffle=RowShuffle(seed=0, clump_rows=64),
            device_transform=transform,
            reader_threads=threads,
            device_ahead=device_ahead,
        )

    def timed(dm: LanceDataModule, priority: int = 0) -> dict[str, float]:
        clock = StepClock(warmup)
        pl.Trainer(callbacks=[clock], **kwargs).fit(ResNet(priority), datamodule=dm)
        return clock.result()

    out: dict[str, Any] = {"batch": batch, "size": size, "read": read_rate(module(0), steps), "variants": []}
    out["lance"] = timed(module(2))
    print(f"  lance: {out['lance']}", flush=True)
    if in_hooks:
        out["in_hooks"] = timed(module(0))
    for variant in variants:
        split = DecodeImage(
            size=size,
            mean=MEAN,
            std=STD,
            device=on,
            cpu_share=variant["cpu_share"],
            cpu_threads=variant["cpu_threads"],
        )
        result = timed(module(2, split), variant["priority"])
        split.host_share.close()
        print(f"  {variant['name']}: {result}", flush=True)
        out["variants"].append({**variant, **result})
    table = lance.dataset(uri).to_table(columns=["image", "label"], limit=batch * 4)
    ready = []
    for first in range(0, table.num_rows - batch + 1, batch):
        decoded = decode(to_torch_batch(table.slice(first, batch)))  # on the device (the CPU in a smoke run)
        ready.append({key: value.to(device) for key, value in decoded.items()})
    ready_clock = StepClock(warmup)
    pl.Trainer(callbacks=[ready_clock], **kwargs).fit(ResNet(), train_dataloaders=DeviceBatches(ready, steps))
    out["ready"] = ready_clock.result()
    return out


def fit_trainer_kwargs(accelerator: str, steps: int) -> dict[str, Any]:
    """The timed fits' Trainer arguments: one device, bf16 mixed precision, nothing but the steps."""
    return dict(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        precision="bf16-mixed",
    )


def read_rate(dm: LanceDataModule, steps: int) -> float:
    """Images/s of the train loader alone (read, convert, pin: the host side of the fit's batches)."""
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)  # warm-up: starts the reader threads
    started, images = time.perf_counter(), 0
    for _, host_batch in zip(range(steps), batches):
        images += len(host_batch["label"])
    rate = images / (time.perf_counter() - started)
    batches.close()
    dm.teardown("fit")
    return rate


# -- 3. copies (CUDA only) ----------------------------------------------------------------------------
def copy_rates(device: torch.device, megabytes: int, reps: int) -> dict[str, float]:
    """Host-to-device GB/s of `DeviceTransfer` and of a plain pinned copy of the same bytes."""
    host = pin_batch({"image": torch.randint(0, 255, (megabytes << 20,), dtype=torch.uint8)})
    transfer = DeviceTransfer(copy_stream=True)
    transfer.start(device)

    def gbps(copy: Any) -> float:
        copy()  # warm-up
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = 0.0
        for _ in range(reps):
            start.record(torch.cuda.current_stream(device))
            copy()
            end.record(torch.cuda.current_stream(device))  # the transfer makes this stream wait for its copy
            end.synchronize()
            best = max(best, (megabytes / 1024) / (start.elapsed_time(end) / 1e3))
        return best

    plain = gbps(lambda: host["image"].to(device, non_blocking=True))
    ours = gbps(lambda: transfer(host, device))
    transfer.stop()
    return {"plain_gbps": plain, "transfer_gbps": ours, "ratio": ours / plain, "megabytes": megabytes}


def overlap(device: torch.device, megabytes: int) -> dict[str, float]:
    """Milliseconds (CUDA events) of matmuls alone, a `DeviceTransfer` copy alone, and both issued together."""
    host = pin_batch({"image": torch.randint(0, 255, (megabytes << 20,), dtype=torch.uint8)})
    a = torch.randn(4096, 4096, device=device)
    transfer = DeviceTransfer(copy_stream=True)
    transfer.start(device)
    compute = torch.cuda.current_stream(device)

    def matmuls() -> None:
        b = a
        for _ in range(20):
            b = a @ b

    def window(*work: Any) -> float:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(compute)
        for fn in work:
            fn()
        end.record(compute)
        end.synchronize()
        return start.elapsed_time(end)

    copy = lambda: transfer(host, device)  # noqa: E731 - issued on the side stream, the compute stream waits
    # The copy must be issued before the matmuls' wait: DeviceTransfer makes the compute stream wait for
    # it, so issuing matmuls first and then the copy shows whether the copy ran during the matmuls.
    window(matmuls, copy)  # warm-up
    alone_compute = min(window(matmuls) for _ in range(3))
    alone_copy = min(window(copy) for _ in range(3))
    both = min(window(matmuls, copy) for _ in range(3))
    transfer.stop()
    hidden = (alone_compute + alone_copy - both) / min(alone_compute, alone_copy)
    return {
        "compute_ms": alone_compute,
        "copy_ms": alone_copy,
        "both_ms": both,
        "hidden": hidden,
        "megabytes": megabytes,
    }


# -- report -------------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    return "CPU (smoke run, no GPU)"


def report(
    args: Params,
    device: torch.device,
    decode: list[dict[str, Any]],
    fit: dict[str, Any],
    copies: dict[str, float] | None,
    lap: dict[str, float] | None,
    seconds: float,
    fit2: dict[str, Any] | None = None,
) -> str:
    lines = [
        f"Device: {device_name(device)}; {versions()}.",
        "",
        "## Decode (images/s)",
        "",
        *decode_table(decode),
        *fit_section(fit),
    ]
    if fit2 is not None:
        lines += fit_section(fit2)
    if copies is not None and lap is not None:
        lines += [
            "",
            "## Host-to-device copies",
            "",
            f"- `DeviceTransfer` of a pinned {copies['megabytes']} MB batch: {copies['transfer_gbps']:.1f} GB/s; a plain "
            f"pinned `.to(device, non_blocking=True)` of the same bytes: {copies['plain_gbps']:.1f} GB/s; ratio "
            f"{copies['ratio']:.2f} (target ≥ 0.8: {'PASS' if copies['ratio'] >= 0.8 else 'FAIL'}). Best of "
            f"{args.reps}, CUDA events.",
            f"- Overlap (CUDA events): 20 matmuls 4096² alone {lap['compute_ms']:.1f} ms, a {lap['megabytes']} MB "
            f"`DeviceTransfer` copy alone {lap['copy_ms']:.1f} ms, both issued together {lap['both_ms']:.1f} ms: "
            f"{100 * lap['hidden']:.0f}% of the shorter one hidden behind the other (100% = fully overlapped).",
        ]
    else:
        lines += ["", "Copies: skipped (they need CUDA)."]
    lines += [
        "",
        "Notes: decode rows time `DecodeImage(normalize=False)` on batches of 256 JPEGs already in (pinned) "
        "memory, converted as the loader converts them; the device is synchronised after each batch. The fit "
        "rows time the steps after the warm-up on the host, synchronising the device only at the window's edges; "
        "'between steps' is the loop's time from the end of one `training_step` to the start of the next "
        "(fetching the next batch, copying it, decoding it on the device).",
        "",
    ]
    return "\n".join(lines)


def decode_table(decode: list[dict[str, Any]]) -> list[str]:
    """Images/s decoded on the CPU and by each device backend (None: the backend does not import)."""
    heads = "JPEG side | CPU, one thread per core | device, TorchCodec | device, torchvision | device / CPU (best)"
    rows = []
    for r in decode:
        best = max(r[b] for b in BACKENDS if r[b] is not None) / r["cpu"]
        cpu = f"{r['cpu']:,.0f} ({r['cores']} threads)"
        rows.append((f"{r['side']}x{r['side']}", cpu, *(r[b] for b in BACKENDS), f"{best:.2f}x"))
    return tables.table(heads, "> > >,.0f >,.0f >", rows, missing="— (does not import)")


def fit_section(fit: dict[str, Any]) -> list[str]:
    """The table of one fit: the Lance rows against the on-device baseline, each with its two targets."""
    ready = fit["ready"]

    def row(label: str, result: dict[str, float]) -> tuple:
        ratio, wait = result["step_ms"] / ready["step_ms"], result["wait_share"]
        ratio_text = f"{ratio:.3f}x ({'PASS' if ratio <= 1.05 else 'FAIL'})"
        wait_text = f"{100 * wait:.2f}% ({'PASS' if wait < 0.02 else 'FAIL'})"
        return label, f"{result['step_ms']:.1f} ms", ratio_text, wait_text, result["steps"]

    rows = [row("Lance (RowShuffle, decode on the device, `device_ahead=2`)", fit["lance"])]
    if "in_hooks" in fit:
        rows.append(row("Lance, copy and decode in the loop's hooks (`device_ahead=0`)", fit["in_hooks"]))
    rows += [row(variant_label(variant), variant) for variant in fit["variants"]]
    ready_wait = f"{100 * ready['wait_share']:.2f}%"
    rows.append(("batches already on the device", f"{ready['step_ms']:.1f} ms", "1x", ready_wait, ready["steps"]))
    heads = "fed from | step time | / on-device (target ≤ 1.05x) | between steps, waiting for data (target < 2%)"
    return [
        "",
        f"## ResNet-18 fit, bf16 mixed precision, batch {fit['batch']}, {fit['size']}x{fit['size']}",
        "",
        *tables.table(heads + " | steps timed", "< > > > >", rows),
        "",
        f"The train loader alone (read, convert, pin; no GPU work) delivers {fit['read']:,.0f} images/s; the "
        f"on-device fit consumes {1e3 * fit['batch'] / ready['step_ms']:,.0f} images/s.",
    ]


def measure(args: Params) -> str:
    variants = [parse_variant(v) for v in args.variants]
    if args.device not in ("cuda", "cpu"):
        raise SelectError(f"--set device={args.device}: cuda (the benchmark) or cpu (a smoke run at tiny sizes)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SelectError(
            "gpu: needs a CUDA device (torch.cuda.is_available() is False); nothing was measured. "
            "Run it on a GPU machine, or --set device=cpu for a smoke run."
        )
    if args.steps < 2:
        raise SelectError(f"--set steps={args.steps}: need at least 2 (one warm-up, one timed)")
    batch = 8 if args.device == "cpu" else BATCH
    if args.rows < args.steps * batch:
        raise SelectError(
            f"--set rows={args.rows}: one epoch must hold the {args.steps} steps of {batch} images, "
            f"so that no epoch boundary falls in the timed steps; use --set rows={args.steps * batch} or more"
        )
    warnings.filterwarnings("ignore", module="lightning")
    started = time.perf_counter()
    device = torch.device(args.device)
    smoke = device.type == "cpu"
    print("[1/3] decode", flush=True)
    # two batches per core keep every CPU thread busy
    decode = (
        []
        if args.skip_decode
        else decode_rates(
            device,
            [16, 32] if smoke else [64, 256],
            1 if smoke else max(8, 2 * (os.cpu_count() or 1)),
            0.01 if smoke else 1.0,
        )
    )
    print("[2/3] fit", flush=True)
    side, size = (40, 32) if smoke else (256, 224)
    uri = image_dataset(args.cache, args.rows, side)
    fit = fit_rates(
        uri,
        device,
        size,
        batch,
        args.steps,
        warmup=1 if smoke else 10,
        threads=2 if smoke else min(8, os.cpu_count() or 1),
        variants=variants,
    )
    fit2 = None
    if args.model2:
        print("[2/3] fit, second model", flush=True)
        batch2 = 8 if smoke else args.batch2
        steps2 = args.steps if smoke else args.steps2
        side2, size2 = (24, 16) if smoke else (144, 128)
        fit2 = fit_rates(
            image_dataset(args.cache, steps2 * batch2, side2),
            device,
            size2,
            batch2,
            steps2,
            warmup=1 if smoke else 10,
            threads=2 if smoke else min(8, os.cpu_count() or 1),
            variants=variants,
            in_hooks=False,
        )
    copies = lap = None
    if not smoke:
        print("[3/3] copies", flush=True)
        copies = copy_rates(device, 256, args.reps)
        lap = overlap(device, 512)
    return report(args, device, decode, fit, copies, lap, time.perf_counter() - started, fit2)
