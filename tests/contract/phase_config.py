"""What a phase of a scenario runs, as configuration: the data module's, the callbacks' and the
trainer's arguments (the ``data:``, ``trainer.callbacks:`` and ``trainer:`` sections of the YAML a
user writes), the training step's sleep, the environment a scenario's processes set, and the whole
config of a CLI phase (`cli_config`).

Guarantees: the same arguments build the phase in process (`tests.contract.phase.run_phase`
instantiates them) and through ``lance-lightning fit --config`` (`cli_config` writes them), so a
scenario's Python and CLI runs differ only in how they start; the reference role reads every
epoch's whole sequence (batch `REFERENCE_BATCH`, ``drop_last=False``, no stop, no transform).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lance_lightning.load.forked_server import ENV_SWITCH as FORKED_SERVER
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.race import CHOICE_SWITCH
from tests.contract import prepared, replay, truth
from tests.contract.scenario import Scenario, Topology

#: Batch size of the reference run (any size gives the same sequence: the order is topology-free).
REFERENCE_BATCH = 8
_SHUFFLES = {
    "none": "lance_lightning.NoShuffle",
    "shard": "lance_lightning.ShardShuffle",
    "row": "lance_lightning.RowShuffle",
    "buffer": "lance_lightning.BufferShuffle",
}


def data_arguments(
    scenario: Scenario, topology: Topology, uris: list[str], *, reference: bool, cache: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The data module's arguments, as a YAML ``data:`` section holds them (class_path/init_args);
    ``cache``: the ``remote_cache`` arguments of a scenario on S3 (`tests.contract.store`)."""
    columns = ["tokens", "n_tokens"] if scenario.packing is not None else ["id", "x"]
    if scenario.clips is not None:
        columns = ["id", "label", "video"]

    def source(index: int, filter: str | None) -> dict[str, Any]:
        made = scenario.prepare is not None and index == prepared.TABLE  # "prepare, then fit"
        extra = {"prepare": prepared.spec(scenario, Path(uris[index]).parent)} if made else {}
        return {"uri": uris[index], "columns": columns, "filter": filter, **extra}

    mixture = scenario.mixture
    if mixture is None:
        train: dict[str, Any] = source(scenario.source.table, scenario.source.filter)
    else:
        train = {
            "class_path": "lance_lightning.LanceMixture",
            "init_args": {
                "sources": [source(s.table, s.filter) for s in mixture.sources],
                "weights": None if mixture.schedule is not None else mixture.weights,
                "schedule": mixture.schedule,
                "interpolate": mixture.interpolate,
                "step_samples": mixture.step_samples,
                "epoch": mixture.epoch,
                "samples": mixture.samples,
                "block": mixture.block,
            },
        }
    spec = scenario.shuffle
    shuffle_args = {
        "none": {},
        "shard": {"shard_rows": spec.shard_rows, "seed": spec.seed, "shuffle_within_shard": spec.within},
        "row": {"seed": spec.seed, "clump_rows": spec.clump_rows},
        "buffer": {"buffer_rows": spec.buffer_rows, "seed": spec.seed, "shard_rows": spec.shard_rows},
    }[spec.kind]
    after = [] if scenario.cli else [*scenario.resume.after_fit, *scenario.resume.between]
    loop = scenario.loop
    evaluated = not reference and (
        loop.val_check_interval is not None or loop.validate or loop.check_val_every_n_epoch != 1 or "validate" in after
    )
    data: dict[str, Any] = {
        "train": train,
        "val": source(0, None) if evaluated else None,
        "test": source(0, None) if "test" in after and not reference else None,
        "predict": source(0, None) if "predict" in after and not reference else None,
        "batch_size": REFERENCE_BATCH if reference else topology.batch_size,
        "eval_batch_size": 5,
        "shuffle": {"class_path": _SHUFFLES[spec.kind], "init_args": shuffle_args},
        "drop_last": False if reference else scenario.drop_last,
        "num_workers": topology.num_workers,
        "reader_threads": topology.reader_threads,
        "take_group_bytes": topology.take_group_bytes,
        "hold_versions": "off" if reference else scenario.hold,
    }
    if cache is not None:
        data["remote_cache"] = {k: v for k, v in cache.items() if k != "exceeds"}
    if scenario.wide and not reference:
        data["transform"] = {"class_path": "tests.worker_probe.WidenRows"}
        if scenario.wide_bytes is not None:
            data["transform"]["init_args"] = {"batch_bytes": scenario.wide_bytes, "min_width": 1}
    if scenario.record_pids and not reference:  # who made each batch: `tests.contract.readers`
        data["transform"] = {"class_path": "tests.worker_probe.RecordProcess"}
    if scenario.lose and not reference:  # the workers lose every trial of the race: it tries them again
        data["transform"] = {"class_path": "tests.worker_probe.SlowInWorkers", "init_args": {"wait_for_server": True}}
    if scenario.clips is not None:
        data["clips"] = {"class_path": "lance_lightning.VideoClips", "init_args": truth.clip_arguments(scenario.clips)}
    if scenario.packing is not None:
        packing = scenario.packing
        data["packing"] = {
            "class_path": "lance_lightning.TokenPacking",
            "init_args": {
                "column": "tokens",
                "seq_len": packing.seq_len,
                "eos_id": truth.EOS if packing.eos else None,
                "labels": packing.labels,
                "lengths_column": "n_tokens" if packing.lengths_column else None,
            },
        }
    return data


