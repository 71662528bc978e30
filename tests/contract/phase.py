"""One phase of a scenario: a real ``Trainer.fit`` as a user would run it, recorded line by line.

Run in this process (`run_phase`) or as a script, ``python tests/contract/phase.py SPEC.json``:
Lightning's DDP launcher re-runs that command for every other rank, so the calls a user script
makes before ``fit`` run on every rank, as they would in the user's script. A scenario with
``cli`` runs its stopped and resumed phases as ``lance-lightning fit --config <yaml>
[--ckpt_path ...]`` in a subprocess instead (`tests.contract.runner`):
`tests.contract.phase_config.cli_config` writes the same data module, model, callbacks and trainer
as the YAML a user would write (`tests.contract.phase_config` builds both).

Guarantees:
- Every rank appends, flushed, one JSON line per event to ``<root>/<role>.rank<r>.jsonl``: each
  trained batch (trainer epoch, batch index, global step, units; with clips also each clip's
  frames' CRC-32, ``_clip_row`` and frame times: `clips_of`; in a ``lose`` scenario whether a
  DataLoader worker made it, and when: `tests.contract.retrials`), each epoch's length as Lightning
  took it, the data module's cursor at each epoch end and in each checkpoint, every validation
  and predict run's units, the calls before fit, the fit's end (or its error) and the
  ``RuntimeWarning``s that mention the data cursor; the model's weight and global step at the
  train end and at the fit's end, with the train plan's remote cache line, and (apart from the
  trained batches) each step the compute-floor probe replays after the train end. A run killed
  with SIGKILL keeps every line written before it died.
- Each checkpoint holds ``checkpoint["contract"]["batches"]``: the batches the run had trained
  when it was written, so the oracle knows which prefix of the stopped run it resumes after.
- The roles: ``reference`` (1 rank, ``drop_last=False``: every epoch's whole sequence, no stop),
  ``stop`` (the scenario's first run, stopped as it says, then ``trainer.save_checkpoint`` when
  the scenario saves after fit) and ``resume`` (``fit(ckpt_path=...)`` with the changes on
  resume, then the calls after fit). A SIGTERM stop signals the process before the batch it names.
- A scenario with ``resume.session`` runs both fits in one process as one user script would
  (`_session`): the stopped fit, the calls between the fits on its trainer, then a new
  ``Trainer`` fitting the same model and data module from the checkpoint chosen among those the
  first fit wrote (recorded as a ``chosen`` event, with the version holds between the fits); the
  second fit records as the ``resume`` role.
- A "prepare, then fit" scenario (`tests.contract.prepared`): every source of table 0 carries the
  ``prepare`` spec; each fit records what its ``prepare_data`` reported (a ``prepared`` event, on
  the rank that ran it), and a script with calls before fit calls ``prepare_data`` first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402
from torch import nn  # noqa: E402

from lance_lightning import LanceDataModule  # noqa: E402
from tests.contract import prepared, truth  # noqa: E402
from tests.contract.phase_config import (  # noqa: E402
    callback_arguments,
    data_arguments,
    scenario_environment,
    step_sleep,
    topology_of,
    trainer_arguments,
)
from tests.contract.scenario import Scenario  # noqa: E402
from tests.videos import FPS  # noqa: E402


class ScenarioStop(RuntimeError):
    """The exception a scenario's ``exception`` stop raises."""


class RecordedError(RuntimeError):
    """An error already recorded as another role's (the second fit of a session)."""


def units_of(batch: dict[str, Any]) -> list[int]:
    """The units of a batch, keyed as `tests.contract.truth` keys them (a clip by its video's id and
    the frame its first timestamp names)."""
    if "video_timestamps" in batch:
        first = (batch["video_timestamps"][:, 0] * FPS).round().long()
        keys = batch["id"].long() * truth.CLIP_KEY + first
    elif "input_ids" in batch:
        ids = batch["input_ids"]
        offset = (ids != truth.EOS).int().argmax(dim=1)
        token = ids.gather(1, offset[:, None])[:, 0]
        keys = token.long() * truth.WINDOW_KEY + offset.long()
    else:
        keys = batch["id"].long()
    if "source" in batch:
        keys = keys + batch["source"].long() * truth.BIG
    return [int(k) for k in keys.tolist()]


