"""Exact mid-epoch resume: checkpoint at step k, resume, and the epoch is trained exactly once.

Every test trains with a real Trainer on a real Lance dataset and resumes from a real checkpoint
file. Run A trains to step k (``max_steps=k``) and saves ``step=k.ckpt`` with
``ModelCheckpoint(every_n_train_steps=k)``; run B resumes from it; run C trains uninterrupted.
Exact means: A's first k batches followed by B's batches equal C's batches, same ids, same order.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lance_lightning import (
    ConfigError,
    CursorMismatchError,
    LanceDataModule,
    LanceSource,
)
from lance_lightning.plan.cursor import STATE_KEYS, CursorTracker, finished
from tests.harness import assert_exact, ckpt_file, fit, make_dm, run_resume
from tests.helpers import RecordingModel, append_rows, assert_one_saved_cursor, flat, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = REPO_ROOT / "tests" / "resume_worker.py"

ROWS = 300
BATCH = 16
FILTER = "label < 7"  # 210 of 300 rows
STRATEGIES = ["none", "shard:32:1", "row:2", "row:2:4", "buffer:64:16:3"]
FILTERS = [None, FILTER]
DM_KEY = "LanceDataModule"  # where Lightning stores `dm.state_dict()` (type(dm).__qualname__)


# -- helpers --------------------------------------------------------------------------------------
@pytest.fixture
def uri(tmp_path: Path) -> str:
    """300 rows (ids 0..299, label = id % 10) in 3 fragments."""
    return write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)


def matching_ids(uri: str, filter: str | None) -> set[int]:
    table = lance.dataset(uri).to_table(columns=["id"], filter=filter)
    return set(table.column("id").to_pylist())


def assert_epoch_once(ids: list[int], uri: str, filter: str | None, world_batch: int) -> None:
    """Each id once, only matching rows, and fewer than one step (the drop_last tail) missing."""
    assert len(ids) == len(set(ids)), f"duplicated ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    expected = matching_ids(uri, filter)
    assert set(ids) <= expected, f"ids outside the split: {sorted(set(ids) - expected)[:10]}"
    missing = expected - set(ids)
    assert len(missing) < world_batch, f"{len(missing)} rows never trained (tail is < {world_batch})"


def epoch_batches(model: RecordingModel, epoch: int) -> list[list[int]]:
    return [ids for ids, e in zip(model.seen, model.seen_epochs) if e == epoch]


# -- 1. exact resume for every strategy, with and without a filter ---------------------------------
@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_mid_epoch_resume_is_exact(tmp_path: Path, uri: str, shuffle: str, filter: str | None) -> None:
    k = 7
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k)
    assert len(a.seen) == k
    assert_exact(a.seen, b.seen, c.seen, k)
    assert_epoch_once(flat(c.seen), uri, filter, BATCH)
    assert b.seen_epochs == [0] * len(b.seen)


@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_resume_in_second_epoch_is_exact(tmp_path: Path, uri: str, shuffle: str, filter: str | None) -> None:
    steps_per_epoch = len(matching_ids(uri, filter)) // BATCH
    k = steps_per_epoch + 4  # 4 steps into epoch 1
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k, max_epochs=2)
    assert c.seen_epochs == [0] * steps_per_epoch + [1] * steps_per_epoch
    assert_exact(a.seen, b.seen, c.seen, k)
    assert b.seen_epochs == [1] * (steps_per_epoch - 4)
    first, second = epoch_batches(c, 0), epoch_batches(c, 1)
    for epoch in (first, second):
        assert_epoch_once(flat(epoch), uri, filter, BATCH)
    if shuffle == "none":
        assert first == second
    else:
        assert flat(first) != flat(second), "epoch 1 repeats epoch 0's order"


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", STRATEGIES)
def test_mid_epoch_resume_is_exact_with_workers(tmp_path: Path, uri: str, shuffle: str) -> None:
    k = 5
    a, b, c = run_resume(tmp_path, uri, shuffle, FILTER, k=k, num_workers=2)
    assert_exact(a.seen, b.seen, c.seen, k)
    assert_epoch_once(flat(c.seen), uri, FILTER, BATCH)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["shard:32:1", "row:2:4"])
def test_resume_in_second_epoch_with_workers(tmp_path: Path, uri: str, shuffle: str) -> None:
    steps_per_epoch = len(matching_ids(uri, FILTER)) // BATCH
    k = steps_per_epoch + 3
    a, b, c = run_resume(tmp_path, uri, shuffle, FILTER, k=k, num_workers=2, max_epochs=2)
    assert_exact(a.seen, b.seen, c.seen, k)
    assert flat(epoch_batches(c, 0)) != flat(epoch_batches(c, 1))


# -- 2. without the callback: the data module's own state is enough ---------------------------------
@pytest.mark.parametrize("max_epochs", [1, 2])
@pytest.mark.parametrize("filter", FILTERS, ids=["all", "filtered"])
@pytest.mark.parametrize("shuffle", ["shard:32:1", "row:2", "buffer:64:16:3"])
def test_resume_without_cursor_callback(
    tmp_path: Path, uri: str, shuffle: str, filter: str | None, max_epochs: int
) -> None:
    steps_per_epoch = len(matching_ids(uri, filter)) // BATCH
    k = 5 if max_epochs == 1 else steps_per_epoch + 2
    a, b, c = run_resume(tmp_path, uri, shuffle, filter, k=k, max_epochs=max_epochs, cursor_callback=False)
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert "DataCursorCheckpoint" not in ckpt.get("callbacks", {})
    cursor = ckpt[DM_KEY]["train_cursor"]  # steps and rows count within the cursor's epoch
    assert (cursor["epoch"], cursor["steps"], cursor["rows_consumed"]) == (
        max_epochs - 1,
        5 if max_epochs == 1 else 2,
        (5 if max_epochs == 1 else 2) * BATCH,
    )
    assert_exact(a.seen, b.seen, c.seen, k)


def test_copies_an_earlier_version_saved_beside_the_data_module_are_ignored(tmp_path: Path, uri: str) -> None:
    """Checkpoints of earlier versions held the cursor three times; the data module's copy is the one
    restored (once), so stale copies under the callback and the loop's loader state change nothing."""
    k = 5
    a = fit(tmp_path, make_dm(uri, "row:2"), name="A", ckpt_every=k)
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert_one_saved_cursor(ckpt)
    stale = {**ckpt[DM_KEY]["train_cursor"], "rows_consumed": 0, "steps": 0}
    ckpt["callbacks"]["DataCursorCheckpoint"] = stale
    ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] = [stale]
    edited = tmp_path / "earlier_layout.ckpt"
    torch.save(ckpt, edited)
    restores: list[dict[str, Any]] = []
    original = CursorTracker.restore

    def counted(self: CursorTracker, state: dict[str, Any]) -> None:
        restores.append(state)
        original(self, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CursorTracker, "restore", counted)
        b = fit(tmp_path, make_dm(uri, "row:2"), name="B", ckpt_path=edited)
    assert [state["steps"] for state in restores] == [k], "restored once, from the data module's copy"
    assert_exact(a.seen, b.seen, a.seen, k)