def callback_arguments(scenario: Scenario, role: str, root: str) -> list[dict[str, Any]]:
    """The callbacks, as a YAML ``trainer.callbacks:`` list holds them."""
    stop = scenario.stop if role == "stop" else None
    stop_at = int(stop.at) if stop is not None and stop.kind in ("exception", "sigkill", "sigterm") else None
    probe = {"root": root, "role": role, "stop_kind": stop.kind if stop else None, "stop_at": stop_at}
    callbacks = [{"class_path": "tests.contract.phase.Probe", "init_args": probe}]
    if role == "reference":
        return callbacks
    if scenario.cursor_callback:
        callbacks.append({"class_path": "lance_lightning.DataCursorCheckpoint"})
    spec, folder = scenario.checkpoints, str(Path(root) / f"ckpt_{role}")
    every = {"dirpath": folder, "filename": "{step}", "every_n_train_steps": spec.every, "save_top_k": -1}
    every["save_last"] = spec.save_last
    callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": every})
    if spec.default_callback:
        default = {"dirpath": folder, "filename": "d-{epoch}-{step}", "save_top_k": -1}
        callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": default})
    if spec.on_exception:
        exception = {"dirpath": folder, "filename": "on_exception"}
        callbacks.append({"class_path": "lightning.pytorch.callbacks.OnExceptionCheckpoint", "init_args": exception})
    if scenario.replay is not None:  # after `Probe`, whose train end marks the model as replaying
        callbacks.append(replay.callback(scenario.replay))
    return callbacks


def trainer_arguments(scenario: Scenario, role: str, topology: Topology, root: str) -> dict[str, Any]:
    loop = scenario.loop
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=topology.world_size,
        strategy="ddp" if topology.world_size > 1 else "auto",
        max_epochs=scenario.data_epochs + 1 if role == "reference" else loop.epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(root) / f"root_{role}"),
        enable_checkpointing=role != "reference",
    )
    if role == "reference":
        return kwargs
    kwargs.update(
        accumulate_grad_batches=loop.accumulate,
        limit_train_batches=loop.limit_train_batches,
        reload_dataloaders_every_n_epochs=loop.reload_every,
    )
    if loop.val_check_interval is not None:
        kwargs["val_check_interval"] = loop.val_check_interval
    if loop.check_val_every_n_epoch != 1:
        kwargs["check_val_every_n_epoch"] = loop.check_val_every_n_epoch
    if loop.num_sanity_val_steps != 2:
        kwargs["num_sanity_val_steps"] = loop.num_sanity_val_steps
    stop, resume = scenario.stop, scenario.resume
    if role == "stop" and stop.kind == "max_steps":
        kwargs["max_steps"] = int(stop.at)
    elif role == "stop" and stop.kind == "epoch_end":
        kwargs["max_epochs"] = int(stop.at)
    elif role == "stop" and stop.kind == "max_time":
        kwargs["max_time"] = {"seconds": int(stop.at)}
    if role == "resume":
        kwargs["max_epochs"] = scenario.resume_epochs
        if resume.max_steps is not None:
            kwargs["max_steps"] = 100_000 if resume.max_steps == "loose" else int(resume.max_steps)
        if resume.max_time is not None:
            kwargs["max_time"] = {"seconds": int(resume.max_time)}
    return kwargs


def step_sleep(scenario: Scenario, role: str) -> float:
    """Seconds each training step of the run sleeps (a time budget needs a run long enough to cut)."""
    return {"stop": scenario.step_sleep, "resume": scenario.resume.step_sleep}.get(role, 0.0)


def topology_of(scenario: Scenario, role: str) -> Topology:
    if role == "reference":
        return Topology(reader_threads=2)
    return scenario.topology if role == "stop" else scenario.resume.topology


def scenario_environment(scenario: Scenario) -> dict[str, str]:
    """The environment variables a scenario's runs set (its processes and the ranks they launch)."""
    server = {FORKED_SERVER: "off"} if scenario.stock_server else {}
    if scenario.handoff is False:
        return {HANDOFF: "off", **server}
    # Who read is checked against the forced hand-over (`tests.contract.readers`): forced here, not
    # left to the suite's default (a soak outside pytest would race).
    choice = scenario.worker_choice or ("workers" if scenario.record_pids else None)
    return {CHOICE_SWITCH: choice, **server} if choice is not None else server


def cli_config(
    scenario: Scenario, role: str, root: str, uris: list[str], cache: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The YAML config of the phase for ``lance-lightning fit --config`` (the runner runs it)."""
    topology = topology_of(scenario, role)
    trainer = trainer_arguments(scenario, role, topology, root)
    trainer["callbacks"] = callback_arguments(scenario, role, root)
    model_args = {"root": root, "role": role, "sleep": step_sleep(scenario, role)}
    return {
        "trainer": trainer,
        "model": {"class_path": "tests.contract.phase.ContractModel", "init_args": model_args},
        "data": data_arguments(scenario, topology, uris, reference=False, cache=cache),
    }
