"""Nothing left behind: a run killed or stopped mid-fit leaves no file in the temp dir or /dev/shm.

Each case runs a real training process in its own session (``start_new_session``) with a private
``TMPDIR``, ends it one way, waits (at most 10 s) for every process of the session to end, and
compares listings taken before and after:

- the run's temp dir (its ``tempfile.gettempdir()``, the private ``TMPDIR``) must be empty again.
  Torch's compile cache (``torchinductor_<user>``, made when Lightning is imported and shared by
  every later run of the user, so it never piles up) goes elsewhere (``TORCHINDUCTOR_CACHE_DIR``);
- ``/dev/shm`` is shared by every job on the machine, so an entry counts when it appeared during
  the run and a process of the run mapped or opened it (sampled 10 times a second): none may
  remain.

The cases, and what each left before lance_lightning cleaned up after them: SIGKILL of the
training process during a fit with 2 workers (multiprocessing's ``pymp-*`` folders, with the
forkserver's socket); SIGTERM of a worker (the ``pymp-*`` folder of the first worker, which made
one of its own); SIGKILL of the training process while the filter-scan child runs (a
``lance-lightning-filter-*`` folder); SIGTERM of ``lance-lightning fit`` mid-epoch, which must
also exit with status 143 (Lightning's is 0) after writing a checkpoint that resumes exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

from lance_lightning import LanceSource
from tests.harness import fit, make_dm
from tests.helpers import RecordingModel, forkserver_processes, session_processes, wait_session_gone, write_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = REPO_ROOT / "tests" / "resume_worker.py"
SHM = Path("/dev/shm")
GONE_WITHIN_S = 10.0
START_TIMEOUT_S = 240.0
ROWS, BATCH = 400, 4

pytestmark = pytest.mark.skipif(
    not (SHM.is_dir() and Path("/proc/self/maps").exists()), reason="reads Linux's /proc and /dev/shm"
)


class LoggingModel(RecordingModel):
    """Appends the ids of each training step to ``ids_log`` (a flushed JSON line), then sleeps ``sleep`` s."""

    def __init__(self, ids_log: str, sleep: float = 0.0) -> None:
        super().__init__()
        self.ids_log = ids_log
        self.sleep = sleep

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        with open(self.ids_log, "a", encoding="utf-8") as log:
            log.write(json.dumps(self.seen[-1]) + "\n")
        time.sleep(self.sleep)
        return loss


class ShmUse:
    """Samples, on a thread, 10 times a second, the /dev/shm entries that the processes of session
    ``sid`` map or hold open. A sample whose listing of /dev/shm holds no entry but those of
    ``before`` (the listing when the run started) and those already found used reads no process's
    maps: it could only find entries that cannot count (`Run.leftovers` counts the entries that
    appeared during the run and were used) or that count already, and a torch process's
    ``/proc/PID/maps`` takes milliseconds of kernel time to read (4 processes at 10 Hz: a tenth of a
    core)."""

    def __init__(self, sid: int, before: set[str]) -> None:
        self.sid = sid
        self.before = before
        self.names: set[str] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="shm-use", daemon=True)

    def start(self) -> ShmUse:
        self._thread.start()
        return self

    def stop(self) -> set[str]:
        if self._thread.is_alive():
            self._stopped.set()
            self._thread.join()
        return self.names

    def _sample(self) -> None:
        while not self._stopped.wait(0.1):
            if set(os.listdir(SHM)) - self.before <= self.names:
                continue
            for process in session_processes(self.sid):
                self.names |= _shm_used_by(process.pid)


def _shm_used_by(pid: int) -> set[str]:
    paths = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            text = maps.read()  # a torch process maps ~1400 regions: look at the lines only where one is in SHM
        if f" {SHM}/" in text:
            paths |= {line.split(maxsplit=5)[-1].strip() for line in text.splitlines() if f" {SHM}/" in line}
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            paths.add(os.readlink(fd))
    except OSError:  # the process ended meanwhile
        pass
    return {path[len(f"{SHM}/") :] for path in paths if path.startswith(f"{SHM}/") and not path.endswith("(deleted)")}


class Run:
    """One training command in its own session with a private temp dir; ``leftovers()`` after it ended.

    Used as a context manager: on the way out every process still in the session is killed, so a
    failing test leaves nothing running.
    """

    def __init__(self, tmp_path: Path, argv: list[str]) -> None:
        self.argv = argv
        # Short: the forkserver binds a socket under TMPDIR, and an AF_UNIX path has at most 107 bytes
        # (pytest-xdist's tmp_path, .../popen-gw0/test_..._0/tmp/pymp-.../listener-..., is longer).
        self.temp = Path(tempfile.mkdtemp(prefix="leftovers-"))
        self.env = {
            **os.environ,
            "TMPDIR": str(self.temp),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor-cache"),
            "PYTHONUNBUFFERED": "1",
        }
        self.output = tmp_path / "output.txt"  # a file, not a pipe: a leftover child would hold a pipe open
        self.process: subprocess.Popen[bytes] | None = None
        self.shm_before: set[str] = set()
        self.shm_use: ShmUse | None = None

    def __enter__(self) -> Run:
        self.shm_before = set(os.listdir(SHM))
        with self.output.open("w") as sink:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO_ROOT, env=self.env, start_new_session=True, stdout=sink, stderr=subprocess.STDOUT
            )
        self.shm_use = ShmUse(self.sid, self.shm_before).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shm_use is not None:
            self.shm_use.stop()
        if session_processes(self.sid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.sid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait()
        shutil.rmtree(self.temp, ignore_errors=True)

    @property
    def sid(self) -> int:
        assert self.process is not None
        return self.process.pid  # the session leader's pid is the session id

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not condition():
            assert self.process.poll() is None, f"the run ended before {what}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {START_TIMEOUT_S} s"
            time.sleep(0.05)

    def end(self) -> int:
        """Wait for the training process, then for the rest of its session; its exit status."""
        assert self.process is not None and self.shm_use is not None
        status = self.process.wait(timeout=START_TIMEOUT_S)
        left = wait_session_gone(self.sid, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S} s after the training process ended: {left}"
        self.shm_use.stop()
        return status

    def leftovers(self) -> list[str]:
        """What the run left: paths in its temp dir, and /dev/shm entries that it made and used."""
        assert self.shm_use is not None
        files = sorted(str(path.relative_to(self.temp)) for path in self.temp.rglob("*"))
        shm = sorted(f"{SHM}/{name}" for name in (set(os.listdir(SHM)) - self.shm_before) & self.shm_use.names)
        return files + shm

    def text(self) -> str:
        return self.output.read_text(errors="replace")


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)


@pytest.fixture(scope="module")
def whole_epoch(tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    """The batches of one uninterrupted epoch (``row:3`` shuffle, columns ``id`` and ``x``) of a
    dataset written as `uri` writes it: the oracle of both SIGTERM resumes, fitted once for the
    module (the same rows, fragments and seed train the same batches wherever the dataset lies)."""
    root = tmp_path_factory.mktemp("whole_epoch")
    whole_uri = write_dataset(root / "ds.lance", ROWS, fragment_rows=100)
    dm = make_dm(whole_uri, "row:3", batch_size=BATCH, source=LanceSource(whole_uri, columns=["id", "x"]))
    return fit(root, dm, name="whole").seen


@pytest.fixture(autouse=True)
def _workers_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs with workers keep them (the race's outcome forced, `lance_lightning.load.race`): the
    cases end a run whose workers are reading."""
    monkeypatch.setenv("LANCE_LIGHTNING_WORKER_CHOICE", "workers")


