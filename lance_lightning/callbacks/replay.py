"""The compute floor: the training step timed on cached batches, with data for free.

Guarantees:
- `ReplayProbe.keep` keeps deep copies of the first ``batches`` batches the training step received
  (on the device, after the batch-transfer hooks and the ``device_transform``); nothing else.
- `ReplayProbe.replay` runs ``steps`` training steps on those batches, in turn, the way Lightning's
  loop runs a step: the strategy's ``training_step`` (precision context, DDP wrapper), then with
  automatic optimization ``zero_grad``, the strategy's ``backward`` and the module's
  ``optimizer_step`` (precision plugin, loss scaler, gradient clipping, ``accumulate_grad_batches``);
  with manual optimization the ``training_step`` alone. It reads no data, ``self.log`` is a no-op
  meanwhile, and it returns the mean seconds per step (on CUDA the clock is read after a
  synchronize); ``threads`` holds the torch intra-op threads of the thread that ran it. Under DDP
  every rank must call it (the backward all-reduces gradients).
- Afterwards the module's parameters and buffers, gradients, optimizer and LR scheduler states,
  the precision plugin's state and the RNG states (Python, NumPy, torch, CUDA) are those from
  before the replay: the trained model is unchanged. Not undone: Python attributes the training
  step sets on the module, and what callback hooks run inside the step (``on_before_backward``,
  ``on_after_backward``, ``on_before_optimizer_step``) do.
- A SIGTERM received before or during the replay (Lightning's ``trainer.received_sigterm``) stops it
  before the next step: the state is restored as above and Lightning's ``SIGTERMException`` is
  raised, so the fit ends as Lightning ends one stopped by SIGTERM (``on_exception`` checkpoints,
  then status 143 under `lance_lightning.lifetime.exit_on_sigterm` and ``lance-lightning``), never
  after the remaining steps with status 0. Under DDP rank zero's flag is broadcast before each step
  (as Lightning's loop does), so every rank stops at the same step.
- `floor_figures` sets the floor beside the real run's figures (`REPLAY_FIGURES`).

Caveats, by design: the replay runs after training, on warm caches and a warm allocator, with no
loader threads competing for the CPU, and without the loop's own work (callbacks, logging,
validation, checkpoints); the real step pays for all of these, so the floor is a lower bound.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from lance_lightning.checks import check_int
from lance_lightning.metrics.figures import REPLAY_FIGURES, REPLAY_PARTS, batch_size_and_bytes
from lance_lightning.metrics.report import loader_seconds

#: Replayed steps when ``replay_steps`` is not given.
DEFAULT_REPLAY_STEPS = 20


class ReplayProbe:
    """Caches the first ``batches`` training batches and replays them for ``steps`` steps."""

    def __init__(self, batches: Any, steps: Any) -> None:
        fix = "pass the number of training batches to cache on the device and replay, e.g. 4"
        check_int("DataLoadingMonitor.replay_batches", batches, 1, fix)
        fix = f"pass the number of steps to replay, e.g. {DEFAULT_REPLAY_STEPS}"
        check_int("DataLoadingMonitor.replay_steps", steps, 1, fix)
        self.batches = batches
        self.steps = steps
        self.cached: list[Any] = []
        self.rows: list[int] = []  # rows of each cached batch
        self.threads = 0  # torch intra-op threads of the thread that replayed

    def reset(self) -> None:
        self.cached, self.rows = [], []

    def keep(self, batch: Any) -> None:
        """Keep a copy of ``batch`` while fewer than ``batches`` are cached (the step may change its own)."""
        if len(self.cached) < self.batches:
            self.cached.append(copy.deepcopy(batch))
            self.rows.append(batch_size_and_bytes(batch)[0])

    def rows_per_step(self) -> float:
        """Mean rows of the ``steps`` replayed batches."""
        return sum(self.rows[index % len(self.rows)] for index in range(self.steps)) / self.steps

    def replay(self, trainer: Any, module: Any) -> float:
        """Seconds per step of ``steps`` training steps on the cached batches; the model is left unchanged."""
        _stop_on_sigterm(trainer)
        saved = _TrainingState(trainer, module)
        self.threads = torch.get_num_threads()
        try:
            with _no_logging(module), torch.enable_grad():
                _synchronize(module.device)
                start = time.perf_counter()
                for index in range(self.steps):
                    _stop_on_sigterm(trainer)
                    _step(trainer, module, self.cached[index % len(self.cached)], index)
                _synchronize(module.device)
                seconds = (time.perf_counter() - start) / self.steps
        finally:
            saved.restore()
        _stop_on_sigterm(trainer)  # received during the last step
        return seconds


def floor_figures(
    fig: Mapping[str, float], config: Mapping[str, Any], replayed_s: float, probe: ReplayProbe
) -> dict[str, float]:
    """The real run's figures ``fig`` against ``probe``'s replay, ``replayed_s`` seconds per step
    (the `REPLAY_FIGURES` names, in their order). Batches of varying rows (e.g. token windows) make
    the floor per batch that of the fit's mean rows per batch: step time taken as proportional to rows."""
    measured = max(fig["batches"], 1.0)
    rows, fit_rows = probe.rows_per_step(), fig["rows"] / measured
    floor_s = replayed_s * fit_rows / rows if rows > 0 and fit_rows > 0 else replayed_s
    cycle = (fig["wait_s"] + fig["step_s"]) / measured
    wait = fig["wait_s"] / measured
    seconds = loader_seconds(fig, config)
    busy = sum(seconds.values())
    out = {
        "steps": probe.steps,
        "batches": len(probe.cached),
        "rows_per_step": rows,
        "replayed_step_s": replayed_s,
        "rows_per_batch": fit_rows,
        "intraop_threads": probe.threads,
        "step_s": floor_s,
        "real_step_s": cycle,
        "speedup": cycle / floor_s if floor_s > 0 else 0.0,
        "speedup_without_wait": cycle / (cycle - wait) if cycle > wait else 0.0,
        "compute_share": floor_s / cycle if cycle > 0 else 0.0,
        "wait_share": fig["wait_fraction"],
    }
    out["rest_share"] = max(0.0, 1.0 - out["compute_share"] - out["wait_share"])
    for part in REPLAY_PARTS:
        out[f"wait_share/{part}"] = fig["wait_fraction"] * seconds[part] / busy if busy > 0 else 0.0
    return {name: float(out[name]) for name in REPLAY_FIGURES}


