"""The test harness's zygote: a process that has imported ``lightning.pytorch`` and
``lance_lightning.cli`` once and forks a child per request that runs a Python entry point as a
fresh interpreter would (the client, and what it mirrors or leaves to a fresh process:
`tests.zygote`).

Guarantees:
- It forks only while it is the one thread of its process (``/proc/self/task``; the BLAS thread
  pools that numpy/scipy start at import are shut down by their own fork handlers, so a trial fork
  after the imports leaves one thread) and while ``lance`` is not imported (Lance is not
  fork-safe once a dataset is opened; the zygote never imports it). Otherwise it reports ``off``
  and forks nothing.
- Its imports printed nothing (else ``off``: a fresh process would have shown it).
- It dies with the pytest worker that started it (it polls its parent pid each second between
  requests) and binds only an abstract Unix socket, whose connections it serves only from that
  worker's pid (``SO_PEERCRED``): nothing is left on disk, and no other process can use it.
- A child: a new session if asked; stdin/stdout/stderr dup2'ed from the fds the client sent;
  the signal mask and dispositions of a fresh interpreter started by the client (the signals the
  client ignores stay ignored, the rest SIG_DFL, then as CPython's start-up: SIGPIPE and SIGXFSZ
  ignored, SIGINT -> ``default_int_handler`` unless ignored); ``os.environ`` replaced by the
  request's, with what the zygote's imports set in it; ``cwd``; from the request's
  ``PYTHONUNBUFFERED``, ``PYTHONFAULTHANDLER``,
  ``PYTHONDONTWRITEBYTECODE`` and ``PYTHONPYCACHEPREFIX`` (read as CPython reads them) new
  ``sys.stdout``/``sys.stderr`` as the interpreter's ``create_stdio`` makes them (the logging
  handlers the imports pointed at the zygote's streams moved to them), faulthandler enabled on
  stderr for all threads or disabled, ``sys.dont_write_bytecode`` and ``sys.pycache_prefix``;
  ``sys.argv``, ``sys.orig_argv`` and ``sys.path[0]`` as the interpreter sets them; a fresh
  ``__main__`` module; numpy's global generator and torch's CPU one reseeded at
  random, as a fresh process seeds them (Python's ``random`` is reseeded at fork by CPython).
  It then runs the script or module as the interpreter does and ends as the interpreter ends:
  ``SystemExit`` as CPython handles it (it prints a code that is not an int); an uncaught
  exception printed by ``sys.excepthook`` with the zygote's frames cut, then exit 1; non-daemon
  threads joined and the atexit handlers run by CPython.
- A child's fast exit (`FAST_EXIT`: on unless ``off`` in the request's environment, or, where that
  has no such variable, in the zygote's), last of the atexit handlers, instead of the module
  teardown that costs this VM 1.3-2.7 s after the imports (0.4-0.5 s for the fast exit): what
  finalization does that a test can see short of module teardown, then ``os._exit`` with the
  status the interpreter gives (``_Py_HandleSystemExit``'s: None 0, an int as ``exit()`` takes it,
  anything else 1). That is: ``sys.stdout`` and ``sys.stderr`` flushed; one ``gc.collect()``
  (cyclic garbage's finalizers run, what they print and "Exception ignored in" reports appear);
  every other open file object flushed (``gc.get_objects()``, and those the zygote held when it
  froze the objects of its imports: ``gc.freeze``); stdout and stderr flushed again;
  the C library's stdio flushed, as ``exit()`` does. A flush that fails leaves the exit to the
  interpreter's finalization, which retries it, reports it and exits 120, as CPython does.
  Not mirrored: a collection in a child before its exit leaves out the objects the zygote's
  imports made (frozen); a finalization left to the interpreter unfreezes them first. Not
  mirrored with the fast exit: module teardown (the ``__del__`` of objects still referenced from
  module globals does not run; open files are flushed, not closed: a ``gzip.GzipFile`` left open
  has no trailer), the C library's exit handlers and static destructors. Tests of teardown
  use ``subprocess`` or ``LANCE_LIGHTNING_TEST_ZYGOTE_FAST_EXIT=off`` in the command's environment.
- An uncaught ``KeyboardInterrupt`` in a child: printed, then after the atexit handlers and the
  fast exit's flushes (switch off: stdout and stderr flushed) death by SIGINT, as CPython 3.11's
  ``exit_sigint`` (which comes after the whole finalization).
- A request with ``spare``: the child forks its spare before it runs the entry point
  (`tests.zygote_spare.split`); the spare, once Lightning launches a rank in it, becomes that
  process as above (no new session), with its rank at import set from its environment.
- Requests are served one at a time; the zygote reaps each child and sends its wait status.

Protocol (``tests.zygote`` is the only client): a request is 8 bytes of length then JSON, with three
fds (stdin, stdout, stderr; stdout and stderr the same pipe for ``stderr=STDOUT``) as SCM_RIGHTS;
the answers are JSON lines ``{"pid": N}`` then ``{"status": S}`` (``os.waitpid``'s status), or
``{"off": reason}``.
"""

