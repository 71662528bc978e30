"""What a prediction rerun checks before it predicts anything: that the dataset at the path is
the one the run's pieces were computed from, and that the model is the one that computed them.

Guarantees:
- `stale` says why a run folder belongs to another dataset than the one now at the path (deleted
  and written again: the read version is gone or its data files differ from the fingerprint in
  ``run.json``; a marker whose version is gone, was committed by no run of this id, or whose
  columns the dataset lacks), or ``None``: the writer then starts the run over.
- `model_identity` names what computes the values: the module's class, its hyperparameters, a
  hash of the source of ``predict_step`` and ``forward`` and, once a checkpoint is loaded, a hash
  of its weights (``checkpoint``, the trainer's ``ckpt_path``, is only shown).
- `model_refusal` is the `ConfigError` for a model other than the one whose outputs the run holds
  (stored pieces or records, or committed columns), naming each part that changed with both
  values and the fix; ``None`` when nothing changed or the run holds nothing yet.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import replace
from typing import Any

import lance
import torch

from lance_lightning.errors import ConfigError
from lance_lightning.source import PinnedSource
from lance_lightning.write import predict_commit as commits
from lance_lightning.write.predict_store import RunFolder


def stale(folder: RunFolder, source: PinnedSource, run: str, table: str | None, names: list[str]) -> str | None:
    """Why the run in ``folder`` was not computed from the dataset now at ``source``'s path, or ``None``."""
    state, marker = folder.read_json("run.json"), folder.read_json("marker.json")
    if marker is not None and not table:
        return _stale_commit(source, marker["version"], run, names)
    if marker is not None or state is None or "files" not in state:  # a run.json of an older release: unknown
        return None
    try:
        files = commits.fingerprint(replace(source, version=state["version"]).open())
    except Exception:  # noqa: BLE001 - a version that is gone: the dataset was written again
        files = "(version not found)"
    if files == state.get("files"):
        return None
    return f"its version {state['version']} has other data files ({files}, the run read {state.get('files')})"


def _stale_commit(source: PinnedSource, version: int, run: str, names: list[str]) -> str | None:
    """Why the dataset at the path does not hold the run's commit ``version`` (a version cleaned up
    since, whose transaction cannot be read, is not a reason: the columns still tell)."""
    latest = lance.dataset(source.location, storage_options=source.storage_options)
    if latest.version < version:
        return f"it has no version {version}, which the run committed"
    try:
        transaction = latest.read_transaction(version)
    except Exception:  # noqa: BLE001 - a cleaned-up version has no transaction to read
        transaction = None
    if transaction is not None and (transaction.transaction_properties or {}).get(commits.RUN_PROPERTY) != run:
        return f"its version {version} was not committed by this run"
    missing = sorted(set(names) - set(latest.schema.names))
    return f"its latest version has no column {missing}" if missing else None


def model_refusal(
    folder: RunFolder,
    names: list[str],
    run: str,
    where: str,
    table: str | None,
    source: PinnedSource,
    saved: dict[str, str] | None,
    current: dict[str, str],
) -> ConfigError | None:
    """The `ConfigError` for another model than the one whose outputs the run holds (module docstring)."""
    changed = model_change(saved, current)
    marker = folder.read_json("marker.json")
    if not changed or not (marker is not None or folder.recorded() or folder.stored()):
        return None
    what = "; ".join(f"{name} was {was}, now {now}" for name, was, now in changed)
    if marker is not None:
        return ConfigError(
            "LancePredictionWriter.columns",
            names,
            f"run {run} committed these column(s) of {table or source.uri} in version {marker['version']} with "
            f"another model: {what}",
            "set overwrite: true to replace them with this model's outputs, or write other columns",
        )
    version = (folder.read_json("run.json") or {}).get("version")
    return ConfigError(
        "model",
        current["class"],
        f"run {run} (folder {where}) holds outputs another model predicted, and finishing it with this one would "
        f"mix two models' outputs: {what}",
        f"rerun with the first model to finish the run, or start over with this one: delete the run folder {where} "
        f"and release its hold ({commits.release_hint(source, commits.hold_tag(source, run, version))})",
    )


#: What `model_change` names for each key of `model_identity`.
MODEL_PARTS = {
    "class": "the LightningModule's class",
    "hparams": "its hyperparameters (self.hparams)",
    "code": "the source of its predict_step/forward",
    "weights": "its weights (the loaded checkpoint, or the weights it was built with)",
}


def model_identity(pl_module: Any, trainer: Any = None, weights: bool = True) -> dict[str, str]:
    """What computes the values: ``class``, ``hparams``, ``code`` (a hash of the source of
    ``predict_step`` and ``forward``) and, with ``weights`` (once a checkpoint is loaded), a hash
    of the state dict; ``checkpoint`` (the trainer's ``ckpt_path``) is only shown."""
    kind = type(pl_module)
    hparams = json.dumps(dict(getattr(pl_module, "hparams", {}) or {}), sort_keys=True, default=repr)
    hparams = re.sub(r" at 0x[0-9a-fA-F]+", "", hparams)  # an object's default repr names its address
    code = hashlib.sha256()
    for name in ("predict_step", "forward"):
        function = getattr(kind, name, None)
        source = None
        if function is not None:
            try:
                source = inspect.getsource(function)
            except (OSError, TypeError):
                pass
        code.update((repr(getattr(function, "__qualname__", function)) if source is None else source).encode())
    identity = {"class": f"{kind.__module__}.{kind.__qualname__}", "hparams": hparams, "code": code.hexdigest()[:16]}
    if weights:
        digest = hashlib.sha256()
        for name, tensor in pl_module.state_dict().items():
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            if tensor.device.type != "meta":
                digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        identity["weights"] = digest.hexdigest()[:16]
        identity["checkpoint"] = str(getattr(trainer, "ckpt_path", None) or "")
    return identity


def model_change(saved: dict[str, str] | None, current: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(what, was, now)`` for each part of `model_identity` that differs (parts either lacks are skipped)."""
    if not saved:
        return []
    changed = []
    for key, what in MODEL_PARTS.items():
        if key in saved and key in current and saved[key] != current[key]:
            was, now = saved[key], current[key]
            if key == "weights":
                was += f" from {saved.get('checkpoint') or 'no checkpoint'}"
                now += f" from {current.get('checkpoint') or 'no checkpoint'}"
            changed.append((what, was, now))
    return changed
