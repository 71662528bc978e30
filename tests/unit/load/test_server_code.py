"""What a payload refers to by name, and whether the workers' server holds it as this process has
it (`lance_lightning.load.server_code`); a transform workers cannot receive is refused before a fit
trains. The notebook path itself: tests/scenarios/test_notebook.py."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest

from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.errors import ConfigError
from lance_lightning.load.server_code import references, stale, user_modules
from tests.helpers import RecordingModel, write_dataset
from tests.worker_probe import RecordProcess


class Outer:
    class Inner:
        pass


def _scaled(batch: dict, factor: int) -> dict:
    return batch


def test_references_names_the_classes_and_functions_pickling_saves_by_name() -> None:
    found = references({"a": Outer.Inner(), "b": functools.partial(_scaled, factor=2), "c": [json.dumps]})
    assert {(__name__, "Outer.Inner"), (__name__, "_scaled"), ("json", "dumps")} <= found


def test_user_modules_hold_the_main_module_and_code_outside_the_installation() -> None:
    held = user_modules()
    assert "__main__" in held and __name__ in held and "lance_lightning.load.server_code" in held
    assert "json" not in held and "torch" not in held and "lightning.pytorch" not in held


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[types.ModuleType]:
    """A module of the user's, loaded from a file outside the Python installation."""
    module = types.ModuleType("user_transforms")
    module.__file__ = str(tmp_path / "user_transforms.py")
    Path(module.__file__).write_text("")
    exec("class Tag:\n    pass\n", module.__dict__)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_definition_changed_after_the_snapshot_is_stale(user_module: types.ModuleType) -> None:
    held = user_modules()
    refs = references(user_module.Tag())
    assert refs == {("user_transforms", "Tag")} and stale(refs, held) == []
    exec("class Tag:\n    pass\n", user_module.__dict__)  # the cell run again, or the module reloaded
    assert stale(references(user_module.Tag()), held) == ["user_transforms.Tag"]
    assert stale(refs, {}) == [], "a module the server does not hold is imported afresh by the workers"


def test_a_transform_workers_cannot_receive_is_refused_before_the_fit_trains(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 40, fragment_rows=20)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"]), batch_size=10, num_workers=2, transform=lambda batch: batch
    )
    model = RecordingModel()
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False
    )
    with pytest.raises(ConfigError, match=r"`transform`=<function .*<lambda>.*cannot be \(.*not a lambda") as caught:
        trainer.fit(model, datamodule=dm)
    assert caught.value.param == "transform" and model.seen == []


def test_a_module_level_transform_reaches_the_workers(tmp_path: Path) -> None:
    """The check passes what workers can run: every row read, in order."""
    uri = write_dataset(tmp_path / "ds.lance", 40, fragment_rows=20)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id"]), batch_size=10, num_workers=2, transform=RecordProcess()
    )
    dm.setup("fit")
    ids = [i for batch in dm.train_dataloader() for i in batch["id"].tolist()]
    assert ids == list(range(40))


_INTERACTIVE_SPAWN = """
import sys
import lance_lightning as ll

class Tag:
    def __call__(self, batch):
        return batch

dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=2,
                        transform=Tag(), multiprocessing_context="spawn")
dm.setup("fit")
dm.train_dataloader()
print("made")
"""


def test_with_spawn_a_transform_defined_in_an_interactive_session_is_refused_when_the_loader_is_made(
    tmp_path: Path,
) -> None:
    """``python -c``: no file a spawned worker could import the class from."""
    uri = write_dataset(tmp_path / "ds.lance", 20, fragment_rows=20)
    proc = subprocess.run(
        [sys.executable, "-c", _INTERACTIVE_SPAWN, uri], capture_output=True, text=True, timeout=300, check=False
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "made" not in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert last.startswith("lance_lightning.errors.ConfigError: `transform`=<__main__.Tag object"), last
    assert "__main__.Tag is defined in an interactive session" in last and "move it into a .py module" in last, last


_STDIN_SCRIPT = """
import json, os, sys, torch
import lightning.pytorch as pl
import lance_lightning as ll

class Tag:
    def __call__(self, batch):
        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch

class Record(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.ids, self.pids = [], set()

    def training_step(self, batch, batch_idx):
        self.ids += batch["id"].tolist()
        self.pids |= set(batch.get("pid", batch["id"]).tolist())
        return (self.weight - 1).pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=2,
                        transform=Tag() if sys.argv[3] == "main" else None, multiprocessing_context=sys.argv[2])
model = Record()
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(model, datamodule=dm)
print(json.dumps({"ids": model.ids, "pids": sorted(model.pids), "main": os.getpid()}))
"""


def _run_stdin(uri: str, context: str, transform: str, **env: str) -> subprocess.CompletedProcess:
    """`_STDIN_SCRIPT` read by ``python -`` (its main module's ``__file__`` is ``<stdin>``), with
    its own transform (``main``) or none."""
    environ = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-", uri, context, transform],
        input=_STDIN_SCRIPT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=environ,
    )


def test_a_script_read_from_stdin_trains_through_the_forked_server_s_workers(tmp_path: Path) -> None:
    """``python -``, 2 epochs of ``Trainer.fit``: the lean launch sends no main module to run again,
    and the forked server's workers hold the script's class (``LANCE_LIGHTNING_WORKER_HANDOFF=off``:
    the workers read every batch)."""
    uri = write_dataset(tmp_path / "ds.lance", 40, fragment_rows=20)
    proc = _run_stdin(uri, "forkserver", "main", LANCE_LIGHTNING_WORKER_HANDOFF="off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["ids"] == list(range(40)) * 2 and seen["main"] not in seen["pids"], seen


@pytest.mark.parametrize(
    ("context", "env", "param"),
    [
        ("forkserver", {"LANCE_LIGHTNING_LEAN_WORKERS": "off"}, "LANCE_LIGHTNING_LEAN_WORKERS"),
        ("spawn", {}, "multiprocessing_context"),
    ],
    ids=["lean-off", "spawn"],
)
def test_a_launch_that_runs_a_script_read_from_stdin_again_is_refused_when_the_loader_is_made(
    tmp_path: Path, context: str, env: dict[str, str], param: str
) -> None:
    """``multiprocessing``'s own launch tells every worker to run ``<stdin>`` again, where no file
    is, whatever the transform (none here): ``Trainer.fit`` stops with a `ConfigError` naming what
    chose that launch, before a step, not with every worker dying as it starts."""
    uri = write_dataset(tmp_path / "ds.lance", 20, fragment_rows=20)
    proc = _run_stdin(uri, context, "none", **env)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and not proc.stdout.strip(), proc.stdout + proc.stderr[-3000:]
    assert last.startswith(f"lance_lightning.errors.ConfigError: `{param}`="), last
    assert "read from '<stdin>'" in last and "run the script from a .py file" in last, last
