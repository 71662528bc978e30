"""Resume after a real interruption is exact: on another world size, after SIGKILL, from ``last.ckpt``.

What the tests establish:
- a checkpoint written by 2 DDP ranks resumes on 1, and one written on 1 resumes on 2 (CPU, a
  subprocess), in the uninterrupted global order: no row twice, none lost but the new tail;
- a process killed (SIGKILL) mid-epoch resumes from its last loadable checkpoint exactly;
- a ``save_last`` checkpoint older than the last trained step resumes exactly at its own step.

Every test trains with a real Trainer on a real Lance dataset (the `uri` fixture of
tests/scenarios/conftest.py, 300 rows in 3 fragments, or one of its own) and resumes from a real
checkpoint file (a real SIGKILL, a real DDP launch).
Run A trains to step k (``max_steps=k``) and saves ``step=k.ckpt`` with
``ModelCheckpoint(every_n_train_steps=k)``; run B resumes from it; run C trains uninterrupted.
Exact means: A's first k batches followed by B's batches equal C's batches, same ids, same order.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.harness import BATCH, DM_KEY, FILTER, assert_exact, ckpt_file, fit, make_dm, subprocess_env
from tests.helpers import RecordingModel, flat, write_dataset
from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = REPO_ROOT / "tests" / "resume_worker.py"


# -- 1. across world sizes (DDP on CPU, subprocess) -------------------------------------------------


def _worker_env() -> dict[str, str]:
    return {**subprocess_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def run_worker(out: Path, *args: str, timeout: float = 240) -> list[dict[str, Any]]:
    """Run tests/resume_worker.py; return each rank's result (rank order)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(WORKER), "--out", str(out), *args]
    proc = subprocess.run(cmd, env=_worker_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = [json.loads(p.read_text()) for p in sorted(out.glob("ids_rank*.json"))]
    assert results, f"no ids written:\n{proc.stderr[-3000:]}"
    return sorted(results, key=lambda r: r["rank"])


def interleave(ranks: list[list[list[int]]]) -> list[int]:
    """The global sequence: step by step, rank 0's batch, then rank 1's, ..."""
    steps = {len(r) for r in ranks}
    assert len(steps) == 1, f"ranks trained different numbers of steps: {[len(r) for r in ranks]}"
    return [i for step in zip(*ranks) for batch in step for i in batch]


def full_sequence(root: Path, uri: str, shuffle: str, filter: str | None, batch_size: int) -> list[int]:
    """The whole epoch-0 sequence (no tail dropped), from an uninterrupted 1-device run."""
    model = fit(root, make_dm(uri, shuffle, filter, batch_size=batch_size, drop_last=False), name="full")
    return flat(model.seen)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world_a", "world_b", "shuffle", "filter", "k"),
    [
        (2, 1, "shard:32:1", FILTER, 5),
        (1, 2, "row:2", None, 7),
    ],
    ids=["ddp2-to-1", "1-to-ddp2"],
)
def test_resume_across_world_sizes(
    tmp_path: Path, uri: str, world_a: int, world_b: int, shuffle: str, filter: str | None, k: int
) -> None:
    batch = 8
    common = ["--uri", uri, "--batch-size", str(batch), "--shuffle", shuffle]
    if filter:
        common += ["--filter", filter]
    ckpt_dir = tmp_path / "ckpt_A"

    if world_a == 1:
        a = fit(tmp_path, make_dm(uri, shuffle, filter, batch_size=batch), name="A", ckpt_every=k, max_steps=k)
        a_ranks = [a.seen]
    else:
        results = run_worker(
            tmp_path / "A",
            *common,
            "--devices",
            str(world_a),
            "--max-steps",
            str(k),
            "--ckpt-every",
            str(k),
            "--ckpt-dir",
            str(ckpt_dir),
        )
        assert [r["world_size"] for r in results] == [world_a] * world_a
        a_ranks = [r["seen"] for r in results]
    ckpt = ckpt_file(tmp_path, "A", k)
    cursor = torch.load(ckpt, weights_only=True)[DM_KEY]["train_cursor"]
    assert cursor["rows_consumed"] == k * world_a * batch and cursor["steps"] == k

    if world_b == 1:
        b = fit(tmp_path, make_dm(uri, shuffle, filter, batch_size=batch), name="B", ckpt_path=ckpt)
        b_ranks = [b.seen]
    else:
        results = run_worker(tmp_path / "B", *common, "--devices", str(world_b), "--ckpt-path", str(ckpt))
        assert [r["world_size"] for r in results] == [world_b] * world_b
        b_ranks = [r["seen"] for r in results]

    a_ids, b_ids = interleave([r[:k] for r in a_ranks]), interleave(b_ranks)
    trained = a_ids + b_ids
    sequence = full_sequence(tmp_path, uri, shuffle, filter, batch)
    assert len(trained) == len(set(trained)), "a row was trained twice across the topology change"
    assert trained == sequence[: len(trained)], "resumed order differs from the uninterrupted sequence"
    missing = set(sequence) - set(trained)
    assert missing == set(sequence[len(trained) :]), "rows other than the epoch tail were lost"
    assert len(missing) < world_b * batch, f"{len(missing)} rows lost, more than the drop_last tail"