def _step(trainer: Any, module: Any, batch: Any, index: int) -> None:
    """One training step on ``batch``, as Lightning's automatic (or manual) optimization runs it."""
    strategy = trainer.strategy
    if not module.automatic_optimization:
        strategy.training_step(batch, index)
        return
    optimizer = module.optimizers()
    accumulate = trainer.accumulate_grad_batches

    def closure() -> torch.Tensor | None:
        output = strategy.training_step(batch, index)
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if loss is None:  # the step skipped this batch
            return None
        loss = loss / accumulate
        if index % accumulate == 0:
            module.optimizer_zero_grad(trainer.current_epoch, index, optimizer)
        strategy.backward(loss, optimizer)
        return loss

    if (index + 1) % accumulate:
        closure()
    else:
        module.optimizer_step(trainer.current_epoch, index, optimizer, closure)


class _TrainingState:
    """A copy (on the CPU) of everything a training step changes, and its restoration."""

    def __init__(self, trainer: Any, module: Any) -> None:
        self.trainer, self.module = trainer, module
        self.params = list(module.parameters())
        self.weights = {name: _cpu(value) for name, value in module.state_dict().items()}
        self.grads = [None if p.grad is None else _cpu(p.grad) for p in self.params]
        self.optimizers = [_cpu(optimizer.state_dict()) for optimizer in trainer.optimizers]
        self.schedulers = [copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs]
        self.precision = copy.deepcopy(trainer.precision_plugin.state_dict())
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        trainer = self.trainer
        self.module.load_state_dict(self.weights)
        with torch.no_grad():
            for param, grad in zip(self.params, self.grads):
                param.grad = None if grad is None else grad.to(param.device)
        for optimizer, state in zip(trainer.optimizers, self.optimizers):
            optimizer.load_state_dict(state)
        for config, state in zip(trainer.lr_scheduler_configs, self.schedulers):
            config.scheduler.load_state_dict(state)
        trainer.precision_plugin.load_state_dict(self.precision)
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _cpu(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: _cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(item) for item in value)
    return copy.deepcopy(value)


@contextlib.contextmanager
def _no_logging(module: Any) -> Iterator[None]:
    """``module.log`` and ``log_dict`` do nothing (replayed steps are not part of the run's metrics)."""
    names = ("log", "log_dict")
    own = {name: module.__dict__[name] for name in names if name in module.__dict__}
    for name in names:
        object.__setattr__(module, name, _ignore)
    try:
        yield
    finally:
        for name in names:
            module.__dict__.pop(name, None)
        module.__dict__.update(own)


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


def _stop_on_sigterm(trainer: Any) -> None:
    """Raise Lightning's ``SIGTERMException`` if the trainer received SIGTERM (under DDP: rank zero did)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    received = bool(getattr(trainer, "received_sigterm", False))
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        flag = torch.tensor([int(received)], device=trainer.strategy.root_device)
        torch.distributed.broadcast(flag, src=0)
        received = bool(flag.item())
    if received:
        raise SIGTERMException()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
