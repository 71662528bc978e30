"""Resume harness: train, stop mid-epoch at a checkpoint, resume with a change, compare every epoch.

Guarantees (what `check_resume` asserts, for any change of batch size, world size or workers):
- the resumed epoch trains exactly the rows the checkpointed run had not trained, in the
  uninterrupted order, less the new ``drop_last`` tail (``(rows - consumed) % (W*B)`` rows);
- every later epoch equals the uninterrupted run's epoch with the new setup: same number of
  steps, same rows, same order.

Every fit is a real ``Trainer.fit`` (``ckpt_path=`` to resume) on a real Lance dataset, with
`DataCursorCheckpoint` and ``ModelCheckpoint(every_n_train_steps=k)``. Jobs with ``devices > 1``
run in real DDP (gloo, CPU): consecutive ones share one launch of this file as a script
(``python tests/harness.py JOBS.json``), which Lightning re-executes for rank 1; each rank writes
``<out>/<name>.rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DDP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Setup:
    """What may change between the checkpointed run and the resumed one."""

    batch_size: int = 16
    devices: int = 1
    num_workers: int = 0

    @property
    def step_rows(self) -> int:
        return self.batch_size * self.devices


@dataclass
class Job:
    """One ``Trainer.fit``: ``max_steps``/``ckpt_every`` to stop at a checkpoint, ``ckpt_path`` to resume."""

    name: str
    uri: str
    shuffle: str
    setup: Setup
    max_epochs: int
    max_steps: int = -1
    ckpt_every: int = 0
    ckpt_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more LanceDataModule arguments (plain values)
    #: Train on a `LanceMixture` instead of ``uri``: its arguments, with ``uris`` for the sources.
    mixture: dict[str, Any] | None = None
    accelerator: str = "cpu"
    #: `TokenPacking` arguments: the run packs the ``tokens`` column (`tests.helpers.write_token_dataset`)
    #: and records each window's first token (its stream index) as its id.
    packing: dict[str, Any] | None = None


@dataclass
class Trained:
    """What one fit trained: per global step, the ids of every rank's batch (rank order), and its epoch."""

    steps: list[list[int]]
    epochs: list[int]

    def epoch(self, epoch: int) -> list[list[int]]:
        return [ids for ids, e in zip(self.steps, self.epochs) if e == epoch]

    def rows(self, epoch: int) -> list[int]:
        return [i for ids in self.epoch(epoch) for i in ids]


def ckpt_dir(root: Path, name: str) -> Path:
    return root / f"ckpt_{name}"


def ckpt_file(root: Path, name: str, step: int) -> Path:
    path = ckpt_dir(root, name) / f"step={step}.ckpt"
    assert path.exists(), f"no checkpoint at step {step}: {sorted(p.name for p in path.parent.glob('*'))}"
    return path


