"""Ray, the optional extra (``uv sync --extra ray``), on a real local Ray instance (2 CPUs).

Checked:
- The GPT example's tokenize-and-write step on Ray Data with lance-ray (``prepare(..., ray=True)``,
  ``--ray``) writes the same tokenizer and, for every dataset, the same table (the token column
  first of all) in the same order as the default single-process path, over several fragments.
- `LanceDataModule` trained by Ray Train's Lightning integration (`TorchTrainer`, 2 workers on CPU,
  gloo, `RayDDPStrategy`, `RayLightningEnvironment`, `prepare_trainer`): each worker sees world
  size 2 and its own rank, the workers train the same number of batches and disjoint rows, every
  row of an epoch once. Stopped mid-epoch, the run resumes from the `ray.train.Checkpoint` Ray
  reported (`TorchTrainer(resume_from_checkpoint=...)`): the resumed epoch trains exactly the rows
  not yet trained, and the next epoch every row once, in a new order.
- ``prepare`` with ``pool="ray"`` (units written by Ray tasks, committed in order by the driver)
  writes the thread pool's dataset row for row, resumes after the units committed before an
  interruption, and without Ray is a `ConfigError` naming the extra.

Every worker appends the ids of each batch it trains to ``<tmp>/<tag>.rank<r>.jsonl``. Skipped,
with the reason, without the extra.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Under `uv run`, Ray by default starts its workers with `uv run` in a copy of the working directory
# (a new environment per session); on one machine they must use this interpreter. Read at import.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
ray = pytest.importorskip("ray", reason="needs the ray extra: uv sync --extra ray")
# Found, not imported: Ray Train's controller and workers import this module for `train_loop`, and
# lance_ray's import (Ray Data's) cost each of them seconds; the tests that write with it import it.
if importlib.util.find_spec("lance_ray") is None:
    pytest.skip("needs the ray extra: uv sync --extra ray", allow_module_level=True)

# Lance, torch, Lightning and `tests.helpers` are imported where they are used: Ray Train's
# controller imports this module for `train_loop` and runs none of them (Lightning's import alone,
# torchmetrics' and torchvision's with it, took it seconds of CPU per run); the workers import
# them in `train_loop`.

# Ray starts worker processes that import torch and Lightning per stage: past 300 s at load 15-25.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROWS, BATCH, WORKERS = 320, 16, 2
STEPS_PER_EPOCH = ROWS // (BATCH * WORKERS)  # 10
STOP_STEP, REPORT_EVERY = 15, 5  # the first fit stops halfway through epoch 1, on a reported step


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray instance of 2 CPUs for this file's tests, shut down after them (a start costs
    seconds; each test writes under its own ``tmp_path`` and names its own Ray Train runs there).

    Ray Train's controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s): a
    worker's ``ray.train.report`` waits for the poll that takes the one before (a queue of one), so
    with a report every 5 steps the training waited on the clock. Polled every 0.2 s instead; a
    poll that a loaded machine answers late is only a missed health check (a worker counts as dead
    after ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``, 10 minutes)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # the driver hands it to the controller
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


# -- (a) the GPT example's tokenize-and-write step on Ray Data --------------------------------------
def test_gpt_tokenize_on_ray_data_writes_the_single_process_tables(
    tmp_path: Path, local_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lance

    from examples import gpt_mixture
    from examples.gpt_mixture import DATASETS, prepare

    monkeypatch.setattr(gpt_mixture, "RAY_DOCS_PER_FILE", 64)  # several write tasks and files per dataset
    # Both runs read the same corpora (the standard library's sources, the packages' texts: 1.7 s of
    # CPU a read here): read once, each run thins and tokenizes them itself.
    for reader in ("code_documents", "prose_documents"):
        monkeypatch.setattr(gpt_mixture, reader, functools.cache(getattr(gpt_mixture, reader)))

    single = prepare(str(tmp_path / "single"), max_bytes=400_000, vocab_size=512)
    on_ray = prepare(str(tmp_path / "ray"), max_bytes=400_000, vocab_size=512, ray=True)

    assert (Path(on_ray) / "tokenizer.json").read_bytes() == (Path(single) / "tokenizer.json").read_bytes()
    for name in DATASETS:
        expected = lance.dataset(os.path.join(single, f"{name}.lance")).to_table()
        written = lance.dataset(os.path.join(on_ray, f"{name}.lance"))
        table = written.to_table()
        assert table.num_rows == expected.num_rows > 0, name
        assert table["tokens"].to_pylist() == expected["tokens"].to_pylist(), f"{name}: token column differs"
        assert table.schema == expected.schema and table.equals(expected), f"{name}: another table or row order"
    code = lance.dataset(os.path.join(on_ray, "code.lance"))
    assert len(code.get_fragments()) > 1, "one write task: the order across Ray tasks was not exercised"


# -- (b) training inside Ray Train's Lightning integration ------------------------------------------
def test_ray_checkpoint_report_refuses_settings_that_never_report() -> None:
    from lance_lightning.errors import ConfigError
    from lance_lightning.integrations.ray import RayCheckpointReport

    with pytest.raises(ConfigError, match="every_n_train_steps"):
        RayCheckpointReport(every_n_train_steps=0)
    with pytest.raises(ConfigError, match="on_train_epoch_end"):
        RayCheckpointReport(every_n_train_steps=None, on_train_epoch_end=False)


def rank_recorder(out: str, tag: str) -> Any:
    """A LightningModule that appends every training batch's ids, with the topology it was trained
    in, to ``<out>/<tag>.rank<r>.jsonl`` (its class made here: Lightning is imported in the worker)."""
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class RankRecorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.out, self.tag = Path(out), tag
            self.weight = nn.Parameter(torch.zeros(1))

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            datamodule = self.trainer.datamodule
            line = {
                "epoch": self.current_epoch,
                "step": self.global_step,
                "ids": batch["id"].tolist(),
                "ray_rank": ray.train.get_context().get_world_rank(),
                "data_rank": datamodule.global_rank,
                "data_world": datamodule.world_size,
            }
            with (self.out / f"{self.tag}.rank{self.global_rank}.jsonl").open("a") as file:
                file.write(json.dumps(line) + "\n")
            return (self.weight - 1.0).pow(2).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return RankRecorder()


def train_loop(config: dict[str, Any]) -> None:
    """The function each Ray Train worker runs: the recipe of docs/distributed.md#ray."""
    import lightning.pytorch as pl
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from lance_lightning import DataCursorCheckpoint, LanceDataModule, LanceSource, RowShuffle
    from lance_lightning.integrations.ray import RayCheckpointReport, lightning_checkpoint

    datamodule = LanceDataModule(
        train=LanceSource(config["uri"], columns=["id"]),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=7),
        reader_threads=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[DataCursorCheckpoint(), RayCheckpointReport(every_n_train_steps=REPORT_EVERY)],
        max_epochs=config["max_epochs"],
        max_steps=config["max_steps"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer = prepare_trainer(trainer)
    # The checkpoint given in the config, else the one Ray resumes the run from, else None.
    with lightning_checkpoint(config.get("checkpoint")) as ckpt_path:
        trainer.fit(rank_recorder(config["out"], config["tag"]), datamodule=datamodule, ckpt_path=ckpt_path)


def _fit_on_ray(tmp_path: Path, config: dict[str, Any], name: str) -> Any:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # pytest imports this file as `test_ray`; Ray's workers import the loop by its package name.
    loop = importlib.import_module("tests.scenarios.test_ray").train_loop
    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray_results")),
    )
    return trainer.fit()


