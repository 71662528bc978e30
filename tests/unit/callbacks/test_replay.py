"""The replay probe of `DataLoadingMonitor` (``replay_batches``): the compute floor of real fits.

Real Lance datasets, a real Trainer and a real CSV logger read back; no timing is asserted (the
machine is shared), only what was replayed, what was left unchanged and how the figures relate.
The DDP test runs this file as a 2-rank ``strategy='ddp'`` script (see `_ddp_main`).
"""

from __future__ import annotations

import copy
import csv
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
if str(REPO_ROOT) not in sys.path:  # run as a script by the DDP test
    sys.path.insert(0, str(REPO_ROOT))

import lightning.pytorch as pl  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from lance_lightning import DataLoadingMonitor, LanceDataModule, LanceSource, NoShuffle  # noqa: E402
from lance_lightning.callbacks.replay import ReplayProbe, floor_figures  # noqa: E402
from lance_lightning.errors import ConfigError  # noqa: E402
from lance_lightning.metrics.figures import REPLAY_FIGURES, REPLAY_PARTS, figures  # noqa: E402
from lance_lightning.metrics.meter import Snapshot  # noqa: E402
from lance_lightning.metrics.report import format_report  # noqa: E402
from tests.helpers import RecordingModel, run_ddp_script, write_dataset  # noqa: E402

BATCH = 16
STEPS = 6