# -- in-process fits -------------------------------------------------------------------------------
def fit(
    root: Path,
    dm: Any,
    *,
    name: str,
    ckpt_path: str | Path | None = None,
    ckpt_every: int = 0,
    max_steps: int = -1,
    max_epochs: int = 1,
    cursor_callback: bool = True,
    model: Any = None,
    callbacks: list[Any] | None = None,
    **trainer_kwargs: Any,
) -> Any:
    """One real ``Trainer.fit`` of ``dm`` in this process; returns the `RecordingModel` (or ``model``).

    Checkpoints every ``ckpt_every`` steps go to `ckpt_file` ``(root, name, step)``; ``ckpt_path``
    resumes. `DataCursorCheckpoint` is added unless ``cursor_callback=False``.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lance_lightning import DataCursorCheckpoint
    from tests.helpers import RecordingModel

    model = model or RecordingModel()
    all_callbacks: list[Any] = [DataCursorCheckpoint()] if cursor_callback else []
    all_callbacks += callbacks or []
    if ckpt_every:
        all_callbacks.append(
            ModelCheckpoint(
                dirpath=ckpt_dir(root, name), filename="{step}", every_n_train_steps=ckpt_every, save_top_k=-1
            )
        )
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root / f"root_{name}"),
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_checkpointing=bool(ckpt_every),
        max_steps=max_steps,
        max_epochs=max_epochs,
        callbacks=all_callbacks,
    )
    kwargs.update(trainer_kwargs)
    trainer = pl.Trainer(**kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    return model


def make_dm(
    uri: str,
    shuffle: str = "none",
    filter: str | None = None,
    *,
    batch_size: int = 16,
    num_workers: int = 0,
    **kwargs: Any,
) -> Any:
    """A `LanceDataModule` reading ``uri`` (``source=`` overrides) with the shuffle named as in
    `tests.resume_worker.make_shuffle`."""
    from lance_lightning import LanceDataModule, LanceSource
    from tests.resume_worker import make_shuffle

    source = kwargs.pop("source", None) or LanceSource(uri, filter=filter)
    return LanceDataModule(
        train=source, batch_size=batch_size, shuffle=make_shuffle(shuffle), num_workers=num_workers, **kwargs
    )


def run_resume(
    root: Path,
    uri: str,
    shuffle: str,
    filter: str | None,
    *,
    k: int,
    num_workers: int = 0,
    max_epochs: int = 1,
    cursor_callback: bool = True,
    **dm_kwargs: Any,
) -> tuple[Any, Any, Any]:
    """Runs C (uninterrupted), A (to step k, checkpoint) and B (resumed from A); returns (A, B, C)."""

    def dm() -> Any:
        return make_dm(uri, shuffle, filter, num_workers=num_workers, **dm_kwargs)

    c = fit(root, dm(), name="C", max_epochs=max_epochs, cursor_callback=cursor_callback)
    a = fit(root, dm(), name="A", ckpt_every=k, max_steps=k, max_epochs=max_epochs, cursor_callback=cursor_callback)
    b = fit(
        root, dm(), name="B", ckpt_path=ckpt_file(root, "A", k), max_epochs=max_epochs, cursor_callback=cursor_callback
    )
    return a, b, c


def assert_exact(a_seen: list[list[int]], b_seen: list[list[int]], c_seen: list[list[int]], k: int) -> None:
    """A's first k batches + B's batches == C's batches (same ids, same order, each id once per epoch)."""
    assert len(a_seen) >= k, f"run A trained {len(a_seen)} steps, expected at least {k}"
    assert a_seen[:k] == c_seen[:k], "runs A and C disagree before the checkpoint (order not deterministic)"
    resumed = a_seen[:k] + b_seen
    assert len(resumed) == len(c_seen), f"resumed run trained {len(resumed)} steps, uninterrupted {len(c_seen)}"
    for step, (got, want) in enumerate(zip(resumed, c_seen)):
        assert got == want, f"step {step} (resumed at {k}): got ids {got}, uninterrupted run had {want}"


# -- the resume scenarios (tests/scenarios/test_resume_*.py) ---------------------------------------
ROWS = 300  # rows of their `uri` dataset (tests/scenarios/conftest.py): ids 0..299, label = id % 10
BATCH = 16  # `make_dm`'s batch size
FILTER = "label < 7"  # 210 of 300 rows
DM_KEY = "LanceDataModule"  # where Lightning stores `dm.state_dict()` (type(dm).__qualname__)


def matching_ids(uri: str, filter: str | None) -> set[int]:
    import lance

    table = lance.dataset(uri).to_table(columns=["id"], filter=filter)
    return set(table.column("id").to_pylist())


def assert_epoch_once(ids: list[int], uri: str, filter: str | None, world_batch: int) -> None:
    """Each id once, only matching rows, and fewer than one step (the drop_last tail) missing."""
    assert len(ids) == len(set(ids)), f"duplicated ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    expected = matching_ids(uri, filter)
    assert set(ids) <= expected, f"ids outside the split: {sorted(set(ids) - expected)[:10]}"
    missing = expected - set(ids)
    assert len(missing) < world_batch, f"{len(missing)} rows never trained (tail is < {world_batch})"


def epoch_batches(model: Any, epoch: int) -> list[list[int]]:
    """The batches a `RecordingModel` trained in ``epoch``."""
    return [ids for ids, e in zip(model.seen, model.seen_epochs) if e == epoch]


