"""An interrupted prepare never looks complete, and its rerun continues to the uninterrupted result;
a rerun on a complete output writes nothing. (SIGKILL itself: tests/scenarios/test_prepare_cli.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lance
import pytest

from lance_lightning.errors import ConfigError
from lance_lightning.source import Prepare
from lance_lightning.write import prepare
from lance_lightning.write.ledger import DONE_KEY
from tests.helpers import stop_prepare_after
from tests.unit.write.inputs import image_folder


def test_interrupted_prepare_is_partial_then_resumes_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = image_folder(tmp_path / "in", per_class=4, bad=("dog/zz.png",))
    spec = Prepare("imagefolder", str(root), unit_files=2, workers=3)
    prepare(spec, str(tmp_path / "whole.lance"), progress=False)
    out = tmp_path / "out.lance"
    stop_prepare_after(monkeypatch, spec, str(out), 3)
    assert not out.exists()  # nothing at the output until complete
    partial = lance.dataset(f"{out}.partial")
    assert partial.count_rows() == 6 and DONE_KEY not in partial.config()
    report = prepare(spec, str(out), progress=False)
    assert (report.status, report.units_adopted, report.units, report.rows_written) == ("resumed", 3, 7, 6)
    assert lance.dataset(str(out)).to_table().equals(lance.dataset(str(tmp_path / "whole.lance")).to_table())
    assert report.skipped == [("dog/zz.png", "is not a readable image (cannot identify image file)")]
    assert not Path(f"{out}.partial").exists()
    referenced = {f.path for fragment in lance.dataset(str(out)).get_fragments() for f in fragment.metadata.files}
    assert {p.name for p in (out / "data").iterdir()} == referenced  # the stopped unit's files were removed


def test_rerun_on_a_complete_output_writes_nothing(tmp_path: Path) -> None:
    spec = Prepare("imagefolder", str(image_folder(tmp_path / "in", per_class=2)))
    prepare(spec, str(tmp_path / "out.lance"), progress=False)
    version = lance.dataset(str(tmp_path / "out.lance")).version
    report = prepare(spec, str(tmp_path / "out.lance"), progress=False)
    assert report.status == "complete" and "is already complete" in report.line() and "nothing to do" in report.line()
    assert lance.dataset(str(tmp_path / "out.lance")).version == version


def test_completed_but_not_yet_moved_in_place_is_moved_by_the_rerun(tmp_path: Path) -> None:
    spec = Prepare("imagefolder", str(image_folder(tmp_path / "in", per_class=2)))
    out = tmp_path / "out.lance"
    prepare(spec, str(out), progress=False)
    out.rename(f"{out}.partial")  # as if SIGKILLed between the completion commit and the rename
    report = prepare(spec, str(out), progress=False)
    assert report.status == "complete" and lance.dataset(str(out)).count_rows() == 6


def test_a_partial_of_other_input_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = image_folder(tmp_path / "in", per_class=3)
    out = tmp_path / "out.lance"
    stop_prepare_after(monkeypatch, Prepare("imagefolder", str(root), unit_files=2), str(out), 1)
    (root / "cat" / "new.png").write_bytes((root / "cat" / "000.png").read_bytes())
    with pytest.raises(ConfigError, match="interrupted prepare of other input") as error:
        prepare(Prepare("imagefolder", str(root), unit_files=2), str(out), progress=False)
    assert error.value.param == "output" and error.value.value.endswith("out.lance.partial")


def test_a_run_killed_before_its_first_commit_starts_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Prepare("imagefolder", str(image_folder(tmp_path / "in", per_class=2)), unit_files=1)
    out = tmp_path / "out.lance"
    stop_prepare_after(monkeypatch, spec, str(out), 0)
    assert Path(f"{out}.partial", "data").is_dir()  # fragment files, but no version
    assert prepare(spec, str(out), progress=False).status == "prepared"
    assert lance.dataset(str(out)).to_table()["id"].to_pylist() == list(range(6))


def test_a_process_worker_whose_prepare_died_while_it_started_exits() -> None:
    """A ``--pool processes`` worker is spawned (seconds of imports under load); if its prepare is
    SIGKILLed meanwhile, the worker's parent is another process by the time its initializer runs.
    It watched whatever parent it found then and lived on (CI: "a spawned worker outlived the
    SIGKILLed prepare"); it now watches the pid its prepare passed and exits. Here the pid passed
    is not the child's parent: the child must exit (status 1, no traceback) instead of sleeping 60 s."""
    code = "import time; from lance_lightning.write.pools import _init_worker; _init_worker(1); time.sleep(60)"
    child = subprocess.run([sys.executable, "-c", code], timeout=50, check=False, capture_output=True, text=True)
    assert child.returncode == 1 and not child.stderr, child.stderr[-2000:]