def _script(uri: str, tmp_path: Path, *extra: str) -> list[str]:
    """`tests/resume_worker.py`: a plain ``Trainer.fit`` script, one step per 0.1 s for 20 epochs."""
    common = ["--uri", uri, "--out", str(tmp_path / "out"), "--batch-size", str(BATCH), "--sleep", "0.1"]
    return [sys.executable, str(WORKER), *common, "--max-epochs", "20", "--ids-log", str(_ids_log(tmp_path)), *extra]


def _ids_log(tmp_path: Path) -> Path:
    return tmp_path / "ids.jsonl"


def _steps(tmp_path: Path) -> int:
    """Training steps started so far (`tests/resume_worker.py` logs one line per step)."""
    log = Path(f"{_ids_log(tmp_path)}.rank0")
    return len(log.read_text().splitlines()) if log.exists() else 0


def _workers(sid: int) -> list[psutil.Process]:
    """The DataLoader workers of the session: the forkserver's children, the first started first."""
    family = forkserver_processes(sid)
    pids = {process.pid for process in family}
    workers = [process for process in family if process.ppid() in pids]
    return sorted(workers, key=lambda process: (process.create_time(), process.pid))


def _filter_scan_child_runs(sid: int) -> bool:
    for process in session_processes(sid):
        try:
            if "lance_lightning.plan.filter_scan" in " ".join(process.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.slow
def test_sigkill_of_the_trainer_during_a_fit_with_workers_leaves_nothing(uri: str, tmp_path: Path) -> None:
    with Run(tmp_path, _script(uri, tmp_path, "--num-workers", "2")) as run:
        run.wait_until(lambda: _steps(tmp_path) >= 3 and len(_workers(run.sid)) == 2, "3 steps and 2 workers")
        os.kill(run.sid, signal.SIGKILL)
        assert run.end() == -signal.SIGKILL
        assert run.leftovers() == []


@pytest.mark.slow
def test_sigterm_of_a_worker_during_a_fit_leaves_nothing(uri: str, tmp_path: Path) -> None:
    """The first worker is the one that made a temp folder of its own: it started before the
    training process had made its folder for the forkserver."""
    with Run(tmp_path, _script(uri, tmp_path, "--num-workers", "2")) as run:
        run.wait_until(lambda: _steps(tmp_path) >= 3 and len(_workers(run.sid)) == 2, "3 steps and 2 workers")
        first = _workers(run.sid)[0].pid
        os.kill(first, signal.SIGTERM)
        assert run.end() == 1
        assert f"WorkerDiedError: DataLoader worker (pid {first}) died" in run.text()
        assert run.leftovers() == []


@pytest.mark.slow
def test_sigkill_of_the_trainer_during_a_filter_scan_leaves_nothing(uri: str, tmp_path: Path) -> None:
    with Run(tmp_path, _script(uri, tmp_path, "--filter", "id % 3 = 1", "--filter-in-child")) as run:
        run.wait_until(lambda: _filter_scan_child_runs(run.sid), "a filter-scan child")
        os.kill(run.sid, signal.SIGKILL)
        assert run.end() == -signal.SIGKILL
        assert _steps(tmp_path) == 0, "the training process was killed after the scan, not during it"
        assert run.leftovers() == []


@pytest.mark.slow
@pytest.mark.parametrize("signalled", ["trainer", "session"])
def test_sigterm_of_lance_lightning_fit_mid_epoch_exits_143_after_a_checkpoint_that_resumes_exactly(
    uri: str, tmp_path: Path, whole_epoch: list[list[int]], signalled: str
) -> None:
    """The run is set up as docs/distributed.md says for SLURM: periodic checkpoints and an
    ``OnExceptionCheckpoint`` in one folder, started with ``--ckpt_path last`` (nothing to resume
    yet); ``fit(ckpt_path="last")`` must then pick the checkpoint written on SIGTERM.

    ``session``: SIGTERM reaches every process of the run at once, the workers too, as when SLURM
    signals a job step; the steps wait for data then (slow workers), so the workers' deaths reach
    the training process before Lightning's stop at the end of a step."""
    ids_log, ckpt_dir = tmp_path / "ids.jsonl", tmp_path / "ckpt"
    slow = {
        "trainer": "",
        "session": "transform: {class_path: tests.scenarios.test_faults.SlowTransform, init_args: {seconds: 0.3}}",
    }
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_epochs: 1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {ckpt_dir}, every_n_train_steps: 3, save_last: true}}
    - class_path: lightning.pytorch.callbacks.OnExceptionCheckpoint
      init_args: {{dirpath: {ckpt_dir}}}
    - class_path: lance_lightning.DataCursorCheckpoint
