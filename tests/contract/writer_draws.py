"""The prediction writer drawn (issue #50): row identity, per-row randomness, bad rows and their
policies, filters, deletions, workers, 2-rank DDP, a SIGKILL at a random batch on any rank and the
rerun (the same, on a dataset deleted and rewritten at the same path, with another model), and a
second ``predict`` of the same trainer, with the train split's shuffle set.

Guarantees:
- `Writing` (a `tests.contract.scenario.Scenario`'s ``writing``) says what one predict composes;
  `draw_writing` draws it from its own random stream. `Inputs` is the transform (importable
  without Lightning, for worker processes): ``RowRandom`` draws, ``RandomFlip`` of ``vec``, or
  ``DeviceAugment(seed=...)`` of ``vec`` as a 2x4 image; rows with ``id % bad_mod == 2`` raise
  `RowError` (bad rows).
- `run_writing` runs what a user runs: `tests/contract/writer_script.py` as a script (Lightning's
  DDP launcher starts rank 1), SIGKILLed where drawn (the other rank is ended with the session),
  then rerun after the drawn change, and an uninterrupted one-rank run without workers on a copy
  of the final dataset (the reference). A one-rank run that is not killed runs the script's
  `predict` in this process. It returns every failure of the oracle:
  - the rerun (or the one run) ends without an error, except the documented ones: a bad row with
    ``RaiseOnBadRow`` raises ``BadRowError`` and nothing is committed; a rerun with another model
    may be refused with a ``ConfigError``, and then nothing of either model is committed;
  - the latest version reads; each row of the predict split (the filter on the live rows) holds
    ``emb = id * scale + k`` and ``score = id * scale / 2`` of one model for every row, computed
    from ``id`` alone (a bad row replaced by ``ReplaceBadRow``: null or some split row's value),
    every other row nulls; ``extra`` (the per-row random value) equals the reference run's;
  - a second ``predict`` of the same trainer raises nothing and changes no version.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "contract" / "writer_script.py"
DIM = 4
VEC = 8
FILTERS = (None, "id % 3 != 0", "x < 40", "id % 7 = 1")
RERUNS = ("same", "rewritten", "other_model")
SHUFFLES = ("none", "row:5", "row:2:4", "shard:16:3", "buffer:32:16:1")
PHASE_TIMEOUT_S = 240


@dataclass(frozen=True)
class Writing:
    """One ``Trainer.predict`` with the writer, killed and rerun where drawn."""

    rows: int = 60
    fragment_rows: int = 20
    #: Rows with ``id % delete_mod == 1`` deleted after the write (0: none).
    delete_mod: int = 0
    filter: str | None = None
    batch_size: int = 8
    world_size: int = 1
    num_workers: int = 0
    flush_rows: int = 16
    random: Literal["none", "rowrandom", "flip", "augment"] = "none"
    seed: int = 0
    #: Rows with ``id % bad_mod == 2`` do not transform (0: none); the policy (``raise``, ``replace``).
    bad_mod: int = 0
    bad: Literal["raise", "replace"] | None = None
    #: SIGKILL rank ``kill_rank`` after ``kill_batch`` batches (None: one uninterrupted run).
    kill_rank: int | None = None
    kill_batch: int = 1
    #: What changes before the rerun: nothing, the dataset deleted and written again at the same
    #: path (``rewrite_fragment_rows`` a fragment), or the model (another ``scale``).
    rerun: Literal["same", "rewritten", "other_model"] = "same"
    rewrite_fragment_rows: int | None = None
    #: ``run_dir`` outside the dataset (else the default, inside it).
    run_dir_outside: bool = True
    #: A second ``trainer.predict`` of the same trainer after the last run's first returns.
    second: bool = False
    #: The data module's ``shuffle`` (`tests.resume_worker.make_shuffle`'s spec): the train split's,
    #: which the predict split must not follow.
    shuffle: str = "none"


class Inputs:
    """The predict transform: the drawn per-row randomness and the bad rows."""

    def __init__(self, kind: str, seed: int, bad_mod: int) -> None:
        from lance_lightning.transforms import RandomFlip, RowRandom

        self.kind, self.seed, self.bad_mod = kind, seed, bad_mod
        self.random = RowRandom(seed)
        self.flip = RandomFlip("vec", p=0.5, dims=(-1,), seed=seed)
        self.augment = None

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.bad_mod:
            bad = np.flatnonzero(np.asarray(batch["id"]) % self.bad_mod == 2)
            if len(bad):
                from lance_lightning.errors import RowError

                raise RowError("x", int(bad[0]), "a bad row (id % bad_mod == 2)")
        if self.kind == "rowrandom":
            return {**batch, "draw": self.random.uniform(batch)}
        if self.kind == "flip":
            return self.flip(batch)
        if self.kind == "augment":
            if self.augment is None:
                from torchvision.transforms import v2

                from lance_lightning.transforms import DeviceAugment

                self.augment = DeviceAugment([v2.RandomHorizontalFlip(), v2.RandomVerticalFlip()], seed=self.seed)
            image = batch["vec"].reshape(len(batch["vec"]), 1, 2, VEC // 2)
            return self.augment({**batch, "image": image})
        return batch


def draw_writing(rng: random.Random) -> Writing:
    rows = rng.randint(24, 140)
    world = rng.choice([1, 1, 2])
    kill = rng.random() < 0.7
    bad = rng.choice([None, None, "raise", "replace"])
    rerun = rng.choice(RERUNS) if kill else "same"
    return Writing(
        rows=rows,
        fragment_rows=rng.randint(7, 60),
        delete_mod=rng.choice([0, 0, 4, 9]),
        filter=rng.choice(FILTERS),
        batch_size=rng.choice([4, 8, 16]),
        world_size=world,
        num_workers=rng.choice([0, 0, 2]),
        flush_rows=rng.choice([4, 16, 64]),
        random=rng.choice(["none", "rowrandom", "flip", "augment"]),
        seed=rng.randrange(100),
        bad_mod=rng.choice([5, 13]) if bad else 0,
        bad=bad,
        kill_rank=rng.randrange(world) if kill else None,
        kill_batch=rng.randint(1, 4),
        rerun=rerun,
        rewrite_fragment_rows=rng.randint(7, 60) if rerun == "rewritten" else None,
        run_dir_outside=rerun == "rewritten" or rng.random() < 0.5,
        second=rng.random() < 0.3,
        shuffle=rng.choice(SHUFFLES),
    )


# -- the dataset, the runs ---------------------------------------------------------------------------
def write_dataset(writing: Writing, uri: str, fragment_rows: int | None = None) -> None:
    import lance
    import pyarrow as pa

    ids = np.arange(writing.rows, dtype=np.int64)
    vec = (ids[:, None] * VEC + np.arange(VEC)).astype(np.float32)
    table = pa.table({
        "id": ids,
        "x": (ids * 0.5).astype(np.float32),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), VEC),
    })  # fmt: skip
    dataset = lance.write_dataset(table, uri, max_rows_per_file=fragment_rows or writing.fragment_rows)
    if writing.delete_mod:
        dataset.delete(f"id % {writing.delete_mod} = 1")


def _spec(writing: Writing, uri: str, root: Path, name: str, **changes: Any) -> dict[str, Any]:
    run_dir = str(root / "run") if writing.run_dir_outside else None
    spec = {
        "uri": uri, "run_dir": run_dir, "devices": writing.world_size, "num_workers": writing.num_workers,
        "batch_size": writing.batch_size, "flush_rows": writing.flush_rows, "filter": writing.filter,
        "random": writing.random, "seed": writing.seed, "bad": writing.bad, "bad_mod": writing.bad_mod,
        "scale": 1.0, "second": False, "shuffle": writing.shuffle, "out": str(root / name), "kill_rank": None,
        "kill_batch": 1,
    }  # fmt: skip
    return {**spec, **changes}


def _launch(spec: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    """The script on the spec's ranks, in a session of its own: (rank 0's status, each returned
    rank's record, the output's tail). A kill on any rank ends the whole session shortly after.
    One rank without a kill runs in this process instead (an interpreter start saved)."""
    if spec["devices"] == 1 and spec["kill_rank"] is None:
        from tests.contract.writer_script import predict

        return 0, [predict(spec)[1]], ""
    path = Path(f"{spec['out']}.json")
    path.write_text(json.dumps(spec))
    log = Path(f"{spec['out']}.log")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "PYTHONPATH": str(REPO_ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(path)],
            cwd=REPO_ROOT, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline, killed_at = time.monotonic() + PHASE_TIMEOUT_S, None
        marker = Path(f"{spec['out']}.killed")
        while proc.poll() is None and time.monotonic() < deadline:
            if killed_at is None and marker.exists():
                killed_at = time.monotonic()
            if killed_at is not None and time.monotonic() - killed_at > 2.0:  # the others: left at a barrier
                break
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    records = [
        json.loads(p.read_text()) for p in sorted(Path(spec["out"]).parent.glob(Path(spec["out"]).name + ".rank*.json"))
    ]
    return code, records, log.read_text(errors="replace")[-3000:]


def _read(uri: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """id -> the output columns of the latest version (pylance only), and the columns."""
    import lance

    dataset = lance.dataset(uri)
    names = [n for n in ("emb", "score", "extra") if n in dataset.schema.names]
    rows = {row["id"]: row for row in dataset.to_table(columns=["id", *names]).to_pylist()}
    return rows, names


def split_ids(writing: Writing) -> set[int]:
    """The predict split's ids: live rows matching the filter (numpy; no package)."""
    ids = np.arange(writing.rows)
    x = ids * 0.5
    live = ids % writing.delete_mod != 1 if writing.delete_mod else np.ones(len(ids), bool)
    keep = {
        None: live,
        "id % 3 != 0": ids % 3 != 0,
        "x < 40": x < 40,
        "id % 7 = 1": ids % 7 == 1,
    }[writing.filter]
    return set(ids[live & keep].tolist())


