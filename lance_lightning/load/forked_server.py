"""The fork server as a fork of the training process: worker processes start without importing (#51).

Guarantees:
- `ForkedServer().start()` runs the ``forkserver`` start method's server as a fork of this process
  where that is safe (`ForkedServer.refusal` is None), and returns whether it did. It takes
  milliseconds; the stock server is a fresh interpreter that imports torch, Arrow, Lance and the
  package, seconds of CPU taken from the read the race runs in process meanwhile
  (`lance_lightning.load._forkserver`). Workers it forks hold this process's modules as they were
  when it forked (Lightning's included, where this process had imported it) and import nothing
  more than what is pickled to them needs.
- Safe means all of: Linux; a Python whose fork server this drives (`FORKED_PYTHONS`: the server is
  that Python's own loop, ``multiprocessing.forkserver.main``); Lance's runtime not started in this
  process (no thread named ``lance*``: children forked after a dataset was opened crash, after
  ``import lance`` alone they were clean 20 of 20 times, docs/fork-safety.md); this process's
  private memory at most `MEMORY_LIMIT_BYTES` (the server keeps the pages this process had when it
  forked once this process changes or frees them: a model's CPU weights moved to the GPU, for
  one); and ``LANCE_LIGHTNING_FORKED_SERVER`` (`ENV_SWITCH`) not ``off``. Otherwise nothing starts
  and the caller starts the stock server (`lance_lightning.load.lean_start.ensure_server`).
- This process's ``multiprocessing`` state is the state a stock start leaves (address, liveness
  pipe, pid), so connecting, the liveness check and a restart after the server died are
  ``multiprocessing``'s own. The server keeps this process's stdio and none of its other sockets
  or pipes (a peer sees the end of a connection when every copy of it is closed), takes the
  default signal handlers, never runs this process's exit handlers (it leaves by ``os._exit``),
  and dies with this process: at the end of its liveness pipe, as the stock server does, and by
  `lance_lightning.lifetime.watch_parent` when this process is killed. It and its workers are
  named `SERVER_NAME` (``ps``, ``top``), and `INHERITED` there lists the modules they hold from
  this process; `forked_code` is the user's code as it held it when it forked, checked before its
  workers start (`lance_lightning.load.server_code`). `running_server` says which server runs,
  and why a stock one does (a line of the end-of-fit report where workers started,
  `lance_lightning.metrics.report`).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import threading
import time
import warnings
from multiprocessing import connection, forkserver, resource_tracker, util
from typing import Any

from lance_lightning.checks import env_switch
from lance_lightning.lifetime import name_process, watch_parent
from lance_lightning.load.server_code import user_modules

#: ``off`` starts the stock fork server (a fresh interpreter that imports the readers).
ENV_SWITCH = "LANCE_LIGHTNING_FORKED_SERVER"
#: The most private memory this process may hold for its fork to serve workers.
MEMORY_LIMIT_BYTES = 2 << 30
#: Python versions whose ``multiprocessing.forkserver`` this drives (as `lance_lightning.load.lean_start.LEAN_PYTHONS`).
FORKED_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
#: The process name (``comm``: ``ps``, ``top``) of a forked server and of the workers it forks.
SERVER_NAME = "ll-forkserver"
#: In a forked server and the workers it forks: the modules it had from this process when it forked.
INHERITED: frozenset[str] = frozenset()
#: The pid of the server this process forked, and why it last declined to fork one.
_forked_pid: int | None = None
_declined: str | None = None
#: The user's code as the server this process forked holds it (`lance_lightning.load.server_code.user_modules`).
_forked_code: dict[str, dict[str, Any]] = {}


def running_server() -> str | None:
    """What the fork server of this process is, for the end-of-fit report; None where none runs."""
    pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # CPython's, not in typeshed
    if pid is None:
        return None
    if pid == _forked_pid:
        return "forked from this process, imported nothing"
    return f"a fresh interpreter that imported the readers ({_declined or 'started outside this package'})"


def forked_running() -> bool:
    """Whether the running fork server is one this process forked (ready once forked)."""
    pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # CPython's, not in typeshed
    return pid is not None and pid == _forked_pid


def forked_code() -> dict[str, dict[str, Any]] | None:
    """The user's code as the running fork server holds it, where this process forked it; None
    where the server imports what its workers need (the stock one) or none runs."""
    return _forked_code if forked_running() else None


def lance_running() -> bool:
    """Whether Lance's runtime has started in this process (its threads are named ``lance*``)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: assume the unsafe case
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                if handle.read().startswith("lance"):
                    return True
        except OSError:
            continue  # the thread ended
    return False


