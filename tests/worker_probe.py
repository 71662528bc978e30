"""Transforms that report from inside DataLoader worker processes (light: no Lightning import).

DataLoader workers started with ``forkserver`` import the module of the transform; this module
imports only the standard library and torch, so whatever else a worker has imported came with the
objects pickled to it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import torch
from torch.utils.data import get_worker_info


class RecordModules:
    """Adds ``lightning_imported`` (1 per row if the process has imported Lightning) and ``pid``."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["id"])
        imported = any(name == "lightning" or name.startswith("lightning.") for name in sys.modules)
        batch["lightning_imported"] = torch.full((rows,), int(imported))
        batch["pid"] = torch.full((rows,), os.getpid())
        return batch


class KillOnRow:
    """SIGKILLs its own process when a batch holds row id ``row``, unless it is ``main_pid``."""

    def __init__(self, row: int, main_pid: int) -> None:
        self.row = row
        self.main_pid = main_pid

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if os.getpid() != self.main_pid and self.row in batch["id"].tolist():
            os.kill(os.getpid(), signal.SIGKILL)
        return batch


class ToTuple:
    """Returns ``(x, id, pid)`` instead of a dict: a transform may change the batch type."""

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return batch["x"], batch["id"], torch.full((len(batch["id"]),), os.getpid())


class WidenRows:
    """Adds ``wide``: float32 per row, each the row's id, at least ``min_width`` per row and enough
    that every batch passes ``batch_bytes``: by default 1 MiB (each batch leaves a worker through a
    shared-memory slab of its own); ``WidenRows(98304, 1)`` makes batches of about 96 KiB, whose
    runs share a slab (`lance_lightning.produce.parcel.slab_run`)."""

    def __init__(self, batch_bytes: int = 1 << 20, min_width: int = 1200) -> None:
        self.batch_bytes = batch_bytes
        self.min_width = min_width

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["id"])
        width = max(self.min_width, -(-self.batch_bytes // (4 * max(1, rows))) + 1)
        batch["wide"] = batch["id"].to(torch.float32)[:, None].expand(-1, width).contiguous()
        return batch


class SlowInWorkers:
    """Adds ``pid`` like `RecordProcess`; holds the GIL for ``main_busy_s`` a batch outside
    DataLoader workers (a Python-heavy transform: the race may start workers for it) and sleeps
    ``worker_sleep_s`` a batch in them, so that the workers lose every trial whatever the load."""

    def __init__(self, main_busy_s: float = 0.015, worker_sleep_s: float = 0.2) -> None:
        self.main_busy_s = main_busy_s
        self.worker_sleep_s = worker_sleep_s

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if get_worker_info() is None:
            until = time.perf_counter() + self.main_busy_s
            while time.perf_counter() < until:
                pass
        else:
            time.sleep(self.worker_sleep_s)
        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch


class RecordProcess:
    """Adds ``pid``: the process that made the batch; sleeps ``main_delay_s`` per batch outside
    DataLoader workers, so a training process reading while its workers start is slower than they are."""

    def __init__(self, main_delay_s: float = 0.0) -> None:
        self.main_delay_s = main_delay_s

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.main_delay_s and get_worker_info() is None:
            time.sleep(self.main_delay_s)
        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch


class PythonRows:
    """A transform that holds the GIL as users' pure-Python ones do: a loop per row (a checksum of
    its ``vec`` values, ``rounds`` times; about 25 ms a batch of 8 on an idle core) adding
    ``checksum``, and ``pid``: the process that made the batch."""

    def __init__(self, rounds: int = 2000) -> None:
        self.rounds = rounds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        sums = []
        for row in batch["vec"].tolist():
            total = 0.0
            for _ in range(self.rounds):
                for value in row:
                    total = (total * 31 + value) % 1_000_003
            sums.append(total)
        batch["checksum"] = torch.tensor(sums)
        batch["pid"] = torch.full((len(sums),), os.getpid())
        return batch


class RecordImports:
    """Adds ``imported``: per row, one flag per module of ``names`` (1 if the process has imported
    it), and ``pid``: the process that made the batch."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["id"])
        flags = [int(name in sys.modules) for name in self.names]
        batch["imported"] = torch.tensor(flags, dtype=torch.int64).expand(rows, -1).clone()
        batch["pid"] = torch.full((rows,), os.getpid())
        return batch