# -- 3. across world sizes (DDP on CPU, subprocess) -------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK", "MASTER_PORT")
    }
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


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


# -- 4. SIGKILL mid-epoch ---------------------------------------------------------------------------
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


# -- 5. Lightning pitfalls --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_workers", "prefetch_factor"),
    [
        (0, 2),
        pytest.param(2, 4, marks=pytest.mark.slow),
    ],
    ids=["workers0", "workers2-prefetch4"],
)
@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
def test_saved_cursor_counts_only_trained_steps(
    tmp_path: Path, uri: str, num_workers: int, prefetch_factor: int, cursor_callback: bool
) -> None:
    """(a) Nothing fetched ahead (Lightning, workers, prefetch_factor) counts as consumed."""
    k, shuffle = 7, "shard:32:1"

    def dm() -> LanceDataModule:
        return make_dm(uri, shuffle, num_workers=num_workers, prefetch_factor=prefetch_factor)

    # Run A keeps training past step k, so batches after k were already fetched when step=k was saved.
    a = fit(tmp_path, dm(), name="A", ckpt_every=k, cursor_callback=cursor_callback)
    assert len(a.seen) == ROWS // BATCH
    ckpt = torch.load(ckpt_file(tmp_path, "A", k), weights_only=True)
    assert_one_saved_cursor(ckpt)
    state = ckpt[DM_KEY]["train_cursor"]
    assert (state["epoch"], state["steps"], state["rows_consumed"], finished(state)) == (0, k, k * BATCH, False), (
        f"cursor at step {k}: {state}"
    )
    b = fit(tmp_path, dm(), name="B", ckpt_path=ckpt_file(tmp_path, "A", k), cursor_callback=cursor_callback)
    assert_exact(a.seen, b.seen, a.seen, k)


