"""Helper processes never outlive the training process: workers and the forkserver die with it.

Guarantees:
- `ParentWatch().start()`, called in a helper process, makes it die (SIGKILL) within about a
  second of its parent's death, whatever killed the parent (SIGKILL by the out-of-memory
  killer included). On Linux the kernel does it (``PR_SET_PDEATHSIG``), so the helper keeps no
  thread; elsewhere a daemon thread polls the parent's pid twice a second. ``stop()`` undoes it.
- The chain covers every helper of a run: the forkserver is watched from its preload
  (`lance_lightning.load._forkserver`) and dies with the training process; each DataLoader worker is
  watched from `watch_parent`, the loader's ``worker_init_fn``, and dies with its parent (the
  forkserver, or the training process under ``spawn``). Multiprocessing's resource tracker
  exits by itself once they are gone (its pipe closes), after freeing what they leaked.
- If the parent dies between `ParentWatch()` and ``start()``, the helper ends at once.
- Importing this module imports nothing beyond the standard library (workers never import
  Lightning).

Caveat (Linux): the kernel signals when the *thread* that started the helper ends. Lightning
iterates loaders on the main thread; a loader first iterated on a short-lived thread would take
its forkserver down with that thread (the next loader starts a new one).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


class ParentWatch:
    """Kills this process when its parent process dies (see the module docstring)."""

    def __init__(self) -> None:
        self._parent = os.getppid()
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


def _prctl_deathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


#: This process's watch, by pid: a worker forked from the forkserver inherits the server's entry,
#: but not its death signal (the kernel clears it at fork), so it needs its own.
_WATCHES: dict[int, ParentWatch] = {}


def watch_parent(worker_id: int | None = None) -> None:
    """Start this process's `ParentWatch` once (a DataLoader ``worker_init_fn``; idempotent)."""
    if os.getpid() not in _WATCHES:
        _WATCHES[os.getpid()] = ParentWatch().start()
