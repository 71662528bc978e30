"""The words of the printed ``resume with:`` command, and the parser error of a class from a missing extra.

The end-to-end cases (a real ``uv run`` launch, a YAML callback without the Ray extra) are in
``tests/scenarios/test_unclean_exits.py``; these pin the rules on the parts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lance_lightning import launch
from lance_lightning.cli import lightning as cli
from lance_lightning.cli.parse_errors import shorten

ARGS = ["fit", "--config", "c.yaml", "--data.batch_size=8"]


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A console-script launch of ``lance-lightning ARGS`` from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / ".venv" / "bin" / "lance-lightning"), *ARGS])
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    return tmp_path


def test_a_uv_run_launch_is_repeated_with_its_options(launched: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uv = ["/opt/bin/uv", "run", "--project", "/src/proj", "lance-lightning"]
    monkeypatch.setattr(launch, "parent_command", lambda: [*uv, *ARGS])
    command = cli.resume_command(None, str(launched / "runs" / "version_0" / "last.ckpt"))
    assert command == f"{' '.join(uv)} {' '.join(ARGS)} --ckpt_path runs/version_0/last.ckpt"


def test_uv_run_python_dash_m_is_repeated_too(launched: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/lance_lightning/cli/__main__.py", *ARGS])
    monkeypatch.setattr(launch, "parent_command", lambda: ["uv", "run", "python", "-m", "lance_lightning.cli", *ARGS])
    command = cli.resume_command(None, "last.ckpt")
    assert command.startswith("uv run python -m lance_lightning.cli fit --config c.yaml ")


def test_without_uv_the_program_and_a_checkpoint_outside_the_directory(
    launched: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "parent_command", lambda: ["-bash"])
    outside = launched.parent / "elsewhere" / "last.ckpt"
    command = cli.resume_command(None, str(outside))
    # the script is not on PATH here: its path, relative to the directory the fit ran in
    assert command == f".venv/bin/lance-lightning {' '.join(ARGS)} --ckpt_path {outside}"
    monkeypatch.setattr(launch.shutil, "which", lambda name: str(launched / ".venv" / "bin" / name))
    (launched / ".venv" / "bin").mkdir(parents=True)
    (launched / ".venv" / "bin" / "lance-lightning").write_text("")
    assert cli.resume_command(None, "last.ckpt").startswith("lance-lightning fit --config c.yaml ")


def test_a_parent_with_other_arguments_is_not_taken_for_the_launch(
    launched: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "parent_command", lambda: ["uv", "run", "pytest", "-x"])
    assert cli.resume_command(None, "last.ckpt").startswith(".venv/bin/lance-lightning fit ")


#: jsonargparse's error for a callback list whose class cannot be imported (Ray missing), as printed.
RAY_MISSING = """\
Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Subtypes: [list[lightning.pytorch.callbacks.callback.Callback], <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'lance_lightning.integrations.ray.RayCheckpointReport':
        lance_lightning.integrations.ray needs Ray: install `lance-lightning[ray]` (No module named 'ray')
    - Not a valid subclass of Callback
      Subclass types expect one of:
      - a class path (str)
      - a dict with class_path entry
    - Expected a <class 'NoneType'>
  Given value type: <class 'list'>
  Given value: [{'class_path': 'lance_lightning.integrations.ray.RayCheckpointReport'}]"""


def test_a_class_that_cannot_be_imported_is_the_error_shown() -> None:
    assert shorten(RAY_MISSING) == (
        'Parser key "trainer.callbacks":\n'
        "  as lance_lightning.integrations.ray.RayCheckpointReport: lance_lightning.integrations.ray needs Ray: "
        "install `lance-lightning[ray]` (No module named 'ray')"
    )


def test_a_hint_runs_behind_the_nearest_uv_run_with_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    script = ["python", "train.py", "--lr", "0.1"]
    uv = ["uv", "run", "--extra", "ray", "--locked", "--python=3.11", *script]
    monkeypatch.setattr(launch, "_ancestors", lambda: iter([["python", "-c", "rank 1"], script, uv]))
    assert launch.tool_command(["holds", "d.lance", "--release"]) == (
        "uv run --extra ray --locked --python=3.11 lance-lightning holds d.lance --release"
    )


def test_a_hint_without_uv_names_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_ancestors", lambda: iter([["-bash"]]))
    monkeypatch.delenv("UV", raising=False)
    monkeypatch.setattr(launch, "program", lambda: ["lance-lightning"])
    assert launch.tool_command(["holds", "d.lance"]) == "lance-lightning holds d.lance"
