"""How a run ends: helpers never outlive it, it leaves no files behind, its exit status says how it stopped.

Guarantees:
- `ParentWatch().start()`, called in a helper process, makes it die (SIGKILL) within about a
  second of its parent's death, whatever killed the parent (SIGKILL by the out-of-memory
  killer included). On Linux the kernel does it (``PR_SET_PDEATHSIG``), so the helper keeps no
  thread; elsewhere a daemon thread polls the parent's pid twice a second. ``stop()`` undoes it.
- The chain covers every helper of a run: the forkserver is watched from the first line of its
  preload (`lance_lightning.load._forkserver`, before its seconds of imports, with the pid of the
  process that started it: one gone already ends it at once), or, forked from the training
  process (`lance_lightning.load.forked_server`), from its first step, and dies with the training
  process; each DataLoader worker is watched from `watch_parent`, the loader's
  ``worker_init_fn``, and dies with its parent (the forkserver, or the training process under
  ``spawn``). Multiprocessing's resource tracker
  exits by itself once they are gone (its pipe closes), after freeing what they leaked.
- If the parent dies between `ParentWatch()` and ``start()``, the helper ends at once; so does a
  worker whose forkserver died before `watch_parent` ran (it watches the server's pid, which it
  inherited, not its parent at that time), and one whose starting process is gone
  (``multiprocessing.parent_process()``). The kernel signals the server when the training
  process's *thread* that started it ends, which on SIGKILL may come before the process's last
  thread has closed its files: a worker may then find the server gone and its starter still open.
- `shared_temp_dir()`, called before a process starts worker processes, makes multiprocessing's
  temp folder of that process (``pymp-*``: the forkserver's listening socket, the sockets through
  which workers hand over shared tensors) the one folder of the run: the workers it starts
  inherit it instead of making folders of their own. A `TempDirJanitor` removes it once that
  process has ended, however it ended. Multiprocessing removes such a folder only in an exit
  handler, which neither a SIGKILL of the training process nor a SIGTERM or SIGKILL of a worker
  runs. (Named semaphores need no help: multiprocessing's resource tracker, which outlives the
  processes it serves, unlinks what they leaked.)
- Inside `exit_on_sigterm()` a run that Lightning stopped on SIGTERM ends the process with status
  143 (`SIGTERM_EXIT_STATUS`, 128 + SIGTERM, what a shell reports for a process killed by
  SIGTERM) instead of 0. Lightning 2.6 finishes the running step, calls ``on_exception`` (where
  ``OnExceptionCheckpoint`` writes its checkpoint), tears down and raises ``SIGTERMException``, a
  ``SystemExit`` with status 0: a scheduler (SLURM, Kubernetes) would record the run as finished.
  The ``lance-lightning`` Trainer commands run in it; a script wraps its ``trainer.fit`` in it.
- `destroy_gloo_group_at_exit()`, called once a process group is initialized, has a gloo process
  group destroyed by an exit handler while the interpreter is still whole. Lightning does this for
  NCCL only; a gloo group left to the interpreter's finalization ends a finished run with SIGABRT
  ("terminate called without an active exception") now and then (pytorch/pytorch#190489): two
  scenarios of the contract checker's soak did, each right after a 2-rank fit on CPU had trained
  every batch. The data module calls it at ``setup``.
- Importing this module imports nothing beyond the standard library (workers never import
  Lightning; torch is imported by `destroy_gloo_group_at_exit` when it is called).

Caveat (Linux): the kernel signals when the *thread* that started the helper ends. Lightning
iterates loaders on the main thread; a loader first iterated on a short-lived thread would take
its forkserver down with that thread (the next loader starts a new one).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_POLL_S = 0.5


class ParentWatch:
    """Kills this process when its parent process dies (see the module docstring)."""

    def __init__(self, parent: int | None = None) -> None:
        #: The process to die with: given by a parent that started us (so that its death before
        #: this line still counts), else the current parent.
        self._parent = parent if parent is not None else os.getppid()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ParentWatch:
        if not (sys.platform.startswith("linux") and _prctl_deathsig(signal.SIGKILL)):
            self._thread = threading.Thread(target=self._poll, name="lance-lightning-parent-watch", daemon=True)
            self._thread.start()
        if os.getppid() != self._parent:  # orphaned while the watch was being set up
            os.kill(os.getpid(), signal.SIGKILL)
        return self

    def stop(self) -> None:
        if self._thread is None:
            _prctl_deathsig(0)
            return
        self._stopped.set()
        self._thread.join()
        self._thread = None

    def _poll(self) -> None:
        while not self._stopped.wait(_POLL_S):
            if os.getppid() != self._parent:
                os.kill(os.getpid(), signal.SIGKILL)


def _prctl(option: int, value: int | bytes) -> bool:
    """``prctl(option, value)`` where the C library has it; whether it succeeded."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _prctl_deathsig(sig: int) -> bool:
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def name_process(name: str) -> None:
    """Set this process's name (``comm``: ``ps``, ``top``; Linux, at most 15 bytes kept)."""
    _prctl(_PR_SET_NAME, name.encode())