def _value(i: int, scale: float) -> tuple[list[float], float]:
    return [i * scale + k for k in range(DIM)], i * scale / 2


def check_rows(writing: Writing, got: dict[int, dict[str, Any]], reference: dict[int, dict[str, Any]]) -> list[str]:
    """Every split row holds one model's values and the reference's ``extra``; the rest nulls. A row
    whose values every model gives (``id`` 0: ``emb = k``, ``score = 0`` at any scale) tells no model
    apart: the committed columns mix models only when no one model gives every row's values."""
    split, problems = split_ids(writing), []
    missing = sorted(split - set(got))
    if missing:
        problems.append(f"writer: rows {missing[:10]} of the predict split are not in the dataset")
    models = {1.0, 2.0}  # the scales that give every split row checked so far its values
    bad = {i for i in split if writing.bad_mod and i % writing.bad_mod == 2}
    for i, row in sorted(got.items()):
        if i not in split:
            if any(row.get(n) is not None for n in ("emb", "score", "extra")):
                problems.append(f"writer: row {i} is outside the predict split but holds {row}")
            continue
        if i in bad and writing.bad == "replace":
            if row.get("emb") is not None and row["emb"][0] not in split:
                problems.append(f"writer: the bad row {i} holds {row['emb']}, no split row's value")
            continue
        fits = {s for s in (1.0, 2.0) if row.get("emb") is not None and _value(i, s) == (row["emb"], row.get("score"))}
        if not fits:
            problems.append(f"writer: row {i} holds emb={row.get('emb')} score={row.get('score')}, no model's value")
        else:
            models &= fits
        if writing.random != "none" and row.get("extra") != reference.get(i, {}).get("extra"):
            problems.append(
                f"writer: row {i}'s per-row random value {row.get('extra')} is not the uninterrupted run's "
                f"{reference.get(i, {}).get('extra')}"
            )
        if len(problems) >= 6:
            break
    if not models:
        problems.append("writer: the committed columns mix two models' outputs (scales 1 and 2)")
    return problems