@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
@pytest.mark.parametrize("max_epochs", [1, 2])
def test_resume_when_configure_optimizers_reads_estimated_stepping_batches(
    tmp_path: Path, uri: str, cursor_callback: bool, max_epochs: int
) -> None:
    """(b) #20550: Lightning skips ``loader.load_state_dict``; the resume must still be exact."""
    shuffle, steps_per_epoch = "row:2", len(matching_ids(uri, FILTER)) // BATCH
    k = 6 if max_epochs == 1 else steps_per_epoch + 6

    def run(name: str, **kwargs: Any) -> RecordingModel:
        model = RecordingModel(read_estimated_stepping_batches=True)
        return fit(
            tmp_path,
            make_dm(uri, shuffle, FILTER),
            name=name,
            model=model,
            max_epochs=max_epochs,
            cursor_callback=cursor_callback,
            **kwargs,
        )

    c = run("C")
    a = run("A", ckpt_every=k, max_steps=k)
    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", k))
    assert c.estimated_stepping_batches == steps_per_epoch * max_epochs
    assert b.estimated_stepping_batches is not None
    assert_exact(a.seen, b.seen, c.seen, k)


@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
@pytest.mark.parametrize(("max_steps", "max_epochs"), [(25, -1), (-1, 3)], ids=["max_steps", "max_epochs"])
def test_end_of_epoch_checkpoint_starts_next_epoch_in_full(
    tmp_path: Path, max_steps: int, max_epochs: int, cursor_callback: bool
) -> None:
    """(c) A checkpoint at the last step of epoch 0 resumes with a full, freshly shuffled epoch 1."""
    uri = write_dataset(tmp_path / "ds170.lance", 170)  # 10 batches of 16, 10 rows dropped per epoch
    shuffle = "row:2"

    def run(name: str, **kwargs: Any) -> RecordingModel:
        return fit(
            tmp_path,
            make_dm(uri, shuffle),
            name=name,
            max_steps=max_steps,
            max_epochs=max_epochs,
            cursor_callback=cursor_callback,
            **kwargs,
        )

    a = run("A", ckpt_every=10)  # uninterrupted; checkpoints at steps 10 and 20 (ends of epochs 0 and 1)
    expected_epochs = [0] * 10 + [1] * 10 + [2] * (5 if max_steps == 25 else 10)
    assert a.seen_epochs == expected_epochs
    cursor = torch.load(ckpt_file(tmp_path, "A", 10), weights_only=True)[DM_KEY]["train_cursor"]
    assert (cursor["epoch"], cursor["steps"], finished(cursor)) == (0, 10, True)

    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", 10))
    assert b.seen_epochs == expected_epochs[10:], "the epoch after an end-of-epoch checkpoint was not run in full"
    assert b.seen == a.seen[10:]
    epochs = [flat(epoch_batches(a, e)) for e in range(3)]
    for ids in epochs[:2]:
        assert len(ids) == 160 and len(set(ids)) == 160
    assert epochs[0] != epochs[1] and epochs[1][:80] != epochs[2][:80], "epochs repeat an order"