def clips_of(batch: dict[str, Any]) -> list[list[Any]] | None:
    """Each clip of a batch of clips as ``[frames' CRC-32 (truth.clip_digest), _clip_row, frame
    times]`` (None: not a batch of clips)."""
    if "video_timestamps" not in batch:
        return None
    video = batch["video"].cpu().numpy()
    times = batch["video_timestamps"].tolist()
    rows = batch["_clip_row"].tolist()
    return [[truth.clip_digest(video[i]), int(rows[i]), times[i]] for i in range(len(video))]


class Recorder:
    """Appends this process's events to ``<root>/<role>.rank<r>.jsonl``, one flushed line each.

    One per (root, role) and process (`recorder`): the model and the callbacks share it.
    """

    def __init__(self, root: str, role: str) -> None:
        self.root, self.role = Path(root), role
        self._file: Any = None

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            rank = int(os.environ.get("LOCAL_RANK", 0))  # set by Lightning's launcher for every rank but 0
            self._file = (self.root / f"{self.role}.rank{rank}.jsonl").open("a")
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_RECORDERS: dict[tuple[str, str], Recorder] = {}


def recorder(root: str, role: str) -> Recorder:
    return _RECORDERS.setdefault((str(root), role), Recorder(str(root), role))


class ContractModel(pl.LightningModule):
    """Learns a scalar; records every batch it trains, validates and predicts."""

    def __init__(self, root: str, role: str, sleep: float = 0.0) -> None:
        super().__init__()
        self.recorder = recorder(root, role)
        self.sleep = sleep
        self.weight = nn.Parameter(torch.zeros(1))
        self.batches = 0
        #: Set at the train end: later training steps are the compute-floor probe's replay.
        self.replaying = False
        self._val: list[int] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        units = units_of(batch)
        if self.replaying:
            self.recorder.write({"t": "replay", "units": units})
            return (self.weight - float(len(units))).pow(2).sum()
        self.batches += 1
        wide = batch.get("wide")  # `tests.worker_probe.WidenRows`: every value is its row's id
        if wide is not None and not torch.equal(wide, batch["id"].to(wide.dtype)[:, None].expand_as(wide)):
            raise AssertionError("a wide batch's values are not its rows' ids: its slab was overwritten")
        event = {"t": "batch", "epoch": self.current_epoch, "idx": batch_idx, "gstep": self.global_step, "units": units}
        clips = clips_of(batch)
        if clips is not None:
            event["clips"] = clips
        pid = batch.get("pid")  # ``lose``, ``record_pids`` (`tests.worker_probe.RecordProcess`): who made it
        if pid is not None:
            event["worker"] = int(pid[0]) != os.getpid()  # a DataLoader worker, not this (rank's) process
            event["at"] = time.monotonic()  # seconds, for `tests.contract.retrials.READY_S`
        self.recorder.write(event)
        if self.sleep:
            time.sleep(self.sleep)
        return (self.weight - float(len(units))).pow(2).sum()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._val += units_of(batch)

    def on_validation_epoch_end(self) -> None:
        self.recorder.write({"t": "val", "sanity": self.trainer.sanity_checking, "units": self._val})
        self._val = []

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.recorder.write({"t": "predict", "units": units_of(batch)})

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.recorder.write({"t": "test", "units": units_of(batch)})

    def record_as(self, root: str, role: str, sleep: float) -> None:
        """Record the next fit as ``role`` (a second fit of the same model in one process)."""
        self.recorder, self.sleep, self.batches, self.replaying = recorder(root, role), sleep, 0, False

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        epochs = self.trainer.fit_loop.epoch_progress.current  # processed > completed: in the epoch-end hooks
        checkpoint["contract"] = {"batches": self.batches, "epoch_end": epochs.processed > epochs.completed}
        cursor = checkpoint.get("LanceDataModule", {}).get("train_cursor")
        self.recorder.write({"t": "save", "batches": self.batches, "cursor": _plain(cursor)})

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(Callback):
    """Records each epoch's length as Lightning took it and the cursor at each epoch end; stops the run."""

    def __init__(self, root: str, role: str, stop_kind: str | None = None, stop_at: int | None = None) -> None:
        self.recorder = recorder(root, role)
        self.stop_kind, self.stop_at = stop_kind, stop_at

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        prepared.record_lines(trainer.datamodule, self.recorder)  # what this fit's prepare_data did

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.recorder.write(
            {"t": "epoch", "epoch": trainer.current_epoch, "num_training_batches": trainer.num_training_batches}
        )

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.stop_at is None or pl_module.batches != self.stop_at:
            return
        if self.stop_kind == "sigkill":
            if trainer.global_rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        elif self.stop_kind == "sigterm":  # as a scheduler stops a job; Lightning stops at the epoch end
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.stop_kind == "exception":
            raise ScenarioStop(f"scenario stop before batch {self.stop_at}")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        cursor = trainer.datamodule.state_dict().get("train_cursor")
        self.recorder.write({"t": "epoch_end", "epoch": trainer.current_epoch, "cursor": _plain(cursor)})

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        # Runs before the other callbacks' (the replay probe's): what the replay must leave as it is.
        pl_module.replaying = True
        self.recorder.write({"t": "train_end", **_model_state(trainer, pl_module)})

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        plan = trainer.datamodule.plans.get("train")
        self.recorder.write({"t": "fit_end", **_model_state(trainer, pl_module), "cache": getattr(plan, "cache", None)})