def private_bytes() -> int:
    """This process's private (anonymous) resident memory, in bytes."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class ForkedServer:
    """Starts ``multiprocessing``'s fork server as a fork of this process (see the module docstring)."""

    def refusal(self) -> str | None:
        """Why the server may not be forked from this process now; None where it may."""
        if not env_switch(ENV_SWITCH):
            return f"{ENV_SWITCH}=off"
        if not sys.platform.startswith("linux") or sys.version_info[:2] not in FORKED_PYTHONS:
            return f"not verified on {sys.platform}, Python {sys.version_info[0]}.{sys.version_info[1]}"
        if hasattr(forkserver._forkserver, "_forkserver_authkey"):
            return "this Python's fork server authenticates its clients, which the forked server does not do"
        if lance_running():
            return "Lance's runtime runs in this process (a dataset was opened before the workers' server started)"
        held = private_bytes()
        if held > MEMORY_LIMIT_BYTES:
            limit = MEMORY_LIMIT_BYTES / 2**20
            return f"this process holds {held / 2**20:,.0f} MiB of private memory, more than {limit:,.0f} MiB"
        return None

    def start(self) -> bool:
        """Fork the server unless one runs (True) or `refusal` names a reason (False)."""
        global _forked_pid, _declined, _forked_code
        server: Any = forkserver._forkserver  # CPython's private state (docs/internals.md)
        with server._lock:
            if _runs(server):
                return True
            _declined = self.refusal()
            if _declined is not None:
                return False
            resource_tracker.ensure_running()
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # not in typeshed
            parent = os.getpid()
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                alive_r, alive_w = os.pipe()
                held = user_modules()  # what the fork holds: checked before its workers start
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # Lance's generic fork warning; Python 3.12's threads warning
                        pid = os.fork()
                    if pid == 0:
                        _serve(listener, alive_r, alive_w, parent)
                except BaseException:
                    os.close(alive_w)
                    raise
                finally:
                    os.close(alive_r)
            server._forkserver_address, server._forkserver_alive_fd = address, alive_w
            server._forkserver_pid = _forked_pid = pid
            _forked_code = held
            return True


def ended_server(wait_s: float = 1.0) -> tuple[int, int] | None:
    """The pid and exit code (negative: the signal) of this process's fork server where it has
    ended, waiting up to ``wait_s`` for the kernel (a server that closed its connection is exiting);
    its state is then cleared, so the next worker starts a new one. None while it runs or where
    none was started."""
    server: Any = forkserver._forkserver  # CPython's private state (docs/internals.md)
    deadline = time.monotonic() + wait_s
    while True:
        with server._lock:
            pid = server._forkserver_pid
            status = _reap(server)
        if pid is None or status is not None or time.monotonic() >= deadline:
            return None if pid is None or status is None else (pid, os.waitstatus_to_exitcode(status))
        time.sleep(0.02)


def _runs(server: Any) -> bool:
    """Whether ``server`` (``multiprocessing``'s) has a live process; a dead one's state is cleared."""
    return server._forkserver_pid is not None and _reap(server) is None


def _reap(server: Any) -> int | None:
    """The wait status of ``server``'s process where it has ended (its state then cleared); None
    while it runs or where none was started."""
    if server._forkserver_pid is None:
        return None
    pid, status = os.waitpid(server._forkserver_pid, os.WNOHANG)
    if not pid:
        return None
    os.close(server._forkserver_alive_fd)
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    return status


def _serve(listener: socket.socket, alive_r: int, alive_w: int, parent: int) -> None:
    """The forked server: ``multiprocessing``'s loop, then ``os._exit`` (never returns)."""
    global INHERITED
    code = 0
    try:
        INHERITED = frozenset(sys.modules)
        name_process(SERVER_NAME)
        # Locks another thread of this process may have held at the fork: new ones, as a fresh process has.
        forkserver._forkserver._lock = threading.Lock()  # type: ignore[attr-defined]
        resource_tracker._resource_tracker._lock = threading.RLock()  # type: ignore[attr-defined]
        os.close(alive_w)
        watch_parent(parent=parent)
        warnings.filterwarnings("ignore", message="lance is not fork-safe")
        for sig in signal.valid_signals():  # this process's Python handlers: a fresh interpreter's instead
            if sig not in (signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(sig)):
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _release_connections(keep={listener.fileno(), alive_r})
        forkserver.main(listener.detach(), alive_r, [])
    except SystemExit:  # the liveness pipe ended: this process is gone
        pass
    except BaseException:  # noqa: BLE001  (reported, then the process ends as the stock server would)
        code = 1
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _release_connections(keep: set[int]) -> None:
    """Release this process's sockets and pipes but stdio and ``keep``: each descriptor then points
    to ``/dev/null`` (not closed: an inherited object that closes its descriptor later must not
    close another file that took its number)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd == null or fd in keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # the directory listing's own descriptor, closed already
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            os.dup2(null, fd, inheritable=os.get_inheritable(fd))
    os.close(null)