from __future__ import annotations

import _io
import atexit
import builtins
import ctypes
import gc
import io
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import types
import weakref
from typing import Any

from tests import zygote_spare
from tests.zygote import switched_on

#: ``off`` in the command's environment (if it has the variable; else in the zygote's) turns the
#: fast exit (`_leave`) off.
FAST_EXIT = "LANCE_LIGHTNING_TEST_ZYGOTE_FAST_EXIT"
_FAST: list[bool] = [False]  # set in the child
_STATUS: list[int] = []
_INTERRUPTED: list[bool] = []
#: The variables the zygote's imports set in ``os.environ`` (Lightning's
#: ``PYTORCH_NVML_BASED_CUDA_CHECK``, torch's ``TORCHINDUCTOR_CACHE_DIR``): import-time variables
#: (`tests.zygote.IMPORT_TIME`), so a mirrored request never sets them otherwise.
_SET_BY_IMPORTS: dict[str, str] = {}
#: The file objects the zygote held when it froze its objects (`serve`): ``gc.get_objects()`` leaves
#: frozen objects out, so the fast exit flushes these as well (weakly held: a child may close them).
_FROZEN_FILES: list[weakref.ref] = []


def _fast_exit(env: Any, default: bool) -> bool:
    value = env.get(FAST_EXIT)
    return default if value is None else switched_on(value)


def _exit_status(error: SystemExit) -> int:
    """The exit status CPython's ``_Py_HandleSystemExit`` gives ``error``: for a code None 0, an int
    as a C long (past it -1) cut to a byte as ``exit()`` cuts it, anything else 1 (CPython prints it)."""
    code = getattr(error, "code", error)
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
    return 1


def _flushed(files: Any) -> bool:
    """Flush each open file, as finalization does; whether none failed."""
    failed = False
    for file in files:
        try:
            if file is not None and not getattr(file, "closed", False):
                file.flush()
        except Exception:
            failed = True
    return not failed


def _finalized() -> bool:
    """What finalization does after the atexit handlers that a test can see, short of module
    teardown: stdout and stderr flushed, cyclic garbage collected (its finalizers run), every other
    open file object flushed, then stdout and stderr again. False where a flush failed: the
    interpreter's own finalization then retries and reports it (stdout or stderr: exit 120)."""
    if not _flushed((sys.stdout, sys.stderr)):
        return False
    gc.collect()
    stdio = (sys.stdout, sys.stderr)
    held = [f for f in (ref() for ref in _FROZEN_FILES) if f is not None]
    files = [f for f in gc.get_objects() + held if issubclass(type(f), _io._IOBase) and not any(f is s for s in stdio)]
    return _flushed(files) and _flushed(stdio)


