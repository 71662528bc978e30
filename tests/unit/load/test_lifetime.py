"""No orphans: a ``lance-lightning fit`` with 2 workers leaves no process behind, however it ends.

Each run is its own session (``start_new_session``): the trainer, the forkserver, the workers,
multiprocessing's resource tracker and the temp folder's janitor. After SIGKILL (what the
out-of-memory killer sends) or Ctrl-C mid-epoch, a normal exit or an exception, the session must
be empty within 10 s (a bound on how long a leftover may linger, not a speed target).

Also here: the shared temp folder goes however its process ends (the fits that kill processes
are in ``tests/scenarios/test_leftovers.py``), and `exit_on_sigterm` turns Lightning's SIGTERM
stop into exit status 143.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lance_lightning import exit_on_sigterm
from tests import zygote
from tests.helpers import (
    RecordingModel,
    forkserver_processes,
    sigint_as_at_a_terminal,
    wait_session_gone,
    write_dataset,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 10.0
START_TIMEOUT_S = 240.0


class SlowModel(RecordingModel):
    """Sleeps per step, so a fit is mid-epoch for long; raises at step ``fail_at`` if given."""

    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.fail_at = fail_at

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("a deliberate failure in training_step")
        time.sleep(0.1)
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["sigkill", "ctrl-c", "normal exit", "exception"])
def test_no_process_outlives_the_trainer(tmp_path: Path, ending: str) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 400, fragment_rows=100)
    fail_at = 6 if ending == "exception" else -1
    max_steps = 6 if ending == "normal exit" else 1000
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: {max_steps}
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.unit.load.test_lifetime.SlowModel
  init_args: {{fail_at: {fail_at}}}
data:
  train: {{uri: {uri}, columns: [id, x]}}
  batch_size: 4
  num_workers: 2
""")
    log = tmp_path / "stderr.txt"  # a file, not a pipe: a leftover child would hold a pipe open
    with log.open("w") as stderr_file:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "lance_lightning.cli", "fit", "--config", str(config)],
            cwd=REPO_ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            preexec_fn=sigint_as_at_a_terminal,
        )
    sid = trainer.pid  # the session leader's pid is the session id
    try:
        if ending in ("sigkill", "ctrl-c"):
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(forkserver_processes(sid)) < 3 and trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert trainer.poll() is None and len(forkserver_processes(sid)) >= 3, "the workers never started"
            time.sleep(0.5)  # the workers run (forked above), a few of the epoch's 100 steps in
            trainer.send_signal(signal.SIGKILL if ending == "sigkill" else signal.SIGINT)
        trainer.wait(timeout=START_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            trainer.wait()
    stderr = log.read_text()
    if ending == "normal exit":
        assert trainer.returncode == 0, stderr[-3000:]
    elif ending == "exception":
        assert trainer.returncode != 0 and "a deliberate failure" in stderr, stderr[-3000:]
    left = wait_session_gone(sid, GONE_WITHIN_S)
    assert not left, f"still running {GONE_WITHIN_S} s after the trainer ended ({ending}): {left}"


#: Makes this process's shared temp folder, prints it, then waits to be killed or told to exit.
_TEMP_DIR_OWNER = """
import sys
from lance_lightning.lifetime import shared_temp_dir
print(shared_temp_dir(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("ending", ["sigkill", "normal exit"])
def test_the_shared_temp_dir_goes_however_its_process_ends(tmp_path: Path, ending: str) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    owner = subprocess.Popen(
        [sys.executable, "-c", _TEMP_DIR_OWNER],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        folder = Path(owner.stdout.readline().strip())
        assert folder.parent == tmp_path and folder.name.startswith("pymp-") and folder.is_dir()
        if ending == "sigkill":
            owner.kill()
        else:
            owner.stdin.close()
        owner.wait(timeout=60)
        left = wait_session_gone(owner.pid, GONE_WITHIN_S)  # the janitor
        assert not left, f"still running after the owner ended: {left}"
        assert list(tmp_path.iterdir()) == [], f"left behind ({ending})"
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()


def test_exit_on_sigterm_turns_lightnings_sigterm_stop_into_status_143() -> None:
    with pytest.raises(SystemExit) as stopped, exit_on_sigterm():
        raise SIGTERMException  # what Trainer.fit raises after the SIGTERM checkpoint: status 0
    assert stopped.value.code == 143
    with pytest.raises(SystemExit) as exited, exit_on_sigterm():
        raise SystemExit(3)
    assert exited.value.code == 3
    with pytest.raises(RuntimeError, match="unrelated"), exit_on_sigterm():
        raise RuntimeError("unrelated")


_GLOO_SCRIPT = """
import atexit
import sys

import torch.distributed as dist

from lance_lightning import LanceDataModule, LanceSource

dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
# Registered before the data module's handler, so it runs after it (exit handlers run last in, first out).
atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))
LanceDataModule(train=LanceSource(sys.argv[1], columns=["id", "x"]), batch_size=10).setup("fit")
"""


def test_a_gloo_group_is_destroyed_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """Lightning destroys NCCL groups at exit, not gloo ones, whose threads then abort the finished
    process now and then (SIGABRT, 'terminate called without an active exception'); the data module's
    setup has the group destroyed by an exit handler."""
    uri = write_dataset(tmp_path / "ds.lance", 40)
    script = tmp_path / "gloo_exit.py"
    script.write_text(_GLOO_SCRIPT)
    # Forked from the test zygote where it can be (`tests.zygote`: the exit, atexit handlers and
    # finalization a fresh process gives, less the imports).
    done = zygote.run(
        [sys.executable, str(script), uri, str(tmp_path / "rendezvous")],
        env=zygote.zygote_env(),
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "group alive at exit: False" in done.stdout, done.stdout + done.stderr[-2000:]


def test_a_child_whose_parent_died_before_its_watch_started_dies_at_once() -> None:
    """The filter-scan child is told its parent's pid: when that parent is gone by the time the
    child's `ParentWatch` starts (it died while the child imported its modules), the child ends."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is not our child's parent (and no longer runs)
    probe = f"from lance_lightning.lifetime import ParentWatch; ParentWatch(parent={gone.pid}).start(); print('alive')"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and "alive" not in done.stdout