@pytest.mark.parametrize("k", [6, 8], ids=["between-val", "at-val"])
def test_resume_with_validation_in_between(tmp_path: Path, uri: str, k: int) -> None:
    """(d) ``val_check_interval`` below the epoch: validation runs between training checkpoints."""
    shuffle = "buffer:64:16:3"

    def run(name: str, **kwargs: Any) -> RecordingModel:
        dm = make_dm(uri, shuffle, FILTER, val=LanceSource(uri, filter="label >= 7"))
        return fit(tmp_path, dm, name=name, limit_val_batches=None, val_check_interval=4, **kwargs)

    c = run("C")
    a = run("A", ckpt_every=k, max_steps=k)
    b = run("B", ckpt_path=ckpt_file(tmp_path, "A", k))
    assert_exact(a.seen, b.seen, c.seen, k)
    val_ids = matching_ids(uri, "label >= 7")
    assert c.val_seen and set(flat(c.val_seen)) == val_ids
    assert b.val_seen and set(flat(b.val_seen)) == val_ids


# -- 6. strict restore ------------------------------------------------------------------------------
def _checkpoint_at(tmp_path: Path, dm: LanceDataModule, k: int = 5, **kwargs: Any) -> Path:
    fit(tmp_path, dm, name="A", ckpt_every=k, max_steps=k, **kwargs)
    return ckpt_file(tmp_path, "A", k)


@pytest.mark.parametrize(
    ("change", "field", "saved", "current"),
    [
        ("filter", "plan.filter", "'label < 7'", "'label < 8'"),
        ("seed", "plan.shuffle", "'seed': 2", "'seed': 3"),
        ("strategy", "plan.shuffle", "'RowShuffle'", "'ShardShuffle'"),
        ("source", "plan.uri", "ds.lance'", "other.lance'"),
        ("columns", "plan.columns", "['id', 'label', 'x', 'vec']", "['id', 'x']"),
        ("version", "plan.version", "has 1,", " 2."),
    ],
)
@pytest.mark.parametrize("cursor_callback", [True, False], ids=["callback", "no-callback"])
def test_changed_plan_is_refused_before_training(
    tmp_path: Path, uri: str, change: str, field: str, saved: str, current: str, cursor_callback: bool
) -> None:
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER), cursor_callback=cursor_callback)
    shuffle, source = "row:2", LanceSource(uri, filter=FILTER)
    if change == "filter":
        source = LanceSource(uri, filter="label < 8")
    elif change == "seed":
        shuffle = "row:3"
    elif change == "strategy":
        shuffle = "shard:32:2"
    elif change == "source":
        other = tmp_path / "other.lance"
        shutil.copytree(uri, other)
        source = LanceSource(str(other), filter=FILTER)
    elif change == "columns":
        source = LanceSource(uri, columns=["id", "x"], filter=FILTER)
    elif change == "version":
        source = LanceSource(uri, filter=FILTER, version=append_rows(uri, 50))
    model = RecordingModel()
    with pytest.raises(CursorMismatchError) as error:
        fit(
            tmp_path,
            make_dm(uri, shuffle, source=source),
            name="B",
            ckpt_path=ckpt,
            model=model,
            cursor_callback=cursor_callback,
        )
    message = str(error.value)
    assert error.value.field == field, message
    assert f"`{field}`" in message, message
    saved_part, _, current_part = message.partition("the current plan has")
    assert saved in saved_part and current in current_part, message
    assert model.seen == [], "training started before the mismatch was detected"


def test_a_dataset_written_again_at_the_same_path_is_refused(tmp_path: Path, uri: str) -> None:
    """Another dataset at the checkpoint's path, with its version number and row count: refused
    naming ``plan.data`` before training (before, the resume skipped rows of the new data)."""
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER))
    shutil.rmtree(uri)
    write_dataset(uri, ROWS, fragment_rows=50)  # version 1 again: the same ids, other files
    model = RecordingModel()
    with pytest.raises(CursorMismatchError) as error:
        fit(tmp_path, make_dm(uri, "row:2", FILTER), name="B", ckpt_path=ckpt, model=model)
    assert error.value.field == "plan.data", str(error.value)
    assert model.seen == []


