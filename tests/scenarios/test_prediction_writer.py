"""The prediction writer in real 2-rank CPU DDP (gloo): every row written exactly once in one commit,
and a run whose rank zero is SIGKILLed midway, rerun with the same command, ends equal to an
uninterrupted run without predicting its finished fragments again.

Both tests start from the same SIGKILLed launch (`killed_run`: one launch for the module; each test
reruns on what it left, put back, at the path it ran at)."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np
import pytest

from tests import zygote
from tests.harness import REPO_ROOT, subprocess_env
from tests.helpers import restorer
from tests.predict_writer_model import embedding_of, write_rows

COLUMNS = ["emb", "score", "name", "draw"]
WORKER = str(REPO_ROOT / "tests" / "predict_writer_model.py")


def _run(uri: str, run_dir: Path, kill_after: int | None = None, scale: float = 1.0, check: bool = True) -> int:
    """One launch of the worker on 2 ranks, rank zero forked from the test zygote (`tests.zygote`:
    the process a fresh start gives, less the imports; rank one from its spare, `tests.zygote_spare`) in its own
    session; with ``kill_after``, rank zero kills itself and the surviving rank (left waiting at a
    barrier) is ended with the launch's session."""
    command = [sys.executable, WORKER, uri, str(run_dir), "2", str(kill_after or 0), str(scale)]
    log = run_dir.parent / f"launch{kill_after or ''}-{scale}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = zygote.run_in_session(command, cwd=REPO_ROOT, env=subprocess_env(), timeout=300)
    log.write_text(done.output)
    if done.timed_out:
        pytest.fail(f"hung: {' '.join(command)}\n{done.output[-4000:]}")
    if kill_after is None and check:
        assert done.returncode == 0, done.output[-6000:]
    return done.returncode


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """One 2-rank launch on a new dataset of 300 rows (fragments of 50) whose rank zero SIGKILLed
    itself after 6 batches, checked to have committed nothing. Gives a function that puts the
    folder it ran in (``rows.lance``, the run folder ``b/run``) back as the kill left it and returns
    it: at the same path, since a run is named by its dataset's location."""
    root = tmp_path_factory.mktemp("killed_launch")
    uri = str(root / "rows.lance")
    write_rows(uri, rows=300, per_fragment=50)
    assert _run(uri, root / "b" / "run", kill_after=6) == -signal.SIGKILL
    assert lance.dataset(uri).version == 1, "a killed run commits nothing"
    return restorer(root, tmp_path_factory.mktemp("killed_pristine"))


def _predicted(run_dir: Path) -> list[int]:
    files = sorted(run_dir.parent.glob("predicted.rank*.json"))
    return sorted(i for f in files for i in json.loads(f.read_text()))


@pytest.mark.slow
def test_two_ranks_write_every_row_once_and_a_killed_run_resumes(
    tmp_path: Path, killed_run: Callable[[], Path]
) -> None:
    whole = str(tmp_path / "whole.lance")
    write_rows(whole, rows=300, per_fragment=50)
    root = killed_run()
    killed = str(root / "rows.lance")
    before = {f.fragment_id: [d.path for d in f.metadata.files] for f in lance.dataset(killed).get_fragments()}

    _run(whole, tmp_path / "a" / "run")
    assert _predicted(tmp_path / "a" / "run") == list(range(300)), "each row predicted once over both ranks"
    reference = lance.dataset(whole)
    assert reference.version == 2
    table = reference.to_table()
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))

    rerun = root / "b" / "run"  # the killed launch's (`killed_run`: SIGKILLed, nothing committed)
    for f in rerun.parent.glob("predicted.rank*.json"):
        f.unlink()
    _run(killed, rerun)
    again = _predicted(rerun)
    assert again and len(again) < 300 and set(again) == set(range(again[0], 300)), "finished fragments are skipped"
    result = lance.dataset(killed)
    assert result.version == 2 and result.to_table().select(COLUMNS) == reference.to_table().select(COLUMNS)
    after = {f.fragment_id: [d.path for d in f.metadata.files] for f in result.get_fragments()}
    assert all(after[k][:-1] == files for k, files in before.items()), "existing data files are not rewritten"


@pytest.mark.slow
def test_two_ranks_refuse_another_model_together_and_start_over_on_a_dataset_written_again(
    killed_run: Callable[[], Path],
) -> None:
    """Issue #50 (2, 3) on 2 ranks: after a SIGKILL, a rerun with another model is refused on every
    rank (no rank left waiting); after the dataset is written again at the path, the rerun starts
    over and commits a version that reads, holding the model's values."""
    root = killed_run()  # after the SIGKILLed launch, nothing committed
    uri, run_dir = str(root / "rows.lance"), root / "b" / "run"
    code = _run(uri, run_dir, scale=2.0, check=False)
    log = (run_dir.parent / "launch-2.0.log").read_text()
    assert code != 0 and "would mix two models' outputs" in log and "hyperparameters" in log, log[-4000:]
    assert lance.dataset(uri).version == 1
    shutil.rmtree(uri)
    write_rows(uri, rows=300, per_fragment=60)
    _run(uri, run_dir)
    assert "starting the run over" in (run_dir.parent / "launch-1.0.log").read_text()
    table = lance.dataset(uri).to_table()
    assert lance.dataset(uri).version == 2 and table["id"].to_pylist() == list(range(300))
    assert np.allclose(np.stack(table["emb"].to_numpy(zero_copy_only=False)), embedding_of(table["id"].to_numpy()))