def _batches(root: Path, tag: str) -> list[list[dict[str, Any]]]:
    ranks = []
    for rank in range(WORKERS):
        path = root / f"{tag}.rank{rank}.jsonl"
        ranks.append([json.loads(line) for line in path.read_text().splitlines()] if path.exists() else [])
    return ranks


def _rows_of_epoch(ranks: list[list[dict[str, Any]]], epoch: int) -> list[int]:
    """The epoch's rows in global training order (step by step, rank 0 then rank 1), checking the
    ranks' topology, equal batches per rank and disjoint rows within each step."""
    steps = [[batch for batch in batches if batch["epoch"] == epoch] for batches in ranks]
    assert len({len(batches) for batches in steps}) == 1, f"epoch {epoch}: unequal batches per worker"
    rows: list[int] = []
    for rank, batches in enumerate(steps):
        for batch in batches:
            assert (batch["ray_rank"], batch["data_rank"], batch["data_world"]) == (rank, rank, WORKERS), batch
            assert len(batch["ids"]) == BATCH
    for same_step in zip(*steps):
        assert len({batch["step"] for batch in same_step}) == 1, "the workers' batches are out of step"
        assert not set(same_step[0]["ids"]) & set(same_step[1]["ids"]), "two workers trained the same row in one step"
        rows += [row for batch in same_step for row in batch["ids"]]
    return rows


