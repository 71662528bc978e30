"""`DataLoadingMonitor`: where the loader's time goes, in the trainer's loggers and in one report.

Guarantees:
- Every ``log_every_n_steps`` training steps (the trainer's setting by default), it logs the
  figures of the steps since its previous log (`lance_lightning.metrics.figures.FIGURES`) to every
  logger in ``trainer.loggers``, as ``data/<figure>``, at the step Lightning's own ``self.log``
  uses for that batch; at each train epoch end it logs the epoch's figures as
  ``data/epoch/<figure>``.
- Under DDP every rank measures its own loader and the figures are gathered at the same steps on
  every rank: ``data/<figure>`` is the mean over ranks, ``data/<figure>_min`` and ``_max`` show
  stragglers. Only global rank zero writes.
- At the end of fit, rank zero prints the report (`lance_lightning.metrics.report`) of the whole fit: the
  bottleneck (storage, decode, convert, other, workers or the model), the numbers and the first
  thing to change. ``report()`` returns it at any time (this rank's figures while fitting).
- With a `LanceMixture` train split it also logs, at the same steps, each source's samples in the
  epoch so far (all ranks), their share and the share the mixture's weights or schedule set for
  those samples: ``data/mixture/<name>/rows``, ``.../share`` and ``.../scheduled_share``.
- With ``replay_batches=N`` it also measures the compute floor (`lance_lightning.callbacks.replay`):
  it keeps copies of the first N batches the training step received and, when training ends,
  replays them for ``replay_steps`` steps with data for free, then restores the model and optimizer
  states. The report adds the floor beside the real step cycle, the wait by loader part and the
  speed-up available from the data side; the same figures are logged once as
  ``data/replay/<figure>`` (`lance_lightning.metrics.figures.REPLAY_FIGURES`).
- It only reads the train `LanceDataLoader`'s measurements; with any other loader, or one built
  with ``metrics=False``, it warns once and does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lance_lightning.callbacks.replay import DEFAULT_REPLAY_STEPS, ReplayProbe, floor_figures
from lance_lightning.checks import check_int
from lance_lightning.metrics.figures import FIGURES, figures
from lance_lightning.metrics.meter import Snapshot
from lance_lightning.metrics.report import Diagnosis, diagnose, format_report
from lance_lightning.plan.mixture_plan import MixturePlan

#: Figures logged every N steps (first-batch time and epochs only make sense per epoch).
STEP_FIGURES = tuple(name for name in FIGURES if name not in ("epochs", "first_batch_s"))
#: Figures logged at each epoch end.
EPOCH_FIGURES = tuple(name for name in FIGURES if name != "epochs")


class DataLoadingMonitor(Callback):
    """Logs the train loader's waits, stage times, I/O and throughput; reports the bottleneck.

    Args:
        log_every_n_steps: Log every this many training steps; ``None`` uses the trainer's
            ``log_every_n_steps``; 0 logs only at epoch ends.
        prefix: Prefix of every logged name (a TensorBoard section).
        report: Print the end-of-fit report on global rank zero.
        replay_batches: Measure the compute floor: cache this many training batches on the device
            and replay them when training ends (`lance_lightning.callbacks.replay`); ``None``: off.
        replay_steps: Training steps to replay on the cached batches.
    """

    def __init__(
        self,
        log_every_n_steps: int | None = None,
        prefix: str = "data/",
        report: bool = True,
        replay_batches: int | None = None,
        replay_steps: int = DEFAULT_REPLAY_STEPS,
    ) -> None:
        check_int(
            "DataLoadingMonitor.log_every_n_steps",
            log_every_n_steps,
            0,
            "pass None (the trainer's log_every_n_steps), 0 (epoch ends only) or a step count",
            optional=True,
        )
        self.log_every_n_steps = log_every_n_steps
        self.prefix = prefix
        self.print_report = report
        probe = ReplayProbe(1 if replay_batches is None else replay_batches, replay_steps)  # checks both
        self._probe = probe if replay_batches is not None else None
        self.replay: dict[str, float] | None = None  # the compute floor's figures, after a replay
        self.per_rank: list[dict[str, float]] | None = None  # the fit's figures, one dict per rank
        self.diagnosis: Diagnosis | None = None
        self._loader: Any = None
        self._config: dict[str, Any] = {}
        self._retired: Snapshot | None = None  # fit totals of train loaders replaced during the fit
        self._fit_start: Snapshot | None = None
        self._epoch_start: Snapshot | None = None
        self._window_start: Snapshot | None = None
        self._warned = False

    # -- hooks --------------------------------------------------------------------------------
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.per_rank, self.diagnosis, self._retired, self._loader = None, None, None, None
        self.replay = None
        if self._probe is not None:
            self._probe.reset()
        self._attach(trainer)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._attach(trainer)
        if self._loader is not None:
            self._epoch_start = self._loader.metrics_snapshot()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._probe is not None and self._loader is not None:
            self._probe.keep(batch)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._loader is None:
            return
        self._loader.meter.step_end(time.perf_counter())
        every = self.log_every_n_steps
        if every is None:  # Lightning sets the trainer's in its logger connector, undeclared on the class
            every = trainer.log_every_n_steps  # type: ignore[attr-defined]
        step = _log_step(trainer)
        if every and (step + 1) % every == 0 and trainer.loggers:
            now = self._loader.metrics_snapshot()
            span = figures(now.minus(self._window_start))
            self._window_start = now
            self._log(trainer, pl_module, span, STEP_FIGURES, self.prefix, step)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._loader is None or not trainer.loggers:
            return
        span = figures(self._loader.metrics_snapshot().minus(self._epoch_start))
        # Lightning writes epoch-end metrics at the epoch's last step (its counter has moved past it).
        self._log(trainer, pl_module, span, EPOCH_FIGURES, f"{self.prefix}epoch/", max(_log_step(trainer) - 1, 0))

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._loader is None:
            return
        self._config = self._loader.describe()  # what the loader did (e.g. who read: its workers' race)
        per_rank = self.per_rank = _gather(trainer, pl_module, self._fit_figures())
        worst = max(range(len(per_rank)), key=lambda r: per_rank[r]["wait_fraction"])
        self.diagnosis = diagnose(per_rank[worst], self._config, rank=worst)
        if self._probe is not None and self._probe.cached:
            self._replay(trainer, pl_module, self._probe, per_rank, worst)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.print_report and self.per_rank is not None and trainer.is_global_zero:
            print(self.report(), flush=True)

    # -- the report ---------------------------------------------------------------------------
    def report(self) -> str:
        """The data loading report of the fit (all ranks after it ended; this rank's so far while fitting)."""
        if self.per_rank is not None:
            return format_report(self.per_rank, self._config, replay=self.replay)
        if self._loader is None:
            return "Data loading report: no LanceDataLoader measured yet (the train loader is attached at train start)"
        return format_report([self._fit_figures()], self._config)

    # -- internals ----------------------------------------------------------------------------
    def _fit_figures(self) -> dict[str, float]:
        span = self._loader.metrics_snapshot().minus(self._fit_start)
        return figures(span.plus(self._retired))

    def _replay(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        probe: ReplayProbe,
        per_rank: list[dict[str, float]],
        rank: int,
    ) -> None:
        """Every rank replays (DDP's backward is a collective); the floor of ``rank`` (of ``per_rank``,
        the fit's figures) is reported."""
        floor = _gather(trainer, pl_module, {"step_s": probe.replay(trainer, pl_module)})[rank]["step_s"]
        replay = self.replay = floor_figures(per_rank[rank], self._config, floor, probe)
        probe.reset()  # the cached batches leave the device
        if trainer.is_global_zero:
            metrics = {f"{self.prefix}replay/{name}": value for name, value in replay.items()}
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=max(_log_step(trainer) - 1, 0))

    def _attach(self, trainer: pl.Trainer) -> None:
        loader = _find_lance_loader(trainer.train_dataloader)
        if loader is not None and loader is self._loader:
            return
        if self._loader is not None:  # the trainer reloaded the train loader: keep what was measured
            span = self._loader.metrics_snapshot().minus(self._fit_start)
            self._retired = span.plus(self._retired)
        if loader is None or loader.meter is None:
            self._loader = None
            if not self._warned:
                self._warned = True
                what = (
                    "has metrics=False"
                    if loader is not None
                    else f"is {type(trainer.train_dataloader).__name__}, not a LanceDataLoader"
                )
                rank_zero_warn(
                    f"DataLoadingMonitor: the train loader {what}; nothing to measure. Use "
                    "LanceDataModule's train_dataloader()."
                )
            return
        self._loader = loader
        self._config = loader.describe()
        self._fit_start = self._epoch_start = self._window_start = loader.metrics_snapshot()

    def _log(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        span: dict[str, float],
        names: Sequence[str],
        prefix: str,
        step: int,
    ) -> None:
        per_rank = _gather(trainer, pl_module, span)  # a collective under DDP: every rank calls it
        if trainer.is_global_zero:
            metrics = {**reduce_ranks(per_rank, names, prefix), **mixture_figures(self._loader, self.prefix)}
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