# -- fits in subprocesses (DDP) -----------------------------------------------------------------------
# -- running jobs -----------------------------------------------------------------------------------
def _fit(root: Path, job: Job) -> dict[str, Any]:
    """Run ``job`` in this process (or in this rank of a DDP launch); return this rank's record."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lance_lightning import DataCursorCheckpoint, LanceDataModule, LanceMixture, LanceSource, TokenPacking
    from tests.helpers import PackedRecordingModel, RecordingModel
    from tests.resume_worker import make_shuffle

    setup = job.setup
    packing = TokenPacking(**job.packing) if job.packing is not None else None
    columns = ["tokens", "n_tokens"] if packing else ["id", "x"]
    if job.mixture is None:
        train = LanceSource(job.uri, columns=columns)
    else:
        spec = dict(job.mixture)
        train = LanceMixture([LanceSource(uri, columns=columns) for uri in spec.pop("uris")], **spec)
    extra = dict(job.extra)
    if isinstance(extra.get("remote_cache"), dict):  # jobs travel as JSON
        from lance_lightning import RemoteCache

        extra["remote_cache"] = RemoteCache(**extra["remote_cache"])
    dm = LanceDataModule(
        train=train,
        batch_size=setup.batch_size,
        shuffle=make_shuffle(job.shuffle),
        num_workers=setup.num_workers,
        packing=packing,
        **extra,
    )
    callbacks: list[Any] = [DataCursorCheckpoint()]
    if job.ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=ckpt_dir(root, job.name), filename="{step}", every_n_train_steps=job.ckpt_every, save_top_k=-1
            )
        )
    trainer = pl.Trainer(
        accelerator=job.accelerator,
        devices=setup.devices,
        strategy="ddp" if setup.devices > 1 else "auto",
        max_epochs=job.max_epochs,
        max_steps=job.max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_checkpointing=bool(job.ckpt_every),
        default_root_dir=str(root / f"root_{job.name}"),
        callbacks=callbacks,
    )
    model = PackedRecordingModel() if packing else RecordingModel()
    trainer.fit(model, datamodule=dm, ckpt_path=job.ckpt_path)
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "seen": model.seen,
        "epochs": model.seen_epochs,
        "num_training_batches": trainer.num_training_batches,
    }


def _merge(records: list[dict[str, Any]]) -> Trained:
    """Ranks' records -> global steps (each step: rank 0's ids, then rank 1's, ...)."""
    records = sorted(records, key=lambda r: r["rank"])
    counts = [len(r["seen"]) for r in records]
    assert len(set(counts)) == 1, f"ranks trained different numbers of steps: {counts}"
    assert all(r["epochs"] == records[0]["epochs"] for r in records), "ranks disagree on epochs"
    steps = [[i for r in records for i in r["seen"][step]] for step in range(counts[0])]
    return Trained(steps, list(records[0]["epochs"]))


def subprocess_env() -> dict[str, str]:
    """This environment for a test's training subprocess (DDP ranks): no rank variables inherited,
    the repository importable, output unbuffered."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK", "MASTER_PORT")
    }
    env.update(
        PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    )
    keep_bytecode(env)
    return env


def keep_bytecode(env: MutableMapping[str, str]) -> None:
    """Where bytecode writing is off (``PYTHONDONTWRITEBYTECODE``), let the processes started with
    ``env`` keep compiled modules in a cache outside the repository and the virtualenv: otherwise
    every CLI call, DDP rank and worker compiles the package and jsonargparse again (0.3-0.5 s of
    CPU each on a loaded 2-core machine; see also tests/scenarios/test_ddp.py). tests/conftest.py
    applies it to the test processes' own environment, so every subprocess inherits it."""
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "lance_lightning_test_pycache"))


def _launch_ddp(root: Path, jobs: list[Job]) -> dict[str, Trained]:
    """Run ``jobs`` (all with the same ``devices``) in turn in one DDP launch."""
    spec = root / f"jobs_{jobs[0].name}.json"
    spec.write_text(json.dumps({"root": str(root), "jobs": [asdict(job) for job in jobs]}))
    from tests import zygote

    command = [sys.executable, str(Path(__file__).resolve()), str(spec)]
    # In its own session, rank 0 forked from the test zygote and rank 1 from its spare (`tests.zygote`).
    done = zygote.run_in_session(command, cwd=REPO_ROOT, env=subprocess_env(), timeout=DDP_TIMEOUT_S)
    output = done.output
    if done.timed_out:
        raise AssertionError(f"DDP jobs hung: no exit within {DDP_TIMEOUT_S}s\n{output[-4000:]}")
    assert done.returncode == 0, f"DDP jobs failed ({done.returncode}):\n{output[-6000:]}"
    results = {}
    for job in jobs:
        records = [json.loads(p.read_text()) for p in sorted((root / "out").glob(f"{job.name}.rank*.json"))]
        assert len(records) == job.setup.devices, f"{job.name}: {len(records)} rank records\n{output[-3000:]}"
        results[job.name] = _merge(records)
    return results


