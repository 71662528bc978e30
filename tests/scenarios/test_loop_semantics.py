"""Where Lightning's loop meets the loader's length and position: every resume trains what the
uninterrupted run trains, whatever checkpoint it resumes from (issue #37, items 1-3).

Each test runs real ``Trainer.fit`` calls on a real Lance dataset: an uninterrupted run (fitted
once per set of trainer options for the module's tests: `whole_run`, `whole_loop_run`), then a
stopped run resumed with ``ckpt_path``, and compares the ids of every training step, in order. A
stopped run that several tests resume (the same options stop the same fit at the same step) is
fitted once for the module too (`stopped_run`, `epoch_end_checkpoint`, `fresh_resume`); every
test still fits its own resume.
- A fractional (or count) ``limit_train_batches`` resumed from the last batch of a limited epoch,
  from a periodic, an epoch-end or a ``trainer.save_checkpoint`` checkpoint, with and without
  ``max_steps`` in the resumed run (Lightning carries the batch count into the next epoch then).
- A stop by ``max_steps`` resumed from ``last.ckpt``, from ``trainer.save_checkpoint`` or from the
  periodic checkpoint of the same step, under ``max_epochs`` 1 and 2 (Lightning counts the stopped
  epoch as finished; the rest of it is still trained) and under ``max_steps``.
- A second ``fit`` of one data module with a new trainer trains what a fresh data module resuming
  the same checkpoint trains, after ``validate``/``test``/``predict`` calls in between too.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from lance_lightning import DataCursorCheckpoint, LanceSource
from tests.harness import make_dm
from tests.helpers import RecordingModel, run_cli_process, run_ddp_script, write_dataset

ROWS, BATCH = 600, 10  # 60 batches per epoch
CLI_ROWS = 200  # the CLI test's dataset: 20 batches per epoch


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("loop") / "d.lance", ROWS, fragment_rows=150)


def _trainer(root: Path, *, every: int = 0, save_last: bool = False, **kwargs: Any) -> pl.Trainer:
    callbacks: list[Any] = [DataCursorCheckpoint(), *kwargs.pop("callbacks", [])]
    if every or save_last:
        callbacks.append(
            ModelCheckpoint(
                dirpath=root / "ckpt",
                filename="{step}",
                every_n_train_steps=every or None,
                save_top_k=-1 if every else 0,
                save_last=save_last,
            )
        )
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=str(root),
        enable_checkpointing=bool(every or save_last),
        callbacks=callbacks,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def _fit(root: Path, uri: str, *, ckpt: Path | None = None, dm: Any = None, **kwargs: Any) -> list[list[int]]:
    model = RecordingModel()
    trainer = _trainer(root, **kwargs)
    trainer.fit(model, datamodule=dm or make_dm(uri, "row:3", batch_size=BATCH), ckpt_path=ckpt)
    return model.seen


@pytest.fixture(scope="module")
def whole_run(uri: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[list[int]]]:
    """``whole_run(**trainer_options)``: the batches of an uninterrupted `_fit` with those options,
    the oracle of a resume. Fitted once per set of options for the module's tests (a fit is
    deterministic: the same dataset, shuffle seed and options train the same batches in the same
    order); each call gets its own copy."""
    root, runs = tmp_path_factory.mktemp("whole"), {}

    def run(**kwargs: Any) -> list[list[int]]:
        key = tuple(sorted(kwargs.items()))
        if key not in runs:
            runs[key] = _fit(root / f"run{len(runs)}", uri, **kwargs)
        return [list(batch) for batch in runs[key]]

    return run


def _stopped(root: Path, uri: str, kind: str, **kwargs: Any) -> tuple[list[list[int]], Path]:
    """A stopped first run and the checkpoint of kind ``kind`` it wrote at its last step."""
    model, dm = RecordingModel(), make_dm(uri, "row:3", batch_size=BATCH)
    every = kwargs.pop("every", 0)
    trainer = _trainer(root, every=every if kind == "periodic" else 0, save_last=kind == "last", **kwargs)
    trainer.fit(model, datamodule=dm)
    if kind == "saved":
        trainer.save_checkpoint(root / "after.ckpt")
        return model.seen, root / "after.ckpt"
    if kind == "last":
        return model.seen, root / "ckpt" / "last.ckpt"
    return model.seen, root / "ckpt" / f"step={trainer.global_step}.ckpt"


@pytest.fixture(scope="module")
def stopped_run(uri: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[list[list[int]], Path]]:
    """``stopped_run(kind, **trainer_options)``: `_stopped`'s first run and checkpoint, fitted once
    per kind and set of options for the module's tests (the same options stop the same fit at the
    same step: ``last.ckpt`` and ``trainer.save_checkpoint`` of a ``max_steps=25`` stop serve the
    ``max_epochs`` and ``max_steps`` resumes and the resume that trains nothing). A stop by a
    callback (``callbacks``) is fitted on every call. The checkpoint is only read by the resumes;
    each call gets its own copy of the batches."""
    root, runs = tmp_path_factory.mktemp("stopped"), {}

    def run(kind: str, **kwargs: Any) -> tuple[list[list[int]], Path]:
        if kwargs.get("callbacks"):
            return _stopped(tmp_path_factory.mktemp("stopped_by_callback"), uri, kind, **kwargs)
        if kind != "periodic":
            kwargs.pop("every", None)  # `_stopped` writes periodic checkpoints for ``periodic`` only
        key = (kind, tuple(sorted(kwargs.items())))
        if key not in runs:
            runs[key] = _stopped(root / f"run{len(runs)}", uri, kind, **kwargs)
        seen, ckpt = runs[key]
        return [list(batch) for batch in seen], ckpt

    return run


@pytest.mark.parametrize("limit", [0.5, 30, 0.75], ids=["fraction", "count", "fraction_uneven"])
@pytest.mark.parametrize("kind", ["periodic", "last", "saved"])
@pytest.mark.parametrize("resume_max_steps", [-1, 1000], ids=["epochs", "with_max_steps"])
def test_a_limited_epoch_resumed_at_its_last_batch_trains_every_later_epoch_whole(
    tmp_path: Path,
    uri: str,
    whole_run: Callable[..., list[list[int]]],
    stopped_run: Callable[..., tuple[list[list[int]], Path]],
    limit: float,
    kind: str,
    resume_max_steps: int,
) -> None:
    """Issue #37.1: ``limit_train_batches=0.5`` resumed from the checkpoint of the limited epoch's last
    step trained 30 of the next epoch's 60 batches (the loader's length counted the carried index)."""
    whole = whole_run(max_epochs=3, limit_train_batches=limit)
    per_epoch = len(whole) // 3
    first, ckpt = stopped_run(kind, max_epochs=1, limit_train_batches=limit, every=per_epoch)
    assert len(first) == per_epoch
    rest = _fit(tmp_path / "b", uri, ckpt=ckpt, max_epochs=3, max_steps=resume_max_steps, limit_train_batches=limit)
    assert first + rest == whole


class StopAtStep(pl.Callback):
    """Sets ``trainer.should_stop`` after a step, as Lightning's ``Timer`` does when ``max_time``
    runs out (a stop at a known step, whatever the machine's speed)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("kind", ["last", "saved", "periodic"])
@pytest.mark.parametrize("max_epochs", [1, 2])
@pytest.mark.parametrize("stop", ["max_steps", "max_time"])
def test_a_max_steps_stop_resumed_under_max_epochs_trains_the_rest_of_the_stopped_epoch(
    tmp_path: Path,
    uri: str,
    whole_run: Callable[..., list[list[int]]],
    stopped_run: Callable[..., tuple[list[list[int]], Path]],
    kind: str,
    max_epochs: int,
    stop: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #37.3: Lightning counts an epoch stopped by ``max_steps`` (or ``max_time``: the
    ``Timer`` sets ``should_stop``) as finished; resumed from ``last.ckpt`` under ``max_epochs: 2``
    the package read one data epoch and a fraction, under ``max_epochs: 1`` nothing while promising
    35 more steps."""
    whole = whole_run(max_epochs=max_epochs)
    limit: dict[str, Any] = dict(max_steps=25) if stop == "max_steps" else dict(callbacks=[StopAtStep(25)])
    first, ckpt = stopped_run(kind, max_epochs=5, every=25, **limit)
    assert len(first) == 25
    caplog.clear()
    with caplog.at_level("INFO"):
        rest = _fit(tmp_path / "b", uri, ckpt=ckpt, max_epochs=max_epochs)
    assert first + rest == whole
    assert "35 more step(s)" in caplog.text


@pytest.mark.parametrize("kind", ["last", "saved"])
def test_a_max_steps_stop_resumed_under_max_steps_follows_on(
    tmp_path: Path,
    uri: str,
    whole_run: Callable[..., list[list[int]]],
    stopped_run: Callable[..., tuple[list[list[int]], Path]],
    kind: str,
) -> None:
    whole = whole_run(max_steps=100, max_epochs=-1)
    first, ckpt = stopped_run(kind, max_steps=25, max_epochs=5)
    rest = _fit(tmp_path / "b", uri, ckpt=ckpt, max_steps=100, max_epochs=-1)
    assert first + rest == whole


def test_a_resume_that_trains_nothing_says_so_and_promises_no_step(
    tmp_path: Path, uri: str, stopped_run: Callable[..., tuple[list[list[int]], Path]], caplog: pytest.LogCaptureFixture
) -> None:
    first, ckpt = stopped_run("last", max_steps=25, max_epochs=5)
    caplog.clear()
    with caplog.at_level("INFO"):
        rest = _fit(tmp_path / "b", uri, ckpt=ckpt, max_steps=25, max_epochs=5)
    text = caplog.text
    assert rest == []
    assert "nothing more is trained: max_steps=25 reached" in text
    assert "more step(s)" not in text


@pytest.fixture(scope="module")
def fresh_resume(uri: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], list[list[int]]]:
    """``fresh_resume(ckpt)``: the batches a fresh data module trains resuming ``ckpt``, the step=20
    checkpoint of a second-fit test's first fit, under ``max_epochs=2``. Fitted once for the module:
    every such first fit is the same fit (the same data module, options and seed; the eval calls
    come after it), so their step=20 checkpoints hold the same state. Each call gets its own copy."""
    root, runs = tmp_path_factory.mktemp("fresh"), []

    def run(ckpt: Path) -> list[list[int]]:
        if not runs:
            runs.append(_fit(root, uri, ckpt=ckpt, max_epochs=2))
        return [list(batch) for batch in runs[0]]

    return run


@pytest.mark.parametrize("between", [(), ("validate", "test", "predict")], ids=["fit_only", "eval_calls"])
def test_a_second_fit_of_one_data_module_trains_what_a_fresh_one_trains(
    tmp_path: Path,
    uri: str,
    whole_run: Callable[..., list[list[int]]],
    fresh_resume: Callable[[Path], list[list[int]]],
    between: tuple[str, ...],
) -> None:
    """Issue #37.2: the second fit reused the loader bound to the first trainer: 80 of 100 batches."""
    source = LanceSource(uri)
    dm = make_dm(uri, "row:3", batch_size=BATCH, val=source, test=source, predict=source)
    model = RecordingModel()
    trainer = _trainer(tmp_path / "a", every=10, max_steps=30, max_epochs=5)
    trainer.fit(model, datamodule=dm)
    for call in between:
        getattr(_trainer(tmp_path / call), call)(model, datamodule=dm)
    ckpt = tmp_path / "a" / "ckpt" / "step=20.ckpt"
    again = _fit(tmp_path / "b", uri, ckpt=ckpt, dm=dm, max_epochs=2)
    fresh = fresh_resume(ckpt)
    whole = whole_run(max_epochs=2)
    assert len(again) == 100
    assert again == fresh == whole[20:]


class IdLogModel(RecordingModel):
    """`RecordingModel` that also appends each step's ids, one JSON line per step, to
    ``<log>.<global rank>`` (a CLI run in a subprocess, DDP ranks included)."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log_path = log

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        with open(f"{self.log_path}.{self.global_rank}", "a") as out:
            out.write(json.dumps([self.current_epoch, self._ids(batch)]) + "\n")
        return super().training_step(batch, batch_idx)


def _cli_config(root: Path, uri: str, devices: int) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "strategy": "ddp" if devices > 1 else "auto",
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "callbacks": [
                {"class_path": "lance_lightning.DataCursorCheckpoint"},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
            ],
        },
        "model": {"class_path": "tests.scenarios.test_loop_semantics.IdLogModel"},
        "data": {"train": {"uri": uri}, "batch_size": BATCH, "shuffle": {"class_path": "lance_lightning.RowShuffle"}},
    }
    path = root / "config.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def _cli_fit(root: Path, config: Path, name: str, *args: str) -> tuple[list[Any], str]:
    log = root / f"{name}.ids"
    code, out = run_cli_process(
        ["fit", "--config", str(config), f"--model.log={log}", f"--trainer.default_root_dir={root / name}", *args],
        cwd=root,
    )
    assert code == 0, out
    steps = [json.loads(line) for path in sorted(root.glob(f"{name}.ids.*")) for line in path.read_text().splitlines()]
    return steps, out


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2], ids=["one_process", "ddp"])
def test_the_cli_resumes_a_max_steps_stop_from_last_ckpt_under_max_epochs(tmp_path: Path, devices: int) -> None:
    """Issue #37.3 through ``lance-lightning fit`` in a subprocess (2-rank gloo DDP too): stopped by
    ``max_steps``, resumed from ``last.ckpt`` under ``max_epochs: 1`` it trains the rest of epoch 0
    (was: nothing, while promising the steps), under ``max_epochs: 3`` also epochs 1 and 2 whole."""
    # 20 batches an epoch (10 per rank): each stop below is still mid-epoch 0, and each CLI fit
    # trains a third of the steps the module's 600 rows would take.
    uri = write_dataset(tmp_path / "cli.lance", CLI_ROWS, fragment_rows=50)
    config = _cli_config(tmp_path, uri, devices)
    whole, _ = _cli_fit(tmp_path, config, "whole", "--trainer.max_epochs=3")
    stop = 12 if devices == 1 else 7
    first, _ = _cli_fit(tmp_path, config, "first", f"--trainer.max_steps={stop}")
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    one, out = _cli_fit(tmp_path, config, "one", "--trainer.max_epochs=1", f"--ckpt_path={last}")
    assert "the rest of it is trained first" in out and "more step(s)" in out
    three, _ = _cli_fit(tmp_path, config, "three", "--trainer.max_epochs=3", f"--ckpt_path={last}")

    def ids(steps: list[Any]) -> list[tuple[int, int]]:
        return sorted((epoch, i) for epoch, batch in steps for i in batch)

    assert len(first) == stop * devices
    assert ids(first + one) == ids([s for s in whole if s[0] == 0])
    assert ids(first + three) == ids(whole)
    if devices == 1:
        assert first + three == whole  # the same order, step for step


class ValTimingModel(RecordingModel):
    """`RecordingModel` that records the global step at each validation run and what
    ``estimated_stepping_batches`` was when the optimizers were configured."""

    def __init__(self) -> None:
        super().__init__(read_estimated_stepping_batches=True)
        self.validated_at: list[int] = []

    def on_validation_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.validated_at.append(self.trainer.global_step)


def _loop_fit(root: Path, uri: str, loop: dict[str, Any], ckpt: Path | None = None, **kwargs: Any) -> ValTimingModel:
    """A `ValTimingModel` fit of 3 epochs (one validation batch) under the trainer options ``loop``;
    ``save_to``: also ``trainer.save_checkpoint`` there after it."""
    save_to = kwargs.pop("save_to", None)
    model = ValTimingModel()
    dm = make_dm(uri, "row:3", batch_size=BATCH, val=LanceSource(uri))
    trainer = _trainer(root, max_epochs=3, limit_val_batches=1, **loop, **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return model


@pytest.fixture(scope="module")
def whole_loop_run(uri: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ValTimingModel]:
    """``whole_loop_run(loop)``: the uninterrupted `_loop_fit` under ``loop``, fitted once per set of
    options for the module's tests (its batches, validation steps and stepping estimate are the same
    whichever stop the test resumes from); read only."""
    root, runs = tmp_path_factory.mktemp("whole_loop"), {}

    def run(loop: dict[str, Any]) -> ValTimingModel:
        key = tuple(sorted(loop.items()))
        if key not in runs:
            runs[key] = _loop_fit(root / f"run{len(runs)}", uri, loop)
        return runs[key]

    return run


@pytest.mark.parametrize(
    "loop",
    [
        dict(val_check_interval=0.25, limit_train_batches=0.5),
        dict(val_check_interval=7, accumulate_grad_batches=2),
        dict(check_val_every_n_epoch=2, reload_dataloaders_every_n_epochs=1, limit_train_batches=40),
    ],
    ids=["val_fraction_limit_fraction", "val_count_accumulate", "val_every_2_reload"],
)
@pytest.mark.parametrize("stop", ["periodic", "max_steps_last"])
def test_options_that_read_the_loaders_length_see_an_uninterrupted_runs_numbers(
    tmp_path: Path, uri: str, whole_loop_run: Callable[..., ValTimingModel], loop: dict[str, Any], stop: str
) -> None:
    """Every Lightning option that reads or rescales ``len(loader)`` after a resume: validation at
    the steps of the uninterrupted run, the same batches, the same stepping estimate."""
    whole = whole_loop_run(loop)
    if stop == "periodic":
        first = _loop_fit(tmp_path / "a", uri, loop, every=9, save_last=False, max_steps=9)
        ckpt = tmp_path / "a" / "ckpt" / "step=9.ckpt"
    else:
        first = _loop_fit(tmp_path / "a", uri, loop, max_steps=9, save_to=tmp_path / "a" / "after.ckpt")
        ckpt = tmp_path / "a" / "after.ckpt"
    rest = _loop_fit(tmp_path / "b", uri, loop, ckpt=ckpt)
    assert whole.validated_at and rest.seen
    assert first.seen + rest.seen == whole.seen
    assert first.validated_at + rest.validated_at == whole.validated_at
    assert rest.estimated_stepping_batches == whole.estimated_stepping_batches


# -- real DDP: both fixes through Trainer.fit on 2 gloo ranks ---------------------------------------
def _ddp_main(out: str, uri: str) -> None:
    """Run on each rank (Lightning starts rank 1 from this script): a fit stopped by ``max_steps``,
    a second fit of the SAME data module from its step=10 checkpoint under a fractional limit, the
    same resume with a fresh data module, and the uninterrupted run; each rank writes its ids."""
    runs: dict[str, list[list[int]]] = {}
    root = Path(out)
    ddp = dict(devices=2, strategy="ddp")

    def run(name: str, dm: Any, ckpt: Path | None = None, **kwargs: Any) -> None:
        model = RecordingModel()
        _trainer(root / name, **ddp, **kwargs).fit(model, datamodule=dm, ckpt_path=ckpt)
        runs[name] = model.seen

    dm = make_dm(uri, "row:3", batch_size=BATCH)
    run("first", dm, every=5, max_steps=12, max_epochs=5)
    ckpt = root / "first" / "ckpt" / "step=10.ckpt"
    run("again", dm, ckpt, max_epochs=3, limit_train_batches=0.5)
    run("fresh", make_dm(uri, "row:3", batch_size=BATCH), ckpt, max_epochs=3, limit_train_batches=0.5)
    run("whole", make_dm(uri, "row:3", batch_size=BATCH), max_epochs=3, limit_train_batches=0.5)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    (root / f"seen.{rank}.json").write_text(json.dumps(runs))


@pytest.mark.slow
def test_under_ddp_a_second_fit_and_a_fractional_limit_resume_as_an_uninterrupted_run(tmp_path: Path, uri: str) -> None:
    run_ddp_script(__file__, [str(tmp_path), uri], timeout=480)
    for rank in (0, 1):
        runs = json.loads((tmp_path / f"seen.{rank}.json").read_text())
        assert len(runs["whole"]) == 3 * (ROWS // BATCH // 2) // 2  # 15 of each rank's 30 batches, 3 epochs
        assert runs["again"] == runs["fresh"] == runs["whole"][10:], rank
        assert runs["first"][:10] == runs["whole"][:10], rank


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _ddp_main(*sys.argv[1:3])


@pytest.fixture(scope="module")
def epoch_end_checkpoint(
    uri: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[int], tuple[list[list[int]], Path]]:
    """``epoch_end_checkpoint(reload)``: a fit stopped by ``max_steps=75`` under ``max_epochs=4`` whose
    ``ModelCheckpoint`` wrote a checkpoint at each epoch's end: its batches and ``epoch=0.ckpt``.
    Fitted once per ``reload_dataloaders_every_n_epochs`` for the module's tests (both resumes of a
    value read the same checkpoint, which they do not write); each call gets its own copy."""
    root, runs = tmp_path_factory.mktemp("epoch_end"), {}

    def run(reload: int) -> tuple[list[list[int]], Path]:
        if reload not in runs:
            folder = root / f"reload{reload}"
            model = RecordingModel()
            saving = ModelCheckpoint(dirpath=folder / "ckpt", filename="{epoch}", save_top_k=-1)
            trainer = _trainer(
                folder,
                max_epochs=4,
                max_steps=75,
                enable_checkpointing=True,
                callbacks=[saving],
                reload_dataloaders_every_n_epochs=reload,
            )
            trainer.fit(model, datamodule=make_dm(uri, "row:3", batch_size=BATCH))
            runs[reload] = model.seen, folder / "ckpt" / "epoch=0.ckpt"
        seen, ckpt = runs[reload]
        return [list(batch) for batch in seen], ckpt

    return run


@pytest.mark.parametrize("resume_max_steps", [-1, 1000], ids=["epochs", "with_max_steps"])
@pytest.mark.parametrize("reload", [0, 2])
def test_an_epoch_end_checkpoint_resumes_every_later_epoch_whole(
    tmp_path: Path,
    uri: str,
    whole_run: Callable[..., list[list[int]]],
    epoch_end_checkpoint: Callable[[int], tuple[list[list[int]], Path]],
    resume_max_steps: int,
    reload: int,
) -> None:
    """``ModelCheckpoint``'s own epoch-end checkpoint (written in ``on_train_epoch_end``: the epoch
    processed, not yet completed), resumed with ``max_steps`` set: Lightning ran epoch 0 again and
    one data epoch was lost (found by the contract checker's soak, scenario 3726)."""
    loop = dict(reload_dataloaders_every_n_epochs=reload)
    whole = whole_run(max_epochs=4, **loop)
    seen, ckpt = epoch_end_checkpoint(reload)
    rest = _fit(tmp_path / "b", uri, ckpt=ckpt, max_epochs=4, max_steps=resume_max_steps, **loop)
    assert seen[:60] + rest == whole
