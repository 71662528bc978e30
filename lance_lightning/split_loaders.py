"""Each split's `LanceDataLoader` for `LanceDataModule`, built for the trainer and topology that
read it.

Guarantees:
- A loader is built for a key: the trainer (or none) whose loop it reads, the world size and rank
  (the trainer's, read when the loader is built: rank 0 of 1 without one) and pinning. A loader
  built before the trainer attached (``train_dataloader()``, ``explain()`` or ``setup()`` called
  before ``fit``) is rebuilt for the trainer's topology, and a new trainer gets a new loader:
  nothing of an earlier trainer's loop is kept. A loader replaced or dropped has its reader
  threads stopped. Every rank yields the same number of batches (`check_fits` before a build).
- Data loading does not make the step wait: batches are read, transformed (decoded) and pinned
  ahead on ``reader_threads`` threads (and/or ``num_workers`` processes), at most
  ``prefetch_batches`` finished batches per process, then copied to the device without blocking,
  where ``device_transform`` runs: on CUDA ``device_ahead`` batches ahead of the step in a
  background thread (`DeviceAhead`), elsewhere in ``on_after_batch_transfer``, decided once per
  loader when it is built (`DevicePath`, by the data module's `DeviceStage`).
- It holds no data module: everything it uses is given to its constructor or to each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lance_lightning.cursor.tracker import CursorTracker
from lance_lightning.device.hooks import DeviceStage
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.load.loader import LanceDataLoader
from lance_lightning.plan.contract import Plan
from lance_lightning.plan.planner import check_fits
from lance_lightning.vocabulary import Split

#: The data module's arguments that each split's `LanceIterableDataset` takes as they are.
READING = (
    "transform",
    "fill_nulls",
    "reader_threads",
    "prefetch_groups",
    "prefetch_batches",
    "take_group_bytes",
    "bad_rows",
    "retry",
)
#: The data module's arguments that each `LanceDataLoader` takes as they are.
WORKERS = ("num_workers", "persistent_workers", "prefetch_factor", "multiprocessing_context")


class SplitLoaders:
    """The loaders of a data module's splits (see the module docstring).

    Args:
        device_stage: The data module's device stage, which decides each loader's device path.
        arguments: The data module's arguments, defaults resolved: those of each split's
            `LanceIterableDataset` (`READING`) and `LanceDataLoader` (`WORKERS`), and ``pin_memory``
            (``None``: when the trainer runs on CUDA).
    """

    def __init__(self, device_stage: DeviceStage, arguments: Mapping[str, Any]) -> None:
        self.device_stage = device_stage
        self.pin_memory: bool | None = arguments["pin_memory"]
        self.reading = {name: arguments[name] for name in READING}
        self.workers = {name: arguments[name] for name in WORKERS}
        #: Each split's loader and the (trainer attached, world size, rank, pinned) it was built for.
        self._built: dict[Split, tuple[tuple[Any, ...], LanceDataLoader]] = {}

    def key(self, trainer: Any, world_size: int, rank: int) -> tuple[Any, ...]:
        """What a loader is built for: the trainer (or none) whose loop it reads, the world size and
        rank, pinning. A new trainer gets a new loader: nothing of an earlier trainer's loop is kept."""
        return (trainer, world_size, rank, self._pin(trainer))

    def built(self, split: Split, key: tuple[Any, ...]) -> bool:
        """Whether ``split``'s loader is built for ``key``."""
        return self._built.get(split, (None,))[0] == key

    def get(
        self,
        split: Split,
        plan: Plan,
        trainer: Any,
        world_size: int,
        rank: int,
        *,
        cursor: CursorTracker | None,
        row_identity: bool,
        position_shifts: list[tuple[int, int]] | None,
    ) -> LanceDataLoader:
        """The split's loader for ``trainer`` and the topology (rebuilt when they changed); the
        train split's reads ``cursor`` and ``trainer``'s loop, the others count their own iterations."""
        key = self.key(trainer, world_size, rank)
        cached_key, loader = self._built.get(split, (None, None))
        if cached_key != key or loader is None:  # (no loader when none is cached: the key differs)
            check_fits(plan, world_size)  # also for a split `explain` planned
            self.drop(split)
            dataset = LanceIterableDataset(
                plan,
                world_size=world_size,
                rank=rank,
                row_identity=row_identity,
                position_shifts=position_shifts,
                **self.reading,
            )
            train = split == "train"
            device, model = (trainer.strategy.root_device, trainer.lightning_module) if trainer else (None, None)
            loader = LanceDataLoader(
                dataset,
                cursor=cursor if train else None,
                # Without a trainer the loader counts its own iterations (eval splits read epoch order 0).
                trainer=trainer if train else None,
                pin_memory=key[-1],
                device_path=self.device_stage.path(plan, device, model),  # ahead or in the hooks
                **self.workers,
            )
            self._built[split] = (key, loader)
        return loader

    def drop(self, split: Split) -> None:
        """Forget ``split``'s loader, stopping its reader threads."""
        _, loader = self._built.pop(split, (None, None))
        if loader is not None:
            loader.dataset.pools.stop()

    def stop(self) -> None:
        """Stop every loader's reader threads (restarted on the next iteration)."""
        for _, loader in self._built.values():
            loader.dataset.pools.stop()

    def _pin(self, trainer: Any) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory and torch.cuda.is_available()
        return trainer is not None and trainer.strategy.root_device.type == "cuda"