def reduce_ranks(per_rank: Sequence[Mapping[str, float]], names: Sequence[str], prefix: str) -> dict[str, float]:
    """``prefix + name``: the mean over ranks; with several ranks also ``_min`` and ``_max``."""
    out: dict[str, float] = {}
    for name in names:
        values = [figs[name] for figs in per_rank]
        out[f"{prefix}{name}"] = sum(values) / len(values)
        if len(values) > 1:
            out[f"{prefix}{name}_min"] = min(values)
            out[f"{prefix}{name}_max"] = max(values)
    return out


def mixture_figures(loader: Any, prefix: str) -> dict[str, float]:
    """For a mixture, each source's samples in the epoch so far (all ranks), its share of them and
    the share its weights or schedule set for the same samples (``scheduled_share``)."""
    state = loader.cursor.state()
    mixture = loader.cursor.plan
    if not state or not isinstance(mixture, MixturePlan):
        return {}
    counts = mixture.source_counts(state["epoch"], state["rows_consumed"])
    scheduled = mixture.scheduled_shares(state["epoch"], state["rows_consumed"])
    total = max(1, sum(counts.values()))
    out = {}
    for name, count in counts.items():
        out[f"{prefix}mixture/{name}/rows"] = float(count)
        out[f"{prefix}mixture/{name}/share"] = count / total
        if name in scheduled:
            out[f"{prefix}mixture/{name}/scheduled_share"] = float(scheduled[name])
    return out


def _gather(trainer: pl.Trainer, pl_module: pl.LightningModule, figs: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's figures, in rank order (all ranks must call this at the same point)."""
    if trainer.world_size <= 1:
        return [figs]
    names = list(figs)
    device = pl_module.device if pl_module.device.type != "mps" else torch.device("cpu")
    vector = torch.tensor([figs[name] for name in names], dtype=torch.float64, device=device)
    gathered = trainer.strategy.all_gather(vector).reshape(trainer.world_size, len(names)).cpu().tolist()
    return [dict(zip(names, row)) for row in gathered]


def _log_step(trainer: pl.Trainer) -> int:
    """The step Lightning's ``self.log`` writes for the current batch (its logger connector's)."""
    loop = getattr(trainer.fit_loop, "epoch_loop", None)
    step = getattr(loop, "_batches_that_stepped", None)
    return int(step) if step is not None else int(trainer.global_step)


def _find_lance_loader(loaders: Any) -> Any:
    from lance_lightning.load.loader import LanceDataLoader

    stack = [loaders]
    while stack:
        item = stack.pop()
        if isinstance(item, LanceDataLoader):
            return item
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None