def _leave() -> None:
    """Registered first, so it runs last of the atexit handlers: after an uncaught
    ``KeyboardInterrupt``, death by SIGINT (CPython's ``exit_sigint``); else, unless `FAST_EXIT` is
    off, `_finalized`, the C library's stdio flushed (as ``exit()`` does), then ``os._exit`` with
    the interpreter's status instead of module teardown."""
    fast = _FAST[0] and _finalized()
    if not fast:
        gc.unfreeze()  # the interpreter's finalization collects every object, as in a fresh process
    if _INTERRUPTED:
        _flushed((sys.stdout, sys.stderr))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)
    if fast:
        ctypes.CDLL(None).fflush(None)
        os._exit(_STATUS[0] if _STATUS else 0)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _why_not_fork() -> str | None:
    if _threads() != 1:
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return f"the zygote holds {len(names)} threads ({', '.join(names)})"
    if "lance" in sys.modules:
        return "the zygote imported lance, which is not fork-safe"
    return None


def _prepare() -> str | None:
    """Import what a ``fit`` imports before it reads data (not ``lance`` nor ``pyarrow``: each
    starts a jemalloc thread); the reason the zygote cannot serve, or None."""
    capture = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    os.dup2(capture.fileno(), 1)
    os.dup2(capture.fileno(), 2)
    try:
        import docstring_parser  # noqa: F401
        import jsonargparse  # noqa: F401
        import lightning.pytorch  # noqa: F401
        import lightning.pytorch.cli  # noqa: F401
        import psutil  # noqa: F401
        import torchvision  # noqa: F401
        import typeshed_client  # noqa: F401

        import lance_lightning.cli  # noqa: F401
        import lance_lightning.cli.main  # noqa: F401

        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()  # a trial fork: the BLAS pools' fork handlers stop their threads
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    if capture.seek(0, os.SEEK_END):
        capture.seek(0)
        return "the imports printed: " + capture.read(300).decode(errors="replace").strip()
    return _why_not_fork()