class AdamModel(RecordingModel):
    """Adam (optimizer state), dropout (RNG), a logged loss and a step LR scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.5)

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        x = batch["x"].float().reshape(-1, 1)
        return (self.layer(self.dropout(x)) - x).pow(2).mean()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, on_step=True, batch_size=len(batch["x"]))
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)]


class ManualModel(AdamModel):
    """The same model with manual optimization (the step calls backward and the optimizer itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()
        self.lr_schedulers().step()


class Snapshots(pl.Callback):
    """The train loader's consumer-side totals at train end (before or after the monitor's replay)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.totals = trainer.train_dataloader.metrics_snapshot().totals


def _fit(uri: str, model: pl.LightningModule, monitor: DataLoadingMonitor, root: Path, accelerator: str = "cpu"):
    from lightning.pytorch.loggers import CSVLogger

    pl.seed_everything(0)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=BATCH, shuffle=NoShuffle())
    before, after = Snapshots(), Snapshots()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=STEPS,
        logger=CSVLogger(str(root), name="csv"),
        log_every_n_steps=2,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[before, monitor, after],
    )
    trainer.fit(model, datamodule=dm)
    return trainer, before.totals, after.totals


def _state(trainer: pl.Trainer, model: pl.LightningModule) -> dict[str, Any]:
    return {
        "weights": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.cpu().clone() for p in model.parameters()],
        "optimizer": trainer.optimizers[0].state_dict(),
        "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        "global_step": trainer.global_step,
    }


def _assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:
        assert torch.equal(a["weights"][name], b["weights"][name]), name
    for x, y in zip(a["grads"], b["grads"]):
        assert (x is None and y is None) or torch.equal(x, y)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for key, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value.cpu(), b["optimizer"]["state"][key][name].cpu()), (key, name)
    assert a["scheduler"] == b["scheduler"]
    assert torch.equal(a["rng"], b["rng"]) and a["global_step"] == b["global_step"]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("replay") / "ds.lance", 300)


@pytest.mark.parametrize("param", ["replay_batches", "replay_steps"])
@pytest.mark.parametrize("value", [0, -2, True, "4", 2.5])
def test_bad_replay_options_are_config_errors_naming_them(param: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        DataLoadingMonitor(**{"replay_batches": 2, param: value})
    error = raised.value
    assert error.param == f"DataLoadingMonitor.{param}" and error.value == value
    assert "must be an integer >= 1" in str(error) and "Fix: pass the number of" in str(error)


@pytest.mark.parametrize("model_class", [AdamModel, ManualModel])
def test_replay_trains_on_exactly_the_cached_batches_and_leaves_the_model_unchanged(uri, tmp_path, model_class):
    pl.seed_everything(0)  # the same initial weights
    plain = model_class()
    plain_trainer, _, _ = _fit(uri, plain, DataLoadingMonitor(report=False), tmp_path / "plain")
    pl.seed_everything(0)
    model = model_class()
    monitor = DataLoadingMonitor(report=False, replay_batches=3, replay_steps=7)
    trainer, before, after = _fit(uri, model, monitor, tmp_path / "replayed")

    # Training saw the same batches; the replay then ran 7 steps on the first 3, in turn, and nothing else.
    assert model.seen[:STEPS] == plain.seen
    assert model.seen[STEPS:] == [plain.seen[i % 3] for i in range(7)]
    # The loader handed over no batch during the replay.
    for key in ("batches", "delivered_rows"):
        assert before[key] == after[key] == plain_trainer.train_dataloader.metrics_snapshot().totals[key], key
    assert before["batches"] == STEPS
    # Weights, gradients, optimizer and scheduler states, RNG and step are those of the fit without replay.
    _assert_same_state(_state(trainer, model), _state(plain_trainer, plain))
    assert monitor._probe.cached == []  # the cached batches were released
    assert monitor.replay["steps"] == 7 and monitor.replay["batches"] == 3


def test_replay_figures_are_logged_once_and_add_up(uri, tmp_path):
    monitor = DataLoadingMonitor(report=False, replay_batches=2, replay_steps=4)
    _fit(uri, AdamModel(), monitor, tmp_path)
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]
    logged = [row for row in rows if "data/replay/step_s" in row]
    assert len(logged) == 1
    row = logged[0]
    assert {f"data/replay/{name}" for name in REPLAY_FIGURES} <= row.keys()
    assert row["step"] == STEPS - 1  # the last training step
    assert {k[len("data/replay/") :]: v for k, v in row.items() if k.startswith("data/replay/")} == pytest.approx(
        monitor.replay
    )
    floor = monitor.replay
    assert floor["step_s"] > 0 and floor["real_step_s"] > 0
    assert floor["speedup"] * floor["step_s"] == pytest.approx(floor["real_step_s"], rel=1e-9)
    assert floor["compute_share"] * floor["real_step_s"] == pytest.approx(floor["step_s"], rel=1e-9)
    assert sum(floor[f"wait_share/{part}"] for part in REPLAY_PARTS) == pytest.approx(floor["wait_share"])
    assert floor["wait_share"] == pytest.approx(monitor.per_rank[0]["wait_fraction"])
    fig = monitor.per_rank[0]
    assert floor["real_step_s"] == pytest.approx((fig["wait_s"] + fig["step_s"]) / fig["batches"])
    text = monitor.report()
    assert "compute floor (replay)" in text and "4 steps on 2 cached batch(es)" in text
    assert "wait for data by part    storage " in text and speedup_text(floor) in text


def speedup_text(floor: dict[str, float]) -> str:
    """The report's speed-up line for ``floor`` (which form depends on the measured times)."""
    if floor["speedup"] > 1:
        return f"speed-up from the data   at most {floor['speedup']:.2f}x with data for free (cycle / floor); "
    return (
        "speed-up from the data   none measurable: the replayed step was not faster than the real one "
        f"({floor['speedup']:.2f}x)"
    )


def test_the_floor_is_scaled_to_the_fits_rows_per_batch():
    probe = ReplayProbe(2, 4)
    probe.cached, probe.rows = [{}, {}], [10, 30]  # e.g. token windows: batches of varying rows
    fig = {"batches": 10.0, "rows": 400.0, "wait_s": 0.5, "step_s": 9.5, "wait_fraction": 0.05}
    fig.update(io_wait_s=0.2, decode_s=0.6, convert_s=0.2, other_s=0.0)
    floor = floor_figures(fig, {"reader_threads": 2, "num_workers": 0}, 0.25, probe)
    assert floor["rows_per_step"] == 20 and floor["rows_per_batch"] == 40 and floor["replayed_step_s"] == 0.25
    assert floor["step_s"] == pytest.approx(0.5) and floor["real_step_s"] == pytest.approx(1.0)
    assert floor["speedup"] == pytest.approx(2.0) and floor["speedup_without_wait"] == pytest.approx(1 / 0.95)
    assert floor["compute_share"] == pytest.approx(0.5) and floor["rest_share"] == pytest.approx(0.45)
    # Loader time, wall-equivalent on 2 threads: storage 0.1, decode 0.3, convert 0.1, hand-off 0.5 s.
    assert floor["wait_share/decode"] == pytest.approx(0.05 * 0.3) and floor["wait_share/workers"] == pytest.approx(
        0.025
    )
    text = format_report([{**figures(Snapshot({})), **fig}], {"reader_threads": 2}, replay=floor)
    assert "500.00 ms per step (scaled from 250.00 ms on 20.0 rows to the fit's 40.0): 4 steps on 2" in text


def test_more_replay_batches_than_steps_replays_those_cached(uri, tmp_path):
    model = RecordingModel()
    monitor = DataLoadingMonitor(report=False, replay_batches=50, replay_steps=3)
    _fit(uri, model, monitor, tmp_path)
    assert model.seen[STEPS:] == model.seen[:3]
    assert monitor.replay["batches"] == STEPS and "3 steps on 6 cached batch(es)" in monitor.report()


def test_without_replay_nothing_is_cached_or_reported(uri, tmp_path):
    model = RecordingModel()
    monitor = DataLoadingMonitor(report=False)
    _fit(uri, model, monitor, tmp_path)
    assert len(model.seen) == STEPS and monitor.replay is None and monitor._probe is None
    assert "compute floor" not in monitor.report()


class StateAt(pl.Callback):
    """The model's training state at train end, and where the monitor's cached batches live then."""

    def __init__(self, monitor: DataLoadingMonitor) -> None:
        self.monitor = monitor
        self.state: dict[str, Any] = {}
        self.cached_on: set[str] = set()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a copy: the optimizer's state_dict holds its live tensors (Adam's "step" on the CPU), which
        # the replay's steps advance in place before the probe restores the saved state
        self.state = copy.deepcopy(_state(trainer, pl_module))
        self.cached_on = {batch["x"].device.type for batch in self.monitor._probe.cached}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_replay_on_cuda_caches_device_batches_and_restores_the_model(uri, tmp_path):
    pl.seed_everything(0)
    model = AdamModel()
    monitor = DataLoadingMonitor(report=False, replay_batches=2, replay_steps=5)
    before, after = StateAt(monitor), StateAt(monitor)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=BATCH, shuffle=NoShuffle())
    trainer = pl.Trainer(
        accelerator="cuda",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[before, monitor, after],
    )
    trainer.fit(model, datamodule=dm)
    assert before.cached_on == {"cuda"} and after.cached_on == set()  # cached on the device, then released
    assert model.seen[STEPS:] == [model.seen[i % 2] for i in range(5)]
    _assert_same_state(before.state, after.state)
    assert monitor.replay["step_s"] > 0 and "compute floor (replay)" in monitor.report()


@pytest.mark.slow
def test_ddp_ranks_replay_together_and_keep_identical_models(tmp_path):
    uri = write_dataset(tmp_path / "ds.lance", 256)
    output = run_ddp_script(__file__, [uri, str(tmp_path)], timeout=300)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for result in ranks:
        assert result["steps"] == STEPS + 4 and result["replayed"] == result["first"] + result["first"]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # restored to the same synchronized weights
    assert ranks[0]["floor"] == ranks[1]["floor"]  # the diagnosed rank's floor, on every rank
    assert output.count("compute floor (replay)   ") == 1  # printed by rank zero only


def _ddp_main(uri: str, out_dir: str) -> None:
    pl.seed_everything(0)
    model = AdamModel()
    monitor = DataLoadingMonitor(replay_batches=2, replay_steps=4)
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=8, shuffle=NoShuffle())
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
    )
    trainer.fit(model, datamodule=dm)
    result = {
        "steps": len(model.seen),
        "first": model.seen[:2],
        "replayed": model.seen[STEPS:],
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
        "floor": monitor.replay,
    }
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    _ddp_main(*sys.argv[1:3])
