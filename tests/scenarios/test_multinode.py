"""Two nodes on loopback: ``torchrun --nnodes 2 --nproc-per-node 1`` runs ``lance-lightning fit``
as two node agents with a static rendezvous (the command `docs/distributed.md` quotes), then the
run resumes from its checkpoint on one node.

Checked: both ranks train the same number of batches, disjoint rows; every data epoch (cut by the
stop and finished by the one-node resume) trains every row exactly once; the epoch after the
resume is a new order of every row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from tests.helpers import run_cli_process, write_dataset
from tests.ports import free_port

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS, BATCH, STOP_STEPS = 640, 16, 30  # 20 steps per epoch on 2 ranks: the stop cuts epoch 1 in half
TIMEOUT_S = 300


class RankRecorder(pl.LightningModule):
    """Appends every training batch's ids to ``<out>/<tag>.rank<global rank>.jsonl``."""

    def __init__(self, out: str, tag: str) -> None:
        super().__init__()
        self.out, self.tag = Path(out), tag
        self.weight = nn.Parameter(torch.zeros(1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        line = {"epoch": self.current_epoch, "idx": batch_idx, "ids": batch["id"].tolist()}
        with (self.out / f"{self.tag}.rank{self.global_rank}.jsonl").open("a") as file:
            file.write(json.dumps(line) + "\n")
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _config(root: Path, uri: str, tag: str) -> Path:
    path = root / f"{tag}.yaml"
    path.write_text(f"""
trainer:
  max_epochs: 3
  logger: false
  enable_progress_bar: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root / "ckpts"}, every_n_train_steps: 5, save_last: true}}
    - class_path: lance_lightning.DataCursorCheckpoint
model:
  class_path: tests.scenarios.test_multinode.RankRecorder
  init_args: {{out: {root}, tag: {tag}}}
data:
  train:
    uri: {uri}
    columns: [id]
  shuffle:
    class_path: lance_lightning.RowShuffle
    init_args: {{seed: 7}}
  batch_size: {BATCH}
""")
    return path


def _two_nodes(root: Path, config: Path) -> list[tuple[int, str]]:
    """Start both node agents (node ranks 0 and 1) and wait for them; (exit status, output) each."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    agents = []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}",
            "--master-addr=127.0.0.1", f"--master-port={port}",
            "-m", "lance_lightning.cli", "fit", "--config", str(config),
            f"--trainer.max_steps={STOP_STEPS}",
            "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=2", "--trainer.strategy=ddp",
        ]  # fmt: skip
        agents.append(
            subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )  # fmt: skip
        )
    results = []
    try:
        for agent in agents:
            output, _ = agent.communicate(timeout=TIMEOUT_S)
            results.append((agent.returncode, output))
    finally:
        for agent in agents:  # a hung agent (and its worker) must not outlive the test
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return results


def _batches(root: Path, tag: str, rank: int) -> list[dict[str, Any]]:
    path = root / f"{tag}.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_nodes_train_every_row_once_and_resume_on_one_node(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)
    results = _two_nodes(tmp_path, _config(tmp_path, uri, "nodes"))
    for node, (code, output) in enumerate(results):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    ranks = [_batches(tmp_path, "nodes", rank) for rank in (0, 1)]
    assert [len(batches) for batches in ranks] == [STOP_STEPS, STOP_STEPS], "each rank trains the same steps"
    assert (tmp_path / "ckpts" / "last.ckpt").exists()

    code, output = run_cli_process(
        ["fit", "--config", str(_config(tmp_path, uri, "resumed")), "--trainer.max_epochs=4",
         "--trainer.accelerator=cpu", "--trainer.devices=1", "--ckpt_path", str(tmp_path / "ckpts" / "last.ckpt")],
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, output[-3000:]

    # The rows of each global step in training order: both ranks of a step on two nodes, then the resume.
    rows: list[int] = []
    for first, second in zip(*ranks):
        assert (first["epoch"], first["idx"]) == (second["epoch"], second["idx"])
        assert not set(first["ids"]) & set(second["ids"]), "two ranks trained the same row in one step"
        rows += first["ids"] + second["ids"]
    rows += [row for batch in _batches(tmp_path, "resumed", 0) for row in batch["ids"]]
    epochs = [rows[start : start + ROWS] for start in range(0, len(rows), ROWS)]
    # max_steps cut epoch 1 in half; resumed from last.ckpt under max_epochs=4, the rest of epoch 1
    # is trained first (Lightning had counted it finished), then epochs 2 and 3 whole.
    assert len(rows) == 4 * ROWS, f"trained {len(rows)} rows: 1.5 epochs on two nodes, then 2.5 on one"
    for number, epoch in enumerate(epochs):
        assert sorted(epoch) == list(range(ROWS)), f"data epoch {number} repeats or skips rows"
    assert len({tuple(epoch) for epoch in epochs}) == 4, "each epoch has its own order"
