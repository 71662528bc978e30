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

The sections live in `gpu_decode` (data, decode), `gpu_fit`, `gpu_copies` and `gpu_report`.
"""

from __future__ import annotations

import os
import time
import warnings

import torch

from benchmarks.harness.registry import SelectError
from benchmarks.harness.study import Params
from benchmarks.studies.gpu_copies import copy_rates, overlap
from benchmarks.studies.gpu_decode import BATCH, decode_rates, image_dataset
from benchmarks.studies.gpu_fit import fit_rates, parse_variant
from benchmarks.studies.gpu_report import report


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
