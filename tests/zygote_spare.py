"""A DDP rank's head start in the test zygote's children: local rank 1, which Lightning's launcher
starts as a fresh interpreter (10-13 s of imports on this 2-core VM, on the path of every DDP
test: rank 0 waits for it at the process group's rendezvous), is instead a copy of its launching
process made before that process ran anything, with the zygote's imports done.

Guarantees:
- A child of the zygote asked for a spare (`tests.zygote.run_in_session`: DDP scripts, the contract
  checker's phases) forks one copy of itself (`split`) after it became the command's process and
  before it runs the entry point, while it is the one thread of its process and ``lance`` is not
  imported (else no spare). The spare is in the child's session and process group (the harness's
  SIGKILL of the group ends it), holds none of the child's stdio while it waits (``/dev/null``:
  the output's end is the child's), and ends when the child ends (``PR_SET_PDEATHSIG``, and the end
  of its socket), never running anything unless launched.
- Lightning's launcher (``subprocess.Popen(command, env=..., cwd=...)`` in ``lightning.pytorch``'s
  and ``lightning.fabric``'s ``subprocess_script``) gets the spare, once, for a command the
  zygote could run for the test process: ``[sys.executable, SCRIPT | -m MODULE, ...]``
  (`tests.zygote._entry`), an existing cwd, and the import-time variables
  (`tests.zygote.IMPORT_TIME`) the zygote imported under, less `LAUNCH_SET`. Those are read only at
  run time, except the rank that ``rank_zero_only`` (Lightning's and torchmetrics') takes at import,
  which the spare sets again from them as that import would. Otherwise, and for a third rank, a
  fresh process as before.
- The spare then becomes that process as the zygote makes its children (`tests.zygote_server`):
  the stdin, stdout and stderr, ignored signals and signal mask the launching thread has at that
  moment (what a child of ``Popen`` inherits), the environment, cwd, ``argv``, a fresh ``__main__``,
  reseeded generators, the same exit. The handle is a ``subprocess.Popen`` whose pid is the spare,
  a child of the launching process as a fresh rank is: ``poll``, ``wait``, ``send_signal`` and
  Lightning's process observer work on it unchanged.
- Not mirrored, beyond what `tests.zygote` lists for every child: the modules imported before the
  launch are the zygote's, not a fresh interpreter's (the same as rank 0's own).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import types
from collections.abc import Mapping
from typing import Any

from tests.zygote import _entry, _ignored, _import_time

#: Variables the launcher (and ``seed_everything`` before it) sets that the zygote's imports never read.
LAUNCH_SET = (
    "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
)  # fmt: skip
#: The modules whose ``subprocess.Popen`` starts the other ranks.
LAUNCHERS = (
    "lightning.pytorch.strategies.launchers.subprocess_script",
    "lightning.fabric.strategies.launchers.subprocess_script",
)
_PR_SET_PDEATHSIG = 1
_MESSAGE_BYTES = 1 << 20
#: The spare's first message: it holds none of the child's stdio any more (`split` waits for it).
_READY = b"ready"


class Spare:
    """The launching side: the spare's pid and socket, until one launch claims it."""

    def __init__(self, pid: int, channel: socket.socket, start_env: Mapping[str, str]) -> None:
        self.pid = pid
        self._channel: socket.socket | None = channel
        self._start_env = _runtime_only(start_env)

    def claim(self, args: Any, env: Mapping[str, str] | None, cwd: Any) -> dict[str, Any] | None:
        """The request the spare would run ``Popen(args, env=env, cwd=cwd)`` as, or None (a fresh
        process instead). A claimed spare is never claimed again."""
        entry = _entry(args) if isinstance(args, (list, tuple)) else None
        env = dict(os.environ if env is None else env)
        where = os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd))
        if self._channel is None or entry is None or not os.path.isdir(where):
            return None
        if _runtime_only(env) != self._start_env:
            return None
        return {
            **entry,
            "cwd": where,
            "env": env,
            "new_session": False,
            "ignored": [int(s) for s in signal.valid_signals() if _ignored(s)],
            "mask": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
        }

    def launch(self, request: dict[str, Any]) -> int:
        """Hand ``request`` and this thread's stdin, stdout and stderr to the spare; its pid."""
        channel, self._channel = self._channel, None
        if channel is None:
            raise OSError("the spare was launched already")
        with channel:
            socket.send_fds(channel, [json.dumps(request).encode()], [0, 1, 2])
        return self.pid


def _runtime_only(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in _import_time(env).items() if k not in LAUNCH_SET}


class SparePopen(subprocess.Popen):
    """``subprocess.Popen`` that runs a claimed command in the spare instead of a fresh interpreter."""

    spare: Spare | None = None

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        only_env_cwd = not rest and set(kwargs) <= {"env", "cwd"}
        spare = type(self).spare
        self._request = spare.claim(args, kwargs.get("env"), kwargs.get("cwd")) if spare and only_env_cwd else None
        super().__init__(args, *rest, **kwargs)

    def _execute_child(self, args: Any, *rest: Any) -> None:  # type: ignore[override]
        if self._request is not None and type(self).spare is not None:
            try:
                self.pid = type(self).spare.launch(self._request)  # type: ignore[union-attr]
                self._child_created = True
                return
            except OSError:
                pass  # the spare is gone: a fresh process, as without one
        super()._execute_child(args, *rest)  # type: ignore[misc]


def split() -> tuple[dict[str, Any], list[int]] | None:
    """Fork the spare. In the child that runs its own request: None, with the launchers' ``Popen``
    replaced by `SparePopen`, which compares a launch's import-time variables with this process's
    environment now (the zygote's, and what its imports set). In the spare, once launched: the
    launched command's request and its stdin, stdout and stderr (the spare ends instead when its
    launcher does)."""
    if len(os.listdir("/proc/self/task")) != 1 or "lance" in sys.modules:
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        theirs.close()
        if ours.recv(len(_READY)) != _READY:  # once it holds none of this process's stdio
            ours.close()
            return None
        SparePopen.spare = Spare(pid, ours, os.environ)
        _patch_launchers()
        return None
    ours.close()
    return _wait(theirs, parent)


def _wait(channel: socket.socket, parent: int) -> tuple[dict[str, Any], list[int]]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:
        channel.send(_READY)
        body, fds, _, _ = socket.recv_fds(channel, _MESSAGE_BYTES, 3)
    except OSError:
        os._exit(0)
    if not body:
        os._exit(0)  # the launcher ended without launching
    channel.close()
    libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)  # a fresh rank outlives its launcher
    return json.loads(body), fds


def _patch_launchers() -> None:
    proxy = types.ModuleType("subprocess")
    proxy.__dict__.update(subprocess.__dict__)
    proxy.Popen = SparePopen  # type: ignore[attr-defined]
    for name in LAUNCHERS:
        module = sys.modules.get(name)
        if module is not None:
            module.subprocess = proxy  # type: ignore[attr-defined]


def set_rank_from_env() -> None:
    """``rank_zero_only.rank`` (Lightning's and torchmetrics') as a fresh import under this
    environment sets it."""
    fabric = sys.modules.get("lightning.fabric.utilities.rank_zero")
    if fabric is not None:
        fabric.rank_zero_only.rank = fabric._get_rank() or 0
    prints = sys.modules.get("torchmetrics.utilities.prints")
    if prints is not None and (fabric is None or prints.rank_zero_only is not fabric.rank_zero_only):
        prints.rank_zero_only.rank = int(os.environ.get("LOCAL_RANK", 0))
