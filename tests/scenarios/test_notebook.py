"""A notebook run by a real Jupyter kernel (nbclient, ipykernel): a transform defined in a cell reaches
the workers, and a cell that redefines it is refused before training, never trained with the old one.

What a notebook user does: define a transform class in a cell, fit with ``num_workers=2``, change
the class and run the cells again. Before `lance_lightning.load.server_code`, the workers of the
forked server ran the first definition in the second fit, silently; with the stock server every
worker died as it started (no file to import the class from), with advice about the main guard.
The oracle is the dataset's own ids and the tags the cell's transform writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from lance_lightning.load.forked_server import ENV_SWITCH
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.race import CHOICE_SWITCH
from tests.helpers import write_dataset

ROWS, BATCH = 200, 25
#: The kernel spec the tests write: this interpreter's ipykernel.
KERNEL = "lance-lightning-test"

_SETUP = """
import json, os
import lightning.pytorch as pl
import torch
from lance_lightning import LanceDataModule, LanceSource
from lance_lightning.errors import ConfigError
from tests.helpers import RecordingModel

class Seen(RecordingModel):
    def training_step(self, batch, batch_idx):
        self.tags = getattr(self, "tags", set()) | set(batch["tag"].tolist())
        self.pids = getattr(self, "pids", set()) | set(batch["pid"].tolist())
        return super().training_step(batch, batch_idx)

def fit():
    dm = LanceDataModule(train=LanceSource(URI, columns=["id", "x"]), batch_size=BATCH, num_workers=2, transform=Tag())
    model = Seen()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    try:
        trainer.fit(model, datamodule=dm)
    except ConfigError as error:
        return {"error": str(error)}
    return {"ids": [i for step in model.seen for i in step], "tags": sorted(model.tags),
            "workers": sorted(model.pids - {os.getpid()}), "kernel_read": os.getpid() in model.pids}
"""

_TAG = """
class Tag:
    def __call__(self, batch):
        batch["tag"] = torch.full((len(batch["id"]),), {tag})
        batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
        return batch
"""


def _run_notebook(tmp_path: Path, uri: str) -> list[dict]:
    """Cells: set-up, ``Tag`` (tag 1), fit, ``Tag`` again (tag 2), fit; each fit's outcome."""
    cells = [
        f"URI, BATCH = {uri!r}, {BATCH}\n" + _SETUP,
        _TAG.format(tag=1),
        "print(json.dumps(fit()))",
        _TAG.format(tag=2),
        "print(json.dumps(fit()))",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    NotebookClient(notebook, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(tmp_path)}}).execute()
    outcomes = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("name") == "stdout" and output["text"].lstrip().startswith("{"):
                outcomes.append(json.loads(output["text"].strip().splitlines()[-1]))
    return outcomes


@pytest.fixture
def notebook_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The kernel inherits this process's environment: every batch read by the workers, and a
    kernel spec of this interpreter first on Jupyter's path (a machine's own ``python3`` spec may
    name another Python)."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv(CHOICE_SWITCH, "workers")
    monkeypatch.setenv(HANDOFF, "off")
    return monkeypatch


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
def test_a_transform_defined_in_a_cell_trains_in_workers_and_a_redefinition_is_refused(
    tmp_path: Path, notebook_env: pytest.MonkeyPatch
) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    first, second = _run_notebook(tmp_path, uri)
    assert first.get("ids") == list(range(ROWS)) * 2, first
    assert first["tags"] == [1] and len(first["workers"]) == 2 and not first["kernel_read"], first
    error = second.get("error", "")
    assert "`transform`=<__main__.Tag object" in error and "__main__.Tag was defined, redefined or reloaded" in error, (
        second
    )
    assert "restart the Python process or kernel" in error, error


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_with_the_stock_server_a_transform_defined_in_a_cell_is_refused_before_training(
    tmp_path: Path, notebook_env: pytest.MonkeyPatch
) -> None:
    notebook_env.setenv(ENV_SWITCH, "off")
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    first, second = _run_notebook(tmp_path, uri)
    for outcome in (first, second):
        error = outcome.get("error", "")
        assert "__main__.Tag is defined in an interactive session" in error, outcome
        assert "move it into a .py module" in error, error
