"""The data module's arguments as hyperparameters: plain, redacted, and what ``load_from_checkpoint`` rebuilds.

Guarantees:
- `save_arguments` stores a data module's constructor arguments in its ``hparams`` (so Lightning
  writes them into checkpoints and loggers) as plain values, in the form LightningCLI's configs
  take: a source as a mapping of its fields, a strategy, policy or transform as ``{class_path,
  init_args}``, with every credential redacted (``storage_options`` values, URL userinfo, a
  namespace's ``properties``). Checkpoints keep loading with ``weights_only=True``.
- ``LanceDataModule.load_from_checkpoint(path)`` rebuilds an equal data module through
  LightningCLI's instantiator (the one Lightning trusts), from Python and from the CLI alike;
  arguments given to it replace the saved ones (redacted credentials must be given again: a source
  whose options hold the placeholder is refused at ``setup``).
- An argument is described from its object: a dataclass by its fields, another object by the
  attributes named as its constructor's parameters (every class the package ships keeps them).
  An object that does not keep them is left out of ``hparams`` with a `UserWarning` naming the
  argument and its class, never saved wrong; ``load_from_checkpoint`` then needs it given.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from lance_lightning.redaction import redact_config, redact_options

#: LightningCLI's instantiator, which ``load_from_checkpoint`` runs for these hyperparameters.
INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


class NotDescribable(ValueError):
    """An object whose constructor arguments cannot be read back from it."""


def save_arguments(module: Any, arguments: Mapping[str, Any]) -> None:
    """Store ``arguments`` (the constructor's, by name) in ``module.hparams`` (see the module docstring)."""
    plain: dict[str, Any] = {}
    for name, value in arguments.items():
        try:
            plain[name] = describe(value)
        except NotDescribable as error:
            warnings.warn(
                f"`{name}` ({type(value).__qualname__}) is not saved in the checkpoint's hyperparameters: {error}; "
                f"`{type(module).__name__}.load_from_checkpoint(path, {name}=...)` must give it",
                UserWarning,
                stacklevel=3,
            )
    hyperparameters = {**redact_config(_redact_namespaces(plain)), "_instantiator": INSTANTIATOR}
    # The frame is given (not held in a variable: Lightning reads this frame's locals, and a local
    # naming the frame would be a reference cycle that keeps `module` until the cyclic GC runs).
    module.save_hyperparameters(hyperparameters, frame=inspect.currentframe())


def describe(value: Any) -> Any:
    """``value`` as plain types that LightningCLI's parser turns back into an equal object."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [describe(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): describe(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [field for field in dataclasses.fields(value) if field.init]
        described = {field.name: describe(getattr(value, field.name)) for field in fields}
        if type(value).__module__ == "lance_lightning.source":  # LanceSource, Prepare: typed fields, a mapping
            return described
        return {"class_path": _class_path(value), "init_args": described}
    return {"class_path": _class_path(value), "init_args": _init_arguments(value)}


def _init_arguments(value: Any) -> dict[str, Any]:
    parameters = inspect.signature(type(value).__init__).parameters
    arguments: dict[str, Any] = {}
    for name, parameter in list(parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise NotDescribable(f"its constructor takes *{name}")
        if not hasattr(value, name):
            raise NotDescribable(f"it keeps no attribute `{name}` for its constructor's parameter")
        arguments[name] = describe(getattr(value, name))
    return arguments


def _class_path(value: Any) -> str:
    cls = type(value)
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        raise NotDescribable("its class cannot be imported by name (defined in a function or the main script)")
    return f"{cls.__module__}.{cls.__qualname__}"


def _redact_namespaces(value: Any) -> Any:
    """``value`` with each source's namespace ``properties`` redacted (they may hold credentials)."""
    if isinstance(value, dict):
        return {
            key: (
                {**item, "properties": redact_options(item.get("properties") or {})}
                if key == "namespace" and isinstance(item, dict)
                else _redact_namespaces(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact_namespaces(item) for item in value]
    return value