# -- 2. SIGKILL mid-epoch ---------------------------------------------------------------------------
def _loadable_steps(ckpt_dir: Path) -> list[int]:
    steps = []
    for path in ckpt_dir.glob("step=*.ckpt"):
        try:
            torch.load(path, weights_only=True, map_location="cpu")
        except Exception:  # noqa: BLE001 (a file caught mid-write is not a usable checkpoint)
            continue
        steps.append(int(path.stem.split("=")[1]))
    return sorted(steps)


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds640.lance", 640, fragment_rows=160)
    shuffle, every = "row:2:4", 5
    ckpt_dir = tmp_path / "ckpt_A"
    ids_log = tmp_path / "A" / "ids.jsonl"
    ids_log.parent.mkdir()
    cmd = [
        sys.executable,
        str(WORKER),
        "--out",
        str(tmp_path / "A"),
        "--uri",
        uri,
        "--batch-size",
        str(BATCH),
        "--shuffle",
        shuffle,
        "--sleep",
        "0.05",
        "--ckpt-every",
        str(every),
        "--ckpt-dir",
        str(ckpt_dir),
        "--ids-log",
        str(ids_log),
    ]
    output = tmp_path / "A" / "output.txt"
    with output.open("w") as sink:
        proc = subprocess.Popen(cmd, env=_worker_env(), cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while len(list(ckpt_dir.glob("step=*.ckpt"))) < 3:
                assert proc.poll() is None, f"run A ended before its 3rd checkpoint:\n{output.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "run A wrote no 3rd checkpoint in time"
                time.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "A" / "ids_rank0.json").exists(), "run A finished instead of being killed"

    steps = _loadable_steps(ckpt_dir)
    assert steps and steps[-1] >= 2 * every
    last = steps[-1]
    records = [json.loads(line) for line in Path(f"{ids_log}.rank0").read_text().splitlines() if line.strip()]
    assert [r["batch_idx"] for r in records] == list(range(len(records)))
    assert len(records) >= last, "the ids log is missing steps before the checkpoint"
    a_seen = [r["ids"] for r in records]

    b = fit(tmp_path, make_dm(uri, shuffle), name="B", ckpt_path=ckpt_dir / f"step={last}.ckpt")
    c = fit(tmp_path, make_dm(uri, shuffle), name="C")
    assert_exact(a_seen, b.seen, c.seen, last)
    assert sorted(flat(a_seen[:last] + b.seen)) == list(range(640))


def test_resume_from_last_ckpt_after_steps_past_it(tmp_path: Path, uri: str) -> None:
    """``save_last``: run A trains one step past its last checkpoint (lost work); B resumes from ``last.ckpt``."""
    shuffle, every = "shard:32:1", 3
    c = fit(tmp_path, make_dm(uri, shuffle, FILTER), name="C")

    def run(name: str, **kwargs: Any) -> RecordingModel:
        checkpoint = ModelCheckpoint(
            dirpath=tmp_path / "ckpt_last", every_n_train_steps=every, save_last=True, save_top_k=0
        )
        return fit(
            tmp_path,
            make_dm(uri, shuffle, FILTER),
            name=name,
            callbacks=[checkpoint],
            enable_checkpointing=True,
            **kwargs,
        )

    a = run("A", max_steps=2 * every + 1)
    last = tmp_path / "ckpt_last" / "last.ckpt"
    k = torch.load(last, weights_only=True)["global_step"]
    assert k == 2 * every and len(a.seen) == k + 1
    b = run("B", ckpt_path=last)
    assert_exact(a.seen, b.seen, c.seen, k)