model:
  class_path: tests.scenarios.test_leftovers.LoggingModel
  init_args: {{ids_log: {ids_log}, sleep: {0.1 if signalled == "trainer" else 0.0}}}
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: {BATCH}
  shuffle: {{class_path: lance_lightning.RowShuffle, init_args: {{seed: 3}}}}
  num_workers: 2
  {slow[signalled]}
""")
    trained = lambda: ids_log.read_text().splitlines() if ids_log.exists() else []  # noqa: E731
    command = [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config), "--ckpt_path", "last"]
    with Run(tmp_path, command) as run:
        run.wait_until(lambda: len(trained()) >= 5, "5 training steps")
        if signalled == "trainer":
            os.kill(run.sid, signal.SIGTERM)
        else:
            os.killpg(run.sid, signal.SIGTERM)
        assert run.end() == 128 + signal.SIGTERM, run.text()[-3000:]
        assert run.leftovers() == []
    before = [json.loads(line) for line in trained()]
    assert 5 <= len(before) < ROWS // BATCH, "stopped mid-epoch"

    def data_module() -> Any:
        return make_dm(uri, "row:3", batch_size=BATCH, source=LanceSource(uri, columns=["id", "x"]))

    assert (ckpt_dir / "on_exception.ckpt").is_file() and (ckpt_dir / "last.ckpt").is_file()
    checkpoints = [
        ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_last=True),
        OnExceptionCheckpoint(ckpt_dir),
    ]
    rest = fit(tmp_path, data_module(), name="rest", ckpt_path="last", callbacks=checkpoints, enable_checkpointing=True)
    assert len(whole_epoch) == ROWS // BATCH
    assert before + rest.seen == whole_epoch, "the resumed fit did not train exactly the rest of the epoch"


@pytest.mark.slow
def test_sigkill_of_the_trainer_before_its_workers_start_leaves_nothing(uri: str, tmp_path: Path) -> None:
    """#51: the data module starts the fork server at ``setup`` (its socket in a ``pymp-*`` folder)
    and the first batches are read in process while it starts; a SIGKILL then left the folder, whose
    janitor was started only with the first worker. Killed after the first step with the server up
    and no worker started."""
    with Run(tmp_path, _script(uri, tmp_path, "--num-workers", "2")) as run:
        run.wait_until(
            lambda: _steps(tmp_path) >= 1 and forkserver_processes(run.sid) and not _workers(run.sid),
            "a step read in process, the fork server up and no worker",
        )
        assert list(run.temp.glob("pymp-*")), "the fork server's folder is there to be left"
        os.kill(run.sid, signal.SIGKILL)
        assert run.end() == -signal.SIGKILL
        assert run.leftovers() == []


#: #51: how long a worker may outlive a trainer that SIGTERM stopped.
WORKERS_GONE_WITHIN_S = 3.0


@pytest.mark.slow
def test_sigterm_during_the_replay_probe_with_workers_leaves_no_worker_behind(uri: str, tmp_path: Path) -> None:
    """#51: ``lance-lightning fit`` with 2 workers and the replay probe, SIGTERM while it replays:
    status 143, and within 3 s of the trainer's exit no process of the run is left."""
    from tests.scenarios.test_unclean_exits import MARKER_ENV, _replay_config

    config = _replay_config(tmp_path, uri)
    config.write_text(config.read_text().replace("  reader_threads: 1\n", "  reader_threads: 1\n  num_workers: 2\n"))
    marker = tmp_path / "replaying"
    argv = [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)]
    run = Run(tmp_path, argv)
    run.env[MARKER_ENV] = str(marker)
    with run:
        run.wait_until(marker.exists, "the replay")
        os.kill(run.sid, signal.SIGTERM)
        assert run.process is not None
        assert run.process.wait(timeout=START_TIMEOUT_S) == 143, run.text()[-3000:]
        left = wait_session_gone(run.sid, WORKERS_GONE_WITHIN_S)
        assert not left, f"still running {WORKERS_GONE_WITHIN_S} s after the trainer exited: {left}"
        assert run.shm_use is not None
        run.shm_use.stop()
        assert run.leftovers() == []
