"""The gpu study's fit section: a ResNet-18 fit fed by ``LanceDataModule`` against the same fit fed
from batches already on the device, with the ``variants`` rows (see `benchmarks.studies.gpu`).

Guarantees: `fit_rates` times every fit over the steps after the warm-up with `StepClock` (the
device synchronised only at the window's edges) and reads the train loader alone with `read_rate`;
`parse_variant` refuses a malformed variant with a `SelectError` naming it.
"""

from __future__ import annotations

import time
from typing import Any

import lance
import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from benchmarks.harness.registry import SelectError
from benchmarks.studies.gpu_decode import CLASSES, MEAN, STD, sync
from lance_lightning import LanceDataModule, LanceSource, RowShuffle, to_torch_batch
from lance_lightning.transforms import DecodeImage


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
