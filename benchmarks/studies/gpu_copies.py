"""The gpu study's copy section (CUDA only): `DeviceTransfer`'s host-to-device bandwidth against a
plain pinned copy, and proof that its side-stream copy overlaps compute.

Guarantees: every figure is timed with CUDA events; `copy_rates` keeps the best of ``reps``,
`overlap` the best of three windows of each kind.
"""

from __future__ import annotations

from typing import Any

import torch

from lance_lightning.device.transfer import DeviceTransfer
from lance_lightning.produce.producer import pin_batch


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