def run_writing(writing: Writing, root: Path) -> list[str]:
    """Run ``writing`` (killed, changed, rerun; a reference) and return every failure."""
    import lance

    root.mkdir(parents=True, exist_ok=True)
    uri = str(root / "data.lance")
    write_dataset(writing, uri)
    problems: list[str] = []
    if writing.kill_rank is not None:
        spec = _spec(writing, uri, root, "killed", kill_rank=writing.kill_rank, kill_batch=writing.kill_batch)
        _launch(spec)
        if writing.rerun == "rewritten":
            shutil.rmtree(uri)
            write_dataset(writing, uri, writing.rewrite_fragment_rows)
    before = lance.dataset(uri).version
    scale = 2.0 if writing.rerun == "other_model" and writing.kill_rank is not None else 1.0
    code, records, log = _launch(_spec(writing, uri, root, "last", scale=scale, second=writing.second))
    errors = [r["error"] for r in records if "error" in r]
    bad_raised = writing.bad == "raise" and bool(
        split_ids(writing) & {i for i in range(writing.rows) if i % writing.bad_mod == 2}
    )
    refused = writing.rerun == "other_model" and any(e[0] == "ConfigError" for e in errors)
    if bad_raised:
        if not any(e[0] == "BadRowError" for e in errors):
            problems.append(f"writer: a bad row with RaiseOnBadRow did not raise BadRowError: {errors} {log[-800:]}")
        if lance.dataset(uri).version != before:
            problems.append("writer: a run that raised BadRowError committed a version")
        return problems
    if code != 0 or errors or len(records) != writing.world_size:
        if refused and lance.dataset(uri).version == before:
            return problems
        return [*problems, f"writer: the rerun exited {code} with {errors}:\n{log[-2000:]}"]
    for record in records:
        if "second_error" in record:
            problems.append(f"writer: a second predict of the same trainer failed: {record['second_error']}")
    try:
        got, names = _read(uri)
    except Exception as error:  # noqa: BLE001 - a version that does not read is the finding
        return [*problems, f"writer: the committed version does not read: {type(error).__name__}: {str(error)[:300]}"]
    if names != ["emb", "score", "extra"]:
        return [*problems, f"writer: the dataset has the output columns {names}, not emb, score, extra"]
    reference = _reference(writing, root, scale) if writing.random != "none" else {}
    return problems + check_rows(writing, got, reference)


def _reference(writing: Writing, root: Path, scale: float) -> dict[int, dict[str, Any]]:
    """The uninterrupted run's rows: one rank, no workers, a copy of the final dataset, in this process."""
    from tests.contract.writer_script import predict

    uri = str(root / "reference.lance")
    write_dataset(writing, uri, writing.rewrite_fragment_rows if writing.rerun == "rewritten" else None)
    whole = replace_fields(writing, world_size=1, num_workers=0, run_dir_outside=False)
    spec = _spec(whole, uri, root, "reference", scale=scale)
    _, record = predict(spec)
    if "error" in record:
        return {-1: {"extra": f"the reference run failed: {record['error']}"}}
    return _read(uri)[0]


def replace_fields(writing: Writing, **changes: Any) -> Writing:
    from dataclasses import replace

    return replace(writing, **changes)