def _model_state(trainer: pl.Trainer, pl_module: Any) -> dict[str, Any]:
    return {"weight": float(pl_module.weight.detach().cpu().item()), "gstep": trainer.global_step}


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str)) if value is not None else None


# -- what the user's script (or YAML) holds -----------------------------------------------------------
def instantiate(spec: Any) -> Any:
    """A ``{"class_path", "init_args"}`` mapping (nested) as the object it names; other values as they are."""
    if isinstance(spec, dict) and "class_path" in spec:
        module, name = spec["class_path"].rsplit(".", 1)
        kind = getattr(__import__(module, fromlist=[name]), name)
        return kind(**{k: instantiate(v) for k, v in spec.get("init_args", {}).items()})
    if isinstance(spec, list):
        return [instantiate(v) for v in spec]
    if isinstance(spec, dict) and "uri" in spec:
        from lance_lightning import LanceSource
        from lance_lightning.source import Prepare

        made = {"prepare": Prepare(**spec["prepare"])} if isinstance(spec.get("prepare"), dict) else {}
        return LanceSource(**{**spec, **made})
    return spec


def _call(name: str, dm: LanceDataModule, out: Recorder) -> None:
    """One call a user script makes before ``fit``; its result is recorded."""
    result: Any = None
    if name == "explain":
        result = dm.explain("train").splitlines()[0]
    elif name == "setup":
        dm.setup("fit")
    elif name == "train_dataloader":
        result = len(dm.train_dataloader())
    elif name == "state_dict":
        result = _plain(dm.state_dict())
    elif name == "peek":
        result = len(units_of(next(iter(dm.train_dataloader()))))
    elif name == "dataset":
        result = type(next(iter(dm.train_dataloader().dataset))).__name__
    out.write({"t": "call", "name": name, "result": result})


