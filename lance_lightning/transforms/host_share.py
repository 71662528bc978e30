"""A GPU decode split with the CPU: the first rows of a batch decoded on host threads meanwhile.

Guarantees:
- `HostShare.rows` is how many of a batch's first rows the CPU takes: ``round(share * n)``
  (0 for ``share=0``, the default: the GPU decodes every JPEG, as before).
- `HostShare.submit` starts decoding those rows on a pool of ``threads`` threads (named
  ``lance-decode-host``, created on first use, one chunk of consecutive rows per thread, each in
  the compiled loop that holds no GIL) and returns at once, so the caller's batched GPU decode of
  the other rows runs meanwhile. `Pending.result` returns the images in row order on the device:
  each chunk is put in pinned memory on its thread and copied without blocking on the caller's
  current CUDA stream (so the copy is ordered with the rest of the caller's work on that stream).
- A row that does not decode raises `ImageDecodeError` naming it, as a CPU decode does; where a
  row of the GPU's part fails too, `Pending.first_error` lets the caller raise the lower row first.
- The pool is never pickled or deep-copied (a copy makes its own on first use), so the transform
  still travels to DataLoader workers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from lance_lightning.errors import ConfigError, ImageDecodeError

#: ``chunk(start, stop)`` decodes rows ``[start, stop)``: a stacked (n, C, H, W) tensor or a list of images.
Chunk = Callable[[int, int], "torch.Tensor | list[torch.Tensor]"]


def default_threads() -> int:
    """Host decode threads when none are named: half the cores (the rest read, convert and launch), 1..8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class HostShare:
    """The CPU's share of a device decode (see the module docstring).

    Args:
        share: The fraction of each batch's rows (its first rows) decoded on the CPU, in [0, 1].
        threads: Host decode threads (``None``: `default_threads`).
    """

    def __init__(self, share: float = 0.0, threads: int | None = None) -> None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= float(share) <= 1.0:
            raise ConfigError(
                "DecodeImage.cpu_share",
                share,
                "must be a fraction in [0, 1]",
                "e.g. cpu_share=0.5 decodes the first half of each batch on CPU threads, the rest on the GPU",
            )
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError("DecodeImage.cpu_threads", threads, "must be a positive int or None", "e.g. 8")
        self.share = float(share)
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HostShare(share={self.share!r}, threads={self.threads!r})"

    def rows(self, n: int) -> int:
        """How many of a batch's first ``n`` rows the CPU decodes."""
        return min(n, max(0, round(self.share * n)))

    def submit(self, chunk: Chunk, count: int, device: torch.device) -> Pending:
        """Start decoding rows ``[0, count)`` with ``chunk`` on the pool; the images are due on ``device``."""
        pool = self._started()
        workers = self.threads or default_threads()
        step = -(-count // workers)
        pin = device.type == "cuda"
        futures = [
            pool.submit(_pinned if pin else _plain, chunk, start, min(count, start + step))
            for start in range(0, count, step)
        ]
        return Pending(futures, device)

    def close(self) -> None:
        """End the pool's threads (a later `submit` starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _started(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.threads or default_threads(), thread_name_prefix="lance-decode-host"
                )
            return self._pool

    def __getstate__(self) -> dict[str, Any]:
        return {"share": self.share, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["share"], state["threads"])  # type: ignore[misc]

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)


def _plain(chunk: Chunk, start: int, stop: int) -> tuple[int, torch.Tensor | list[torch.Tensor]]:
    return start, chunk(start, stop)


def _pinned(chunk: Chunk, start: int, stop: int) -> tuple[int, torch.Tensor | list[torch.Tensor]]:
    """Rows ``[start, stop)`` decoded, in pinned memory (so that the copy to the GPU does not block)."""
    images = chunk(start, stop)
    if isinstance(images, torch.Tensor):
        return start, images.pin_memory()
    return start, [image.pin_memory() for image in images]


class Pending:
    """The host rows of one batch being decoded; `result` waits for them."""

    def __init__(self, futures: list[Future[Any]], device: torch.device) -> None:
        self.futures = futures
        self.device = device

    def first_error(self) -> ImageDecodeError | None:
        """Waits for every chunk; the error of the lowest bad row among them, or None."""
        errors = [f.exception() for f in self.futures]
        bad = [e for e in errors if isinstance(e, ImageDecodeError)]
        if bad:
            return min(bad, key=lambda e: e.index)
        other = next((e for e in errors if e is not None), None)
        if other is not None:
            raise other
        return None

    def result(self) -> list[torch.Tensor]:
        """The host rows' images in row order, on the device (copies issued on the current stream)."""
        error = self.first_error()
        if error is not None:
            raise error
        out: list[torch.Tensor] = []
        for future in self.futures:
            _, images = future.result()
            if isinstance(images, torch.Tensor):
                out.extend(images.to(self.device, non_blocking=True).unbind(0))
            else:
                out.extend(image.to(self.device, non_blocking=True) for image in images)
        return out