def test_a_worker_forked_from_a_watched_server_that_died_before_the_worker_s_watch_dies_at_once(tmp_path: Path) -> None:
    """A forkserver's worker that reaches `watch_parent` after the server died (the server is
    signalled when the trainer's first thread ends, before the trainer's files close) must end:
    it watches the server it was forked from, not init, its parent by then (#51)."""
    record = tmp_path / "worker.txt"
    server = f"""
import os, sys, time
from lance_lightning.lifetime import watch_parent
watch_parent(parent=os.getppid())  # as the forkserver's preload does
server = os.getpid()
if os.fork() == 0:  # the worker: waits until the server is gone, then starts its watch
    while os.getppid() == server:
        time.sleep(0.01)
    with open({str(record)!r}, "a") as out:
        out.write(f"started {{os.getpid()}}\\n")
    watch_parent(worker_id=0)
    with open({str(record)!r}, "a") as out:
        out.write("survived\\n")
    os._exit(0)
os._exit(0)  # the server dies first
"""
    subprocess.run([sys.executable, "-c", server], check=True, timeout=120, cwd=REPO_ROOT)
    deadline = time.monotonic() + 120
    while not record.exists() or "started" not in record.read_text():
        assert time.monotonic() < deadline, "the worker never started its watch"
        time.sleep(0.05)
    worker = int(record.read_text().split()[1])
    while _running(worker):
        assert time.monotonic() < deadline, "the worker still runs"
        time.sleep(0.05)
    assert "survived" not in record.read_text()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