def run_jobs(root: Path, jobs: list[Job]) -> dict[str, Trained]:
    """Run ``jobs`` in order: single-device ones here, each run of consecutive DDP ones in one launch."""
    results: dict[str, Trained] = {}
    pending: list[Job] = []
    for job in [*jobs, None]:
        if pending and (job is None or job.setup.devices != pending[0].setup.devices):
            results.update(_launch_ddp(root, pending))
            pending = []
        if job is None:
            break
        if job.setup.devices > 1:
            pending.append(job)
        else:
            results[job.name] = _merge([_fit(root, job)])
    return results


# -- the check -------------------------------------------------------------------------------------
def check_resume(
    *,
    rows: int,
    k: int,
    setup_a: Setup,
    setup_b: Setup,
    stopped: Trained,
    resumed: Trained,
    whole_a: Trained,
    whole_b: Trained,
    max_epochs: int,
) -> None:
    """Assert the module's guarantees for a run stopped at step ``k`` of epoch 0 and resumed.

    ``stopped``/``resumed``: the two halves; ``whole_a``/``whole_b``: uninterrupted runs with the
    setups before and after the change.
    """
    before = [i for ids in stopped.steps[:k] for i in ids]
    assert len(stopped.steps) == k and set(stopped.epochs) == {0}, f"run A trained {len(stopped.steps)} steps"
    assert before == [i for ids in whole_a.steps[:k] for i in ids], "the stopped run differs from the uninterrupted one"
    consumed = k * setup_a.step_rows
    assert len(before) == consumed

    # The resumed epoch: exactly the rows not yet trained, less the new tail.
    steps = (rows - consumed) // setup_b.step_rows
    after = resumed.rows(0)
    assert len(resumed.epoch(0)) == steps, f"resumed epoch 0 ran {len(resumed.epoch(0))} steps, expected {steps}"
    epoch0 = before + after
    assert len(epoch0) == len(set(epoch0)), "a row was trained twice in the resumed epoch"
    assert len(epoch0) == consumed + steps * setup_b.step_rows
    tail = (rows - consumed) % setup_b.step_rows
    assert rows - len(epoch0) == tail, f"{rows - len(epoch0)} rows of epoch 0 not trained, the new tail is {tail}"
    for whole in (whole_a, whole_b):
        reference = whole.rows(0)
        common = min(len(reference), len(epoch0))
        assert epoch0[:common] == reference[:common], "the resumed epoch's order differs from the uninterrupted run"

    # Every later epoch: the uninterrupted run's (new setup), step for step.
    full_steps = rows // setup_b.step_rows
    for epoch in range(1, max_epochs):
        got, want = resumed.epoch(epoch), whole_b.epoch(epoch)
        assert len(want) == full_steps, f"uninterrupted epoch {epoch}: {len(want)} steps"
        assert len(got) == full_steps, f"epoch {epoch} after the resume ran {len(got)} of {full_steps} steps"
        assert got == want, f"epoch {epoch} after the resume differs from the uninterrupted run"
    assert max(resumed.epochs) == max_epochs - 1


def run_and_check_resume(
    root: Path, job: Callable[..., Job], *, rows: int, k: int, setup_a: Setup, setup_b: Setup, max_epochs: int
) -> dict[str, Trained]:
    """Run ``job(name, setup, **kw)`` stopped at step ``k`` with ``setup_a`` and resumed with
    ``setup_b`` through ``fit(ckpt_path=...)``, plus both uninterrupted runs; `check_resume` them and
    return the runs by name (``stop``, ``resume``, ``whole_a``, ``whole_b``)."""
    runs = run_jobs(
        root, [job("stop", setup_a, max_steps=k, ckpt_every=k), job("whole_a", setup_a), job("whole_b", setup_b)]
    )
    runs.update(run_jobs(root, [job("resume", setup_b, ckpt_path=str(ckpt_file(root, "stop", k)))]))
    check_resume(
        rows=rows,
        k=k,
        setup_a=setup_a,
        setup_b=setup_b,
        stopped=runs["stop"],
        resumed=runs["resume"],
        whole_a=runs["whole_a"],
        whole_b=runs["whole_b"],
        max_epochs=max_epochs,
    )
    return runs


def _main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    for raw in spec["jobs"]:
        job = Job(**{**raw, "setup": Setup(**raw["setup"])})
        record = _fit(root, job)
        (out / f"{job.name}.rank{record['rank']}.json").write_text(json.dumps(record))
        print(f"[rank {record['rank']}] {job.name}: {len(record['seen'])} steps", flush=True)


if __name__ == "__main__":
    _main(sys.argv[1])