def _recv(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    while len(head) < 8:
        head += conn.recv(8 - len(head))
    (size,) = struct.unpack("!Q", head)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), fds


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def serve(name: str, parent: int) -> tuple[dict[str, Any], list[int]]:
    """Serve requests until the parent dies; returns only in a forked child, with its request."""
    # Not PR_SET_PDEATHSIG: it fires when the *thread* that started the zygote ends.
    if os.getppid() != parent:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(8)
    before = dict(os.environ)
    off = _prepare()
    _SET_BY_IMPORTS.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    # The imports' objects move to the permanent generation: no collection in a child scans them
    # (the fast exit's took 0.37 s a child over them, 1.4-2.8 s under load), and a child's
    # collections leave their pages shared with the zygote.
    gc.collect()
    _FROZEN_FILES.extend(weakref.ref(f) for f in gc.get_objects() if issubclass(type(f), _io._IOBase))
    gc.freeze()
    print(json.dumps({"off": off} if off else {"ready": os.getpid()}), flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    while os.getppid() == parent:
        if not select.select([listener], [], [], 1.0)[0]:
            continue
        conn, _ = listener.accept()
        try:
            peer, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if peer != parent:  # an abstract socket has no permissions: only the pytest worker is served
                continue
            request, fds = _recv(conn)
            off = _why_not_fork()
            if off:
                _send(conn, {"off": off})
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            _send(conn, {"pid": pid})
            _, status = os.waitpid(pid, 0)
            _send(conn, {"status": status})
        except OSError:
            pass  # the client went away; its child was reaped or will be by the next waitpid
        finally:
            conn.close()
    os._exit(0)


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked child into the fresh process the request describes."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    ignored = set(request["ignored"])
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["mask"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(_SET_BY_IMPORTS)  # as the same imports set them in a fresh process
    _start_up(os.environ)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if "torch" in sys.modules:  # a fresh process seeds torch's CPU generator at random
        sys.modules["torch"].default_generator.seed()


def _flag(name: str, env: Any) -> int:
    """A start-up flag from the environment, as CPython's ``_Py_get_env_flag``: unset or empty 0, a
    non-negative number itself, anything else 1."""
    value = env.get(name, "")
    if not value:
        return 0
    if not re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", value) or not 0 <= int(value) < 2**31:
        return 1  # not a number (strtol), negative or past an int
    return int(value)


def _start_up(env: Any) -> None:
    """What the interpreter sets up at start-up from `tests.zygote.APPLIED`, from ``env`` (the
    request's): stdout and stderr as ``create_stdio`` makes them (``PYTHONUNBUFFERED``: unbuffered
    and written through; else buffered, line-buffered for stderr and a terminal), the logging
    handlers the imports gave the zygote's streams moved to them; faulthandler on stderr for every
    thread (``PYTHONFAULTHANDLER``); ``sys.dont_write_bytecode`` and ``sys.pycache_prefix``."""
    import faulthandler
    import logging

    unbuffered = bool(_flag("PYTHONUNBUFFERED", env))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        buffer = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
        raw = buffer if unbuffered else buffer.raw
        raw.name = f"<{name}>"
        line_buffering = not unbuffered and (raw.isatty() or name == "stderr")
        stream = io.TextIOWrapper(
            buffer, old.encoding, old.errors, "\n", line_buffering=line_buffering, write_through=unbuffered
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        for handler in (h for lg in loggers for h in getattr(lg, "handlers", ())):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.stream = stream
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(sys.stderr, all_threads=True)
    else:
        faulthandler.disable()
    sys.dont_write_bytecode = bool(_flag("PYTHONDONTWRITEBYTECODE", env))
    sys.pycache_prefix = env.get("PYTHONPYCACHEPREFIX") or None


def _run(request: dict[str, Any]) -> None:
    """Run the entry point as the interpreter would (see the module docstring)."""
    main = types.ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    target, args = request["target"], request["args"]
    if request["kind"] == "module":
        sys.path[0] = os.getcwd()
        sys.argv = ["-m", *args]  # runpy sets argv[0] to the module's file
        sys.orig_argv = [sys.executable, "-m", target, *args]
        import runpy

        first = runpy._run_module_as_main.__code__  # type: ignore[attr-defined]
        call = lambda: runpy._run_module_as_main(target)  # type: ignore[attr-defined]  # noqa: E731
    else:
        real = target
        while os.path.islink(real):
            real = os.path.join(os.path.dirname(real), os.readlink(real))
        sys.path[0] = os.path.dirname(real)
        sys.argv = [target, *args]
        sys.orig_argv = [sys.executable, target, *args]
        from importlib.machinery import SourceFileLoader

        main.__file__, main.__cached__ = target, None
        main.__loader__ = SourceFileLoader("__main__", target)
        with open(target, "rb") as source:
            first = compile(source.read(), target, "exec")
        call = lambda: exec(first, main.__dict__)  # noqa: E731
    try:
        call()
    except SystemExit:
        raise
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code is not first:
            tb = tb.tb_next
        error.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, tb
        sys.excepthook(type(error), error, tb)
        if isinstance(error, KeyboardInterrupt):
            _INTERRUPTED.append(True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    atexit.register(_leave)
    _zygote_fast = _fast_exit(os.environ, True)
    _request, _fds = serve(sys.argv[1], int(sys.argv[2]))
    _become(_request, _fds)
    if _request.get("spare"):
        _launched = zygote_spare.split()  # in the spare, once Lightning launches a rank in it
        if _launched is not None:
            _request, _fds = _launched
            _become(_request, _fds)
            zygote_spare.set_rank_from_env()
    del _fds
    _FAST[0] = _fast_exit(os.environ, _zygote_fast)
    try:
        _run(_request)
    except SystemExit as error:
        _STATUS.append(_exit_status(error))
        raise