#: This process's watch, by pid: a worker forked from the forkserver inherits the server's entry,
#: but not its death signal (the kernel clears it at fork), so it needs its own.
_WATCHES: dict[int, ParentWatch] = {}


def watch_parent(worker_id: int | None = None, parent: int | None = None) -> None:
    """Start this process's `ParentWatch` once (a DataLoader ``worker_init_fn``; idempotent), for
    ``parent`` when given (a process that was gone before this call then ends this one at once).
    Without ``parent``, a process forked from a watched one (a worker from the forkserver) watches
    that one, found in the table it inherited: its current parent may be init already (#51: a
    worker whose server died before this call outlived a SIGKILLed trainer)."""
    if os.getpid() not in _WATCHES:
        if parent is None and _WATCHES:
            parent = next(reversed(_WATCHES))  # the forking process's own watch, added last
        _WATCHES[os.getpid()] = ParentWatch(parent).start()
        # A worker forked by the forkserver: the server (its parent) may have died with the process
        # that asked for the worker before this watch began (#51: workers outlived a SIGKILLed
        # trainer). multiprocessing tells whether that process still lives.
        starter = multiprocessing.parent_process()
        if starter is not None and not starter.is_alive():
            os.kill(os.getpid(), signal.SIGKILL)


#: The janitor's program: ignore the signals that stop a job (a whole process group may get them),
#: wait for end of file on stdin (its owner has ended, normally or killed), then remove the folder.
#: A worker that was still starting when its owner died may add a file while it is being removed:
#: try again for a few seconds, until the kernel has killed the owner's helpers too.
_JANITOR = """
import os, shutil, signal, sys, time
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
sys.stdin.buffer.read()
for _ in range(50):
    shutil.rmtree(sys.argv[1], ignore_errors=True)
    if not os.path.lexists(sys.argv[1]):
        break
    time.sleep(0.1)
"""


class TempDirJanitor:
    """A small process that removes ``path`` after the process that started it has ended.

    It holds the read end of a pipe whose only write end is in this process (non-inheritable, so
    neither workers nor other children get it): end of file comes when this process ends, however
    it ends. It imports only the standard library and ignores SIGINT and SIGTERM, so the signal
    that stops a whole job does not stop it before the folder is gone; it exits right after.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> TempDirJanitor:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _JANITOR, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
        return self

    def stop(self) -> None:
        """Remove the folder now (unless gone already) and wait for the janitor to end."""
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()
        self._process = None


#: The janitor of each temp folder this process made, by folder. A child forked from this process
#: inherits the entry (and the pipe: the janitor then waits for both), not the exit handler.
_JANITORS: dict[str, TempDirJanitor] = {}


def shared_temp_dir() -> str:
    """This process's multiprocessing temp folder, created (once) with its `TempDirJanitor`.

    Call it before starting worker processes: each worker inherits the folder from the
    ``Process`` object that multiprocessing builds for it (a copy of this process's
    configuration), so the run has this one folder instead of one per worker. In a process that
    multiprocessing started (a worker) the folder is its parent's, whose janitor removes it.
    """
    path = multiprocessing.util.get_temp_dir()
    if path not in _JANITORS and multiprocessing.parent_process() is None:
        janitor = _JANITORS[path] = TempDirJanitor(path).start()
        # After multiprocessing removes the folder at a normal exit (priority -100): end the janitor.
        multiprocessing.util.Finalize(None, janitor.stop, exitpriority=-101)
    return path


#: The exit status of a run stopped by SIGTERM (`exit_on_sigterm`).
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Exit with `SIGTERM_EXIT_STATUS` when Lightning stops the enclosed fit on SIGTERM (after its
    ``on_exception`` checkpoint), instead of Lightning's status 0 (see the module docstring)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        yield
    except SIGTERMException as stopped:
        raise SystemExit(SIGTERM_EXIT_STATUS) from stopped


_GLOO_EXIT_HANDLER: list[bool] = []


def destroy_gloo_group_at_exit() -> None:
    """Register, once per process, an exit handler that destroys the default process group when its
    backend is gloo (see the module docstring); a group already destroyed is left alone."""
    import torch.distributed as dist

    if _GLOO_EXIT_HANDLER or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() != "gloo":
        return
    _GLOO_EXIT_HANDLER.append(True)
    atexit.register(_destroy_gloo_group)


def _destroy_gloo_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