def run_phase(spec: dict[str, Any]) -> None:
    """Run one phase (see the module docstring); errors are recorded, then raised again."""
    scenario = Scenario.from_json(spec["scenario"])
    role, root = spec["role"], spec["root"]
    out = recorder(root, role)
    switched = scenario_environment(scenario)
    before = {name: os.environ.get(name) for name in switched}
    os.environ.update(switched)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run_python(scenario, role, root, spec, out)
        # The package's warnings that mean a broken promise: a skipped cursor, a hold not taken or kept.
        skipped = [str(w.message) for w in caught if any(k in str(w.message) for k in ("data cursor", "Lance tag"))]
        if skipped:
            out.write({"t": "warning", "messages": skipped})
    except (ScenarioStop, SIGTERMException):
        out.write({"t": "stopped"})
    except RecordedError:  # the second fit of a session failed: recorded as the resumed run's error
        raise
    except Exception as error:
        out.write({"t": "error", "type": type(error).__name__, "message": str(error)[:4000]})
        raise
    finally:
        out.close()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_python(scenario: Scenario, role: str, root: str, spec: dict[str, Any], out: Recorder) -> None:
    topology = topology_of(scenario, role)
    data = data_arguments(scenario, topology, spec["uris"], reference=role == "reference", cache=spec.get("cache"))
    arguments = {k: instantiate(v) for k, v in data.items()}
    if "remote_cache" in arguments:
        from lance_lightning import RemoteCache

        arguments["remote_cache"] = RemoteCache(**arguments["remote_cache"])
    dm = LanceDataModule(**arguments)
    calls = {"stop": scenario.calls, "resume": scenario.resume.calls}.get(role, [])
    if calls and scenario.prepare is not None:  # a script planning before fit prepares first
        dm.prepare_data()
        prepared.record_lines(dm, out)
    for name in calls:
        _call(name, dm, out)
    model = ContractModel(root, role, sleep=step_sleep(scenario, role))
    callbacks = instantiate(callback_arguments(scenario, role, root))
    trainer = pl.Trainer(callbacks=callbacks, **trainer_arguments(scenario, role, topology, root))
    if role == "stop" and scenario.resume.session:
        _session(scenario, root, spec, dm, model, trainer, out)
        return
    trainer.fit(model, datamodule=dm, ckpt_path=spec.get("ckpt_path"))
    if role == "stop" and scenario.checkpoints.save_after_fit:
        trainer.save_checkpoint(str(Path(root) / "ckpt_stop" / "saved.ckpt"))
    if role == "resume":
        for name in scenario.resume.after_fit:
            getattr(trainer, name)(model, datamodule=dm)
    out.write({"t": "end", "batches": model.batches, "cursor": _plain(dm.state_dict().get("train_cursor"))})


def _session(
    scenario: Scenario, root: str, spec: dict[str, Any], dm: Any, model: Any, trainer: pl.Trainer, out: Recorder
) -> None:
    """A user script fitting twice in one process: the stopped fit (an exception stop is caught, as
    a script catching it would), ``trainer.save_checkpoint``, the calls between the fits on the
    first trainer, then a new ``Trainer`` and ``fit(model, datamodule=dm, ckpt_path=<a checkpoint
    the first fit wrote>)`` with the same data module and model, then the calls after fit. The
    second fit records as the ``resume`` role; the choice of checkpoint and the version holds
    between the fits are recorded as the ``stop`` role's (``chosen``, ``holds``)."""
    from tests.contract.runner import _checkpoints, choose

    try:
        trainer.fit(model, datamodule=dm)
    except ScenarioStop:
        out.write({"t": "stopped"})
    if scenario.checkpoints.save_after_fit and scenario.stop.kind != "exception":
        trainer.save_checkpoint(str(Path(root) / "ckpt_stop" / "saved.ckpt"))
    for name in scenario.resume.between:
        getattr(trainer, name)(model, datamodule=dm)
    out.write({"t": "end", "batches": model.batches, "cursor": _plain(dm.state_dict().get("train_cursor"))})
    chosen = choose(_checkpoints(Path(root) / "ckpt_stop"), scenario.checkpoints.pick, scenario.checkpoints.resume_from)
    if trainer.global_rank == 0:
        out.write({"t": "holds", "holds": truth.holds(spec["uris"])})
    out.write({"t": "chosen", "path": chosen.path if chosen is not None else None})
    then = recorder(root, "resume")
    model.record_as(root, "resume", step_sleep(scenario, "resume"))
    callbacks = instantiate(callback_arguments(scenario, "resume", root))
    second = pl.Trainer(callbacks=callbacks, **trainer_arguments(scenario, "resume", scenario.resume.topology, root))
    try:
        second.fit(model, datamodule=dm, ckpt_path=chosen.path if chosen is not None else None)
        for name in scenario.resume.after_fit:
            getattr(second, name)(model, datamodule=dm)
    except Exception as error:
        then.write({"t": "error", "type": type(error).__name__, "message": str(error)[:4000]})
        raise RecordedError(str(error)) from error
    then.write({"t": "end", "batches": model.batches, "cursor": _plain(dm.state_dict().get("train_cursor"))})
    then.close()


if __name__ == "__main__":
    # Run the module's own copy (as `tests.contract.phase`), so that the classes the YAML and the
    # callbacks name (`Probe`, `ScenarioStop`) are the ones `run_phase` catches.
    from tests.contract.phase import run_phase as run

    try:
        run(json.loads(Path(sys.argv[1]).read_text()))
    except Exception:
        sys.exit(3)
