"""Where a Lance-fed ResNet-18 fit loses time on a GPU: the diagnostics behind results/gpu.md.

Not a benchmark of record (`python -m benchmarks all` does not run it); it prints, on a CUDA machine:

1. ``decode``: host time per call and GPU span per call of ``DecodeImage(size=224, device="cuda")``
   on a pinned batch of 256 JPEGs of 256x256 (equal spans mean the call blocks until its kernels end).
2. ``gil``: the speed of a Python loop on this thread while another thread GPU-decodes, against
   the loop alone (1.0: the decode holds no GIL).
3. ``fit``: ms per step (50 timed steps after 10) and the share between steps, for GPU decode with
   ``device_ahead`` 2 and 4 at stream priorities 0, -1 and -5 (``--priorities``), and CPU decode on
   8 and 14 reader threads (``--cpu-decode``).
4. ``nvimgcodec`` (``--nvimgcodec``, needs ``nvidia-nvimgcodec-cu13`` and nvJPEG): images/s of its
   hardware, GPU-only and hybrid backends, and the fit fed through its hardware backend.

Usage (from the repository root)::

    python benchmarks/probes/probe_gpu_fit.py --priorities --cpu-decode [--nvimgcodec]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

import lightning.pytorch as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
import torchvision.transforms.v2.functional as F  # noqa: E402

import lance_lightning.device.ahead as ahead  # noqa: E402
from benchmarks.studies import gpu_decode as D  # noqa: E402
from benchmarks.studies import gpu_fit as B  # noqa: E402
from lance_lightning import LanceDataModule, LanceSource, RowShuffle, to_torch_batch  # noqa: E402
from lance_lightning.produce.producer import pin_batch  # noqa: E402
from lance_lightning.transforms import DecodeImage  # noqa: E402


def decode_spans(decode: DecodeImage, batch: dict[str, Any]) -> None:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        first.record(stream)
        for _ in range(10):
            decode(batch)
        host = (time.perf_counter() - started) / 10
        last.record(stream)
    last.synchronize()
    print(f"decode: host {1e3 * host:.1f} ms/call, GPU span {first.elapsed_time(last) / 10:.1f} ms/call")


def gil(decode: DecodeImage, batch: dict[str, Any]) -> None:
    def spin(seconds: float) -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin(1.0)
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            decode(batch)
            torch.cuda.synchronize()

    thread = threading.Thread(target=work)
    thread.start()
    time.sleep(0.2)
    busy = spin(1.0)
    stop.set()
    thread.join()
    print(f"gil: a Python loop runs at {busy / alone:.2f}x its solo speed while another thread decodes")


def fit(uri: str, name: str, **data: Any) -> None:
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"]),
        batch_size=256,
        shuffle=RowShuffle(seed=0, clump_rows=64),
        reader_threads=data.pop("reader_threads", 8),
        **data,
    )
    clock = B.StepClock(10)
    trainer = pl.Trainer(callbacks=[clock], **B.fit_trainer_kwargs("cuda", 60))
    trainer.fit(B.ResNet(), datamodule=dm)
    result = clock.result()
    print(f"fit {name}: {result['step_ms']:.1f} ms/step, between {100 * result['wait_share']:.1f}%", flush=True)


def with_priority(priority: int) -> None:
    """Make the ahead thread's stream use ``priority``."""

    def stream(self: ahead.AheadThread) -> Any:
        torch.cuda.set_device(self.ahead.device)
        return torch.cuda.Stream(self.ahead.device, priority=priority)

    ahead.AheadThread._stream = stream


class NvDecode:
    """A throw-away device transform through nvImageCodec (not a backend: it measured slower)."""

    host_columns = ("image",)

    def __init__(self, kind: str) -> None:
        self.kind, self.decoder = kind, None

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from nvidia import nvimgcodec

        if self.decoder is None:
            backend = nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, self.kind))
            self.decoder = nvimgcodec.Decoder(backends=[backend])
        column = batch["image"]
        bounds, values = column.offsets.tolist(), column.values.numpy()
        streams = [nvimgcodec.CodeStream(values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        images = self.decoder.decode(streams, cuda_stream=torch.cuda.current_stream().cuda_stream)
        x = torch.stack([torch.as_tensor(image, device="cuda") for image in images]).permute(0, 3, 1, 2)
        x = F.resize(x, [224, 224], antialias=True)
        return {**batch, "image": F.normalize(x.float().div_(255), D.MEAN, D.STD)}


def nvimgcodec_rates(blobs: list[bytes]) -> None:
    from nvidia import nvimgcodec

    for kind in ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU"):
        try:
            decoder = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))])
        except RuntimeError as error:
            print(f"nvimgcodec {kind}: {error}")
            continue

        def once(decoder: Any = decoder) -> None:
            streams = [nvimgcodec.CodeStream(b) for b in blobs]
            images = decoder.decode(streams, cuda_stream=torch.cuda.current_stream().cuda_stream)
            torch.stack([torch.as_tensor(image, device="cuda") for image in images])

        once()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            once()
        torch.cuda.synchronize()
        print(f"nvimgcodec {kind}: {20 * len(blobs) / (time.perf_counter() - started):,.0f} images/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--priorities", action="store_true", help="fits at stream priorities 0, -1, -5")
    parser.add_argument("--cpu-decode", action="store_true", help="fits decoding on the reader threads")
    parser.add_argument("--nvimgcodec", action="store_true", help="nvImageCodec rates and fit")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/benchdata"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_gpu_fit: needs a CUDA device", file=sys.stderr)
        return 2
    blobs = D.jpegs(256, 256)
    batch = pin_batch(to_torch_batch(pa.table({"image": pa.array(blobs, pa.binary())})))
    decode = DecodeImage(size=224, mean=D.MEAN, std=D.STD, device="cuda")
    for _ in range(3):
        decode(batch)
    torch.cuda.synchronize()
    decode_spans(decode, batch)
    gil(decode, batch)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    uri = D.image_dataset(args.data_dir, 256 * 64, 256)
    for priority in (0, -1, -5) if args.priorities else (0,):
        with_priority(priority)
        for depth in (2, 4):
            fit(uri, f"ahead={depth} priority {priority}", device_transform=decode, device_ahead=depth)
    if args.cpu_decode:
        cpu = DecodeImage(size=224, mean=D.MEAN, std=D.STD)
        for threads in (8, 14):
            fit(
                uri,
                f"cpu decode in {threads} reader threads",
                transform=cpu,
                reader_threads=threads,
                prefetch_batches=8,
            )
    if args.nvimgcodec:
        nvimgcodec_rates(blobs)
        for depth in (2, 0):
            nv = NvDecode("HW_GPU_ONLY")
            fit(uri, f"nvimgcodec HW_GPU_ONLY device_ahead={depth}", device_transform=nv, device_ahead=depth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