def test_new_version_after_checkpoint_is_ignored(tmp_path: Path, uri: str) -> None:
    k, shuffle = 5, "row:2"
    c = fit(tmp_path, make_dm(uri, shuffle, FILTER), name="C")
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, shuffle, FILTER), k)
    a_seen = c.seen[:k]  # run A == C up to k (checked in test_mid_epoch_resume_is_exact)
    new_version = append_rows(uri, 200)
    assert new_version == 2 and lance.dataset(uri).count_rows() == ROWS + 200
    dm = make_dm(uri, shuffle, FILTER)
    b = fit(tmp_path, dm, name="B", ckpt_path=ckpt)
    assert dm.plans["train"].source.version == 1
    assert_exact(a_seen, b.seen, c.seen, k)
    assert max(flat(b.seen)) < ROWS, "rows of the new version were read"


def test_a_resume_at_an_older_version_surveys_the_train_split_once(
    tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning calls ``setup`` before it restores the checkpoint: the train split is planned
    once, at the checkpoint's version, not first at the latest version and then again."""
    from lance_lightning.plan import survey as survey_module

    k, shuffle = 5, "row:2"
    c = fit(tmp_path, make_dm(uri, shuffle, FILTER), name="C")
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, shuffle, FILTER), k)
    append_rows(uri, 200)
    surveyed: list[tuple[str, int]] = []
    real_survey = survey_module.survey

    def counting_survey(split: str, source: Any) -> Any:
        surveyed.append((split, source.version))
        return real_survey(split, source)

    monkeypatch.setattr(survey_module, "survey", counting_survey)
    dm = make_dm(uri, shuffle, FILTER)
    b = fit(tmp_path, dm, name="B", ckpt_path=ckpt, max_epochs=3)
    assert [s for s in surveyed if s[0] == "train"] == [("train", 1)]
    assert_exact(c.seen[:k], epoch_batches(b, 0), epoch_batches(c, 0), k)
    for epoch in (1, 2):  # later epochs: the pinned version's rows, each once
        assert_epoch_once(flat(epoch_batches(b, epoch)), uri, FILTER + " AND id < 300", BATCH)
    surveyed.clear()
    fit(tmp_path, make_dm(uri, shuffle, FILTER), name="D", max_steps=2)
    assert [s for s in surveyed if s[0] == "train"] == [("train", 2)]


def test_deleted_pinned_version_is_reported(tmp_path: Path, uri: str) -> None:
    ckpt = _checkpoint_at(tmp_path, make_dm(uri, "row:2", FILTER))
    append_rows(uri, 50)
    append_rows(uri, 50)
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    assert 1 not in [v["version"] for v in lance.dataset(uri).versions()]
    model = RecordingModel()
    with pytest.raises(ConfigError) as error:
        fit(tmp_path, make_dm(uri, "row:2", FILTER), name="B", ckpt_path=ckpt, model=model)
    message = str(error.value)
    assert error.value.param == "train.version" and "`train.version`=1" in message, message
    assert "no longer exists" in message, message
    assert model.seen == []


# -- 7. state size ----------------------------------------------------------------------------------
def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def test_cursor_state_is_small_and_constant(tmp_path: Path) -> None:
    sizes: dict[int, dict[str, int]] = {}
    for rows, folder in ((1_000, "small"), (100_000, "large")):
        uri = write_dataset(tmp_path / folder / "ds.lance", rows, fragment_rows=rows // 4)
        root = tmp_path / f"run_{folder}"
        fit(root, make_dm(uri, "row:2", FILTER), name="A", ckpt_every=3, max_steps=3)
        ckpt = torch.load(ckpt_file(root, "A", 3), weights_only=True)
        assert_one_saved_cursor(ckpt)
        states = {"datamodule": ckpt[DM_KEY]["train_cursor"]}
        for where, state in states.items():
            assert set(state) == set(STATE_KEYS), f"{where}: {sorted(state)}"
            assert _is_plain(state), f"{where} state holds non-plain values: {state}"
            assert state["plan"]["rows"] == rows * 7 // 10
        sizes[rows] = {where: len(pickle.dumps(state)) for where, state in states.items()}
    for where in sizes[1_000]:
        small, large = sizes[1_000][where], sizes[100_000][where]
        assert large < 4096, f"{where} cursor is {large} bytes"
        assert abs(large - small) <= 8, f"{where} cursor grows with the dataset: {small} -> {large} bytes"
