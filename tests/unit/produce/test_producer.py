"""The transform pipeline: bounded prefetch, overlap with the step, worker processes, YAML config."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from jsonargparse import ArgumentParser

from lance_lightning import ConfigError, LanceDataModule, LanceSource
from lance_lightning.load.dataset import LanceIterableDataset
from lance_lightning.produce.badrows import ReplaceBadRow
from lance_lightning.transforms import Compose, DecodeImage, DeviceAugment
from tests.helpers import write_dataset
from tests.images import write_image_dataset


class CountingTransform:
    """Counts batches finished by the reader threads (shared by the threads of one process)."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.finished = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.seconds:
            time.sleep(self.seconds)  # stands for GIL-free decoding
        with self.lock:
            self.finished += 1
        return batch


class Fail:
    """A transform with a bug (not a bad row): raises a plain error on batch ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if int(batch["id"][0]) == self.at:
            raise KeyError("transform bug on purpose")
        return batch


def _plan(uri: str, batch_size: int = 8) -> Any:
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=batch_size)
    dm.setup("fit")
    return dm.plans["train"]


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_prefetch_is_bounded_by_prefetch_batches(tmp_path: Path, depth: int) -> None:
    plan = _plan(write_dataset(tmp_path / "ds.lance", 400))
    transform = CountingTransform()
    dataset = LanceIterableDataset(plan, transform=transform, reader_threads=2, prefetch_batches=depth)
    ahead = []
    for consumed, _ in enumerate(dataset, start=1):
        time.sleep(0.01)  # a slow step: the producers run as far ahead as they may
        ahead.append(transform.finished - consumed)
    assert max(ahead) <= depth, f"{max(ahead)} batches were prepared ahead, prefetch_batches={depth}"
    assert max(ahead) == depth, "the producers never filled the queue: no prefetching"


def test_prefetch_overlaps_the_step_and_off_does_not(tmp_path: Path) -> None:
    """A 20 ms step fed by 10 ms batches: with prefetch the step hardly waits; without it waits ~10 ms."""
    plan = _plan(write_dataset(tmp_path / "ds.lance", 240))
    waits = {}
    for threads in (2, 0):
        dataset = LanceIterableDataset(
            plan, transform=CountingTransform(0.01), reader_threads=threads, prefetch_batches=4
        )
        waited, steps = 0.0, 0
        iterator = iter(dataset)
        next(iterator)  # the first batch always waits for the pipeline to start
        while True:
            asked = time.perf_counter()
            try:
                next(iterator)
            except StopIteration:
                break
            waited += time.perf_counter() - asked
            steps += 1
            time.sleep(0.02)
        waits[threads] = waited / steps
    assert waits[0] > 0.008, waits  # off: each batch is prepared while the step waits
    assert waits[2] < 0.25 * waits[0], waits


def test_transform_bug_surfaces_with_its_type_and_threads_are_reused(tmp_path: Path) -> None:
    plan = _plan(write_dataset(tmp_path / "ds.lance", 200))
    before = threading.active_count()
    dataset = LanceIterableDataset(plan, transform=Fail(at=40), reader_threads=2, prefetch_batches=4)
    with pytest.raises(KeyError, match="on purpose"):
        list(dataset)
    running = threading.active_count()
    assert running <= before + 4  # one read and one transform pool of 2 threads
    dataset.transform = CountingTransform()
    for _ in range(3):  # later epochs run on the same threads (no new malloc arena per epoch)
        assert len(list(dataset)) == 25
        assert threading.active_count() == running
    dataset.pools.stop()
    deadline = time.time() + 5
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, "reader threads outlived stop()"


@pytest.mark.parametrize("with_transform", [False, True])
def test_abandoned_epoch_then_a_full_one(tmp_path: Path, with_transform: bool) -> None:
    plan = _plan(write_dataset(tmp_path / "ds.lance", 200))
    dataset = LanceIterableDataset(
        plan, transform=CountingTransform() if with_transform else None, reader_threads=2, prefetch_batches=2
    )
    iterator = iter(dataset)
    first = [next(iterator)["id"].tolist() for _ in range(3)]
    iterator.close()  # the consumer stops early (e.g. limit_train_batches)
    full = [batch["id"].tolist() for batch in dataset]
    assert full[:3] == first and len(full) == 25
    assert full == [list(range(i, i + 8)) for i in range(0, 200, 8)]


def test_decoding_in_worker_processes_and_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.images import assert_images_match_ids

    # Every batch from the workers: read ahead in this process while they start, and discarded at
    # the hand-over, would count as transformed too (`tests/unit/load/test_handoff.py`).
    monkeypatch.setenv("LANCE_LIGHTNING_WORKER_HANDOFF", "off")

    uri = write_image_dataset(tmp_path / "img.lance", 160)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "image"]),
        batch_size=16,
        transform=DecodeImage(size=8, normalize=False),
        num_workers=2,
        reader_threads=2,
    )
    batches = list(dm.train_dataloader())
    assert [b["id"].tolist() for b in batches] == [list(range(i, i + 16)) for i in range(0, 160, 16)]
    for batch in batches:
        assert_images_match_ids(batch["image"], batch["id"])
    assert dm.train_dataloader().dataset.clock.peek().get("transform_rows", 0) == 160


def test_datamodule_parameters_are_validated() -> None:
    source = LanceSource("unused")
    for kwargs, param in (
        ({"prefetch_batches": 0}, "prefetch_batches"),
        ({"take_group_bytes": 0}, "take_group_bytes"),
        ({"reader_threads": -1}, "reader_threads"),
        ({"transform": 3}, "transform"),
        ({"device_transform": "x"}, "device_transform"),
        ({"bad_rows": "replace"}, "bad_rows"),
        ({"pin_memory": "yes"}, "pin_memory"),
    ):
        with pytest.raises(ConfigError) as info:
            LanceDataModule(train=source, **kwargs)
        assert info.value.param == param
    assert LanceDataModule(train=source).reader_threads == min(4, os.cpu_count() or 1)
    with pytest.raises(ConfigError, match="max_attempts"):
        ReplaceBadRow(max_attempts=0)


def test_yaml_config_builds_the_whole_pipeline(tmp_path: Path) -> None:
    """What a LightningCLI ``data:`` section gives: class_path transforms, device stage, bad-row policy."""
    uri = write_image_dataset(tmp_path / "img.lance", 64)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(LanceDataModule, "data")
    config = parser.parse_object(
        {
            "data": {
                "train": {"uri": uri, "columns": ["id", "image", "label"]},
                "batch_size": 8,
                "prefetch_batches": 2,
                "transform": {
                    "class_path": "lance_lightning.transforms.Compose",
                    "init_args": {
                        "transforms": [
                            {
                                "class_path": "lance_lightning.transforms.DecodeImage",
                                "init_args": {"size": 8, "fit": "crop"},
                            }
                        ]
                    },
                },
                "device_transform": {
                    "class_path": "lance_lightning.transforms.DeviceAugment",
                    "init_args": {
                        "column": "image",
                        "transforms": [
                            {"class_path": "torchvision.transforms.v2.RandomHorizontalFlip", "init_args": {"p": 1.0}}
                        ],
                    },
                },
                "bad_rows": {"class_path": "lance_lightning.produce.badrows.ReplaceBadRow", "init_args": {"seed": 7}},
            }
        }
    )
    dm = parser.instantiate(config).data
    assert isinstance(dm.transform, Compose) and isinstance(dm.transform.transforms[0], DecodeImage)
    assert dm.transform.transforms[0].fit == "crop"
    assert isinstance(dm.device_transform, DeviceAugment)
    assert isinstance(dm.bad_rows, ReplaceBadRow) and dm.bad_rows.seed == 7
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (8, 3, 8, 8)
    flipped = dm.on_after_batch_transfer(batch, 0)["image"]
    assert torch.equal(flipped, batch["image"].flip(-1))