@pytest.mark.parametrize("resume", ["same_run", "checkpoint_in_config"])
def test_ray_train_trains_every_row_once_and_resumes_exactly(tmp_path: Path, local_ray: None, resume: str) -> None:
    """``same_run``: the stopped run started again (same `RunConfig` name and storage path), Ray
    hands its latest checkpoint to ``ray.train.get_checkpoint()``. ``checkpoint_in_config``: the
    `ray.train.Checkpoint` of the stopped run's result, given to a new run in its config (Ray
    Train V2's replacement of ``TorchTrainer(resume_from_checkpoint=...)``, which it refuses)."""
    import torch

    from lance_lightning.integrations.ray import lightning_checkpoint
    from tests.helpers import write_dataset

    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)
    config = {"uri": uri, "out": str(tmp_path), "max_epochs": 3}

    stopped = _fit_on_ray(tmp_path, {**config, "tag": "first", "max_steps": STOP_STEP}, "first")
    assert stopped.error is None, stopped.error
    first = _batches(tmp_path, "first")
    assert [len(batches) for batches in first] == [STOP_STEP, STOP_STEP], "each worker trains the same steps"
    epoch0 = _rows_of_epoch(first, 0)
    assert sorted(epoch0) == list(range(ROWS)), "epoch 0 on 2 Ray workers repeats or skips rows"
    epoch1_before = _rows_of_epoch(first, 1)
    assert len(epoch1_before) == (STOP_STEP - STEPS_PER_EPOCH) * BATCH * WORKERS

    assert stopped.checkpoint is not None, "Ray reported no checkpoint"
    with lightning_checkpoint(stopped.checkpoint) as path:
        saved = torch.load(path, map_location="cpu", weights_only=False)
    assert (saved["global_step"], saved["epoch"]) == (STOP_STEP, 1), "the last reported checkpoint is mid-epoch 1"

    again = {**config, "tag": "resumed", "max_steps": -1}
    if resume == "same_run":
        resumed = _fit_on_ray(tmp_path, again, "first")
    else:
        resumed = _fit_on_ray(tmp_path, {**again, "checkpoint": stopped.checkpoint}, "resumed")
    assert resumed.error is None, resumed.error
    after = _batches(tmp_path, "resumed")
    assert {batch["epoch"] for batches in after for batch in batches} == {1, 2}
    assert min(batch["step"] for batches in after for batch in batches) == STOP_STEP, "resumed at another step"
    epoch1_after = _rows_of_epoch(after, 1)
    assert not set(epoch1_before) & set(epoch1_after), "the resumed epoch trains rows trained before the stop"
    assert sorted(epoch1_before + epoch1_after) == list(range(ROWS)), "epoch 1 (stopped, resumed) skips rows"
    epoch2 = _rows_of_epoch(after, 2)
    assert sorted(epoch2) == list(range(ROWS)), "the epoch after the resume repeats or skips rows"
    assert epoch0 != epoch1_before + epoch1_after != epoch2, "each epoch has its own order"


# -- (c) `prepare --pool ray`: units written by Ray tasks, committed in order by the driver ---------
def test_prepare_on_ray_tasks_writes_the_thread_pools_dataset_and_resumes(
    tmp_path: Path, local_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import lance

    from lance_lightning.errors import ConfigError
    from lance_lightning.source import Prepare
    from lance_lightning.write.ledger import DONE_KEY
    from lance_lightning.write.prepare import prepare
    from lance_lightning.write.writer import DatasetWriter
    from tests.unit.write.inputs import parquet_files

    root = parquet_files(tmp_path / "in", files=5, rows=7)
    spec = {"format": "parquet", "input": str(root), "workers": 2, "unit_files": 1}
    threads = prepare(Prepare(**spec), str(tmp_path / "threads.lance"), progress=False)
    expected = lance.dataset(str(tmp_path / "threads.lance"))

    # interrupted after its first 2 unit commits, then rerun: it resumes after them
    commit = DatasetWriter.commit

    def commit_two(self: DatasetWriter, unit: Any, *args: Any) -> None:
        if unit.index == 2:
            raise KeyboardInterrupt
        commit(self, unit, *args)

    with monkeypatch.context() as patch:
        patch.setattr(DatasetWriter, "commit", commit_two)
        with pytest.raises(KeyboardInterrupt):
            prepare(Prepare(**spec, pool="ray"), str(tmp_path / "ray.lance"), progress=False)
    resumed = prepare(Prepare(**spec, pool="ray"), str(tmp_path / "ray.lance"), progress=False)
    assert (resumed.status, resumed.units_adopted, resumed.pool) == ("resumed", 2, "ray")
    assert resumed.rows == threads.rows == 35

    written = lance.dataset(str(tmp_path / "ray.lance"))
    assert written.to_table().equals(expected.to_table()), "another table or row order than the thread pool's"
    assert len(written.get_fragments()) == 5, "one fragment per unit"
    assert json.loads(written.config()[DONE_KEY]) == json.loads(expected.config()[DONE_KEY]), "another record"
    assert prepare(Prepare(**spec, pool="ray"), str(tmp_path / "ray.lance"), progress=False).status == "complete"

    monkeypatch.setitem(sys.modules, "ray", None)  # as without the extra
    with pytest.raises(ConfigError, match="uv sync --extra ray"):
        prepare(Prepare(**spec, pool="ray"), str(tmp_path / "none.lance"), progress=False)
