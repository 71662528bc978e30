"""Start CLI test subprocesses from a pre-imported zygote: `run` is ``subprocess.run(command,
capture_output=True, ...)`` and `run_in_session` is ``Popen(command, stdout=PIPE, stderr=STDOUT,
text=True, start_new_session=True)`` whose process group is SIGKILLed past the timeout and after the
end (the contract checker's phases, a DDP script's ranks): the child, where it can be, is forked
from a helper process that imported ``lightning.pytorch`` and ``lance_lightning.cli`` once
(``tests/zygote_server.py``) instead of paying those seconds of imports again (10 s of CPU on a
loaded 2-core machine).

`run_in_session`'s child also forks a spare in which Lightning's DDP launcher starts rank 1 as a
fresh rank starts, less the imports (`tests.zygote_spare`: 10-13 s a DDP launch on this VM).

Guarantees:
- The child is the command's own process, as a fresh one would be: its pid and (if asked) its
  own session, the exit status the interpreter gives (``SystemExit``, an uncaught exception's
  traceback and 1, death by SIGINT after an uncaught ``KeyboardInterrupt``, death by a signal as
  a negative status), stdout and stderr as the bytes it wrote (with what finalization writes:
  buffered streams and open files flushed, cyclic garbage's finalizers run), stdin inherited as
  ``subprocess.run`` does, the environment, cwd, ``sys.argv``/``sys.path``, ``__main__`` and the
  signal mask and dispositions a fresh interpreter started from this process has (details:
  `tests.zygote_server`). The start-up variables in `APPLIED` take effect in the child from the
  command's environment as the interpreter would apply them: ``PYTHONUNBUFFERED`` (stdout and
  stderr unbuffered, else buffered as a fresh process buffers them), ``PYTHONFAULTHANDLER``
  (faulthandler on stderr for every thread: a crash prints "Fatal Python error" and the stacks),
  ``PYTHONDONTWRITEBYTECODE``, ``PYTHONPYCACHEPREFIX``. `run`: a timeout kills the child (SIGKILL)
  and raises ``subprocess.TimeoutExpired``. `run_in_session`: stdout and stderr are one pipe (one
  open file, as ``stderr=STDOUT``: the order a fresh process gives), the child is in a new session,
  a timeout SIGKILLs its process group (grandchildren included) and the output is read to its end;
  the status is the child's own (negative: the signal that ended it).
- A fresh process is taken instead (``subprocess.run``; `run_in_session`: its ``Popen``, the
  same result type) when the zygote cannot mirror the command: a command that is not
  ``[sys.executable, SCRIPT|-m MODULE, ...]`` or a script whose shebang is ``sys.executable``; an
  environment that differs from the zygote's in a variable that may be read at import and is not in
  `APPLIED` nor `CALL_TIME` (`IMPORT_TIME`: ``PYTHON*`` including ``PYTHONPATH``,
  ``CUDA*``, ``OMP_*``, ``TORCH*``, ``PL_*``, the rank variables Lightning reads at import,
  locale, ``TMPDIR``, ...); a missing cwd; another thread of this process using the zygote; the
  zygote off (``LANCE_LIGHTNING_TEST_ZYGOTE=off``, or it reported threads, import output or
  ``lance`` imported: one warning, then fresh processes for the rest of the session).
- What it does not mirror: the modules the zygote imported are already in ``sys.modules`` (a test
  of what a command imports, or of its start-up time, must use ``subprocess`` itself), and
  ``os.environ`` holds what their imports set in it (``PYTORCH_NVML_BASED_CUDA_CHECK``,
  ``TORCHINDUCTOR_CACHE_DIR``), as after those imports in a fresh process; `run_in_session`'s child
  has one more child process, the spare, until a DDP launch takes it (``spare=False`` for none); the child's
  parent is the zygote, not this process; its ``/proc/PID/cmdline`` and ``/proc/PID/environ``
  (what ``ps`` and ``psutil`` show) are the zygote's; the hash seed is the zygote's; tests that
  find a command's processes that way drive ``subprocess.Popen`` themselves. With
  ``PYTHONFAULTHANDLER``, ``signal.getsignal`` gives SIG_DFL for faulthandler's signals (a fresh
  interpreter: None), and a crash's report goes on below the entry point with the zygote's own
  frames and names the zygote's extension modules. ``sys.flags`` is the zygote's. The child skips
  module teardown (it leaves by ``os._exit`` after its atexit handlers and the flushes above, 1-2 s
  sooner): the ``__del__`` of objects that module globals still hold does not run, open files are
  flushed but not closed, the C library's exit handlers do not run; a test of teardown uses
  ``subprocess`` or sets ``LANCE_LIGHTNING_TEST_ZYGOTE_FAST_EXIT=off`` in the command's
  environment (`tests.zygote_server`). The zygote dies with this process and leaves no file
  behind; `stop` (tests/conftest.py, at session end) ends it.
"""

from __future__ import annotations

import contextlib
import json
import locale
import os
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REPO_ROOT = Path(__file__).resolve().parent.parent
SWITCH = "LANCE_LIGHTNING_TEST_ZYGOTE"
#: ``off`` in the command's environment (if it has the variable; else in this process's): `run_in_session`'s
#: child has no spare, and a DDP script's rank 1 starts fresh (`tests.zygote_spare`).
SPARE = "LANCE_LIGHTNING_TEST_ZYGOTE_SPARE"
#: Prefixes (and names) of variables a module may read when it is imported: a request whose value
#: differs from the zygote's for any of them runs in a fresh process.
IMPORT_TIME = (
    "PYTHON", "CUDA", "NVIDIA", "OMP_", "MKL", "OPENBLAS", "GOTO", "KMP_", "NUMEXPR", "NUMPY", "TORCH", "PYTORCH",
    "PL_", "LIGHTNING", "LD_", "HF_", "TRANSFORMERS", "LC_", "LANG", "TZ", "TMPDIR", "TEMP", "TMP", "MALLOC",
    "RANK", "LOCAL_RANK", "GLOBAL_RANK", "NODE_RANK", "WORLD_SIZE", "SLURM_", "JSM_", "MASTER_", "JSONARGPARSE",
)  # fmt: skip

#: Start-up variables whose whole effect the zygote sets up in each child from the request's value,
#: as the interpreter would at start-up (`tests.zygote_server`): they never send a command to a fresh
#: process.
APPLIED = ("PYTHONFAULTHANDLER", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
#: Variables of `IMPORT_TIME`'s prefixes read only when used, from ``os.environ`` (the child's is the
#: request's): never a reason for a fresh process. ``ray.init`` sets ``PYTHONBREAKPOINT`` in the
#: process that calls it, for good: every later request of that pytest worker ran fresh.
CALL_TIME = ("PYTHONBREAKPOINT",)

_lock = threading.Lock()
_server: dict[str, Any] = {}


def zygote_env() -> dict[str, str]:
    """The environment the zygote imports under: this one, the repository first on PYTHONPATH."""
    entries = [str(REPO_ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    path = os.pathsep.join(p for p in dict.fromkeys(entries) if p)
    return {**os.environ, "PYTHONPATH": path}


def _import_time(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that may be read at import, less those the zygote applies in the
    child (`APPLIED`); PYTHONPATH as the path it gives (the interpreter drops repeated entries)."""
    found = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in APPLIED + CALL_TIME}
    if "PYTHONPATH" in found:
        found["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(found["PYTHONPATH"].split(os.pathsep)))
    return found


def _entry(command: Sequence[str]) -> dict[str, Any] | None:
    """What the fresh interpreter would run (``kind``, ``target``, ``args``), or None."""
    command = [os.fspath(c) for c in command]
    if len(command) >= 3 and command[0] == sys.executable and command[1] == "-m":
        return {"kind": "module", "target": command[2], "args": command[3:]}
    if len(command) >= 2 and command[0] == sys.executable and os.path.isabs(command[1]):
        script = command[1]
        return {"kind": "script", "target": script, "args": command[2:]} if os.path.isfile(script) else None
    if command and os.path.isabs(command[0]) and os.access(command[0], os.X_OK) and os.path.isfile(command[0]):
        with open(command[0], "rb") as file:
            if file.readline().rstrip(b"\n") == b"#!" + os.fsencode(sys.executable):
                return {"kind": "script", "target": command[0], "args": command[1:]}
    return None


def _start() -> None:
    """Start the zygote (once per process); on failure or ``off``, warn once and turn it off."""
    if _server:
        return
    if not switched_on(os.environ.get(SWITCH, "on")):
        _server["off"] = f"{SWITCH}=off"
        return
    name = f"lance-lightning-test-zygote-{os.getpid()}-{secrets.token_hex(6)}"
    env = zygote_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.zygote_server", name, str(os.getpid())],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    answer = json.loads(line) if line.strip() else {"off": f"the zygote exited ({proc.poll()})"}
    _server.update(proc=proc, name=name, env=_import_time(env))
    if "ready" not in answer:
        _server["off"] = answer["off"]
        warnings.warn(f"test zygote off, CLI tests start fresh processes: {answer['off']}", stacklevel=3)
        stop()


def stop() -> None:
    """End the zygote (a later `run` starts fresh processes, as the zygote is off)."""
    proc = _server.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    _server.setdefault("off", "stopped")


def mirrored(command: Sequence[str], cwd: Any = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether `run` would fork this command from the zygote (starts the zygote if need be)."""
    _start()
    variables = os.environ if env is None else env
    return (
        "off" not in _server
        and _entry(command) is not None
        and _import_time(variables) == _server["env"]
        and os.path.isdir(os.getcwd() if cwd is None else cwd)
    )


def run(
    command: Sequence[str],
    *,
    cwd: Any = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    text: bool = False,
    start_new_session: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, ...)``, forked from the zygote where it can be."""

    def fresh() -> subprocess.CompletedProcess:
        return subprocess.run(
            command,
            cwd=cwd,
            env=env,
            timeout=timeout,
            text=text,
            capture_output=True,
            start_new_session=start_new_session,
        )

    done = _forked(command, cwd, env, timeout, start_new_session, group=False)
    if done is None:
        return fresh()
    code, (stdout, stderr), timed_out = done
    if timed_out:
        raise subprocess.TimeoutExpired(list(command), timeout, output=stdout, stderr=stderr)  # type: ignore[arg-type]
    if text:
        stdout, stderr = _decode(stdout), _decode(stderr)
    return subprocess.CompletedProcess(list(command), code, stdout, stderr)


class Grouped(NamedTuple):
    """What `run_in_session` gives: the exit status (negative: the signal), stdout and stderr
    together in the order they were written, and whether the timeout ended it."""

    returncode: int
    output: str
    timed_out: bool


def run_in_session(
    command: Sequence[str], *, cwd: Any, env: Mapping[str, str], timeout: float, spare: bool = True
) -> Grouped:
    """``Popen(command, stdout=PIPE, stderr=STDOUT, text=True, start_new_session=True)`` then
    ``communicate(timeout)``: past the timeout its process group is SIGKILLed and the rest of its
    output read; once it has ended the group is SIGKILLed again (a rank or worker it left behind).
    Forked from the zygote where `mirrored`, else exactly that ``Popen``. ``spare`` (unless `SPARE`
    is off): the child forks a spare that Lightning's DDP launcher starts rank 1 in
    (`tests.zygote_spare`), until then one more child of the command's process; False for a test
    that looks at the command's children."""

    def fresh() -> Grouped:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            output, _ = proc.communicate()
        _kill_group(proc.pid)
        return Grouped(proc.returncode, output, timed_out)

    done = _forked(command, cwd, env, timeout, True, group=True, spare=spare)
    if done is None:
        return fresh()
    code, (output,), timed_out = done
    return Grouped(code, _decode(output), timed_out)


def _forked(
    command: Sequence[str],
    cwd: Any,
    env: Mapping[str, str] | None,
    timeout: float | None,
    new_session: bool,
    group: bool,
    spare: bool = False,
) -> tuple[int, list[bytes], bool] | None:
    """`_fork`'s result, or None where the command runs fresh instead: another thread of this
    process is using the zygote, the command is not `mirrored`, or the zygote turned itself off
    before forking it."""
    if not _lock.acquire(blocking=False):
        return None
    try:
        return _fork(command, cwd, env, timeout, new_session, group, spare) if mirrored(command, cwd, env) else None
    finally:
        _lock.release()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _decode(data: bytes) -> str:
    """As ``subprocess.run(text=True)``: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _fork(
    command: Sequence[str],
    cwd: Any,
    env: Mapping[str, str] | None,
    timeout: float | None,
    new_session: bool,
    group: bool,
    spare: bool,
) -> tuple[int, list[bytes], bool] | None:
    """Fork ``command`` from the zygote (with a spare for rank 1 if ``spare`` and `SPARE` is on):
    (exit status, [stdout, stderr] or ``group``'s [output], timed out), or None when the zygote
    turned itself off. ``group``: stderr goes to stdout's pipe
    (one open file, as ``stderr=STDOUT``), the timeout SIGKILLs the process group (the child's own
    session) and reading goes on to the end of the output, and the group is SIGKILLed once the
    child has ended; else the timeout SIGKILLs the child and reading stops, as ``subprocess.run``."""
    request = {
        **_entry(command),  # type: ignore[dict-item]
        "cwd": os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd)),
        "env": dict(os.environ if env is None else env),
        "new_session": new_session,
        "ignored": [int(s) for s in signal.valid_signals() if _ignored(s)],
        "mask": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
        "spare": spare and _spare_on(env),
    }
    body = json.dumps(request).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect("\0" + _server["name"])
        except OSError as error:
            return _off(f"the zygote does not answer ({error})")
        pipes = [os.pipe()] if group else [os.pipe(), os.pipe()]
        writers = [w for _, w in pipes] * (2 if group else 1)
        chunks: dict[int, list[bytes]] = {r: [] for r, _ in pipes}
        try:
            socket.send_fds(conn, [struct.pack("!Q", len(body)) + body], [0, *writers])
        finally:
            for _, w in pipes:
                os.close(w)
        answers = conn.makefile("rb")
        first = json.loads(answers.readline() or b'{"off": "the zygote died"}')
        if "pid" not in first:
            for fd in chunks:
                os.close(fd)
            return _off(first["off"])
        pid, deadline, timed_out = first["pid"], None if timeout is None else time.monotonic() + timeout, False
        with selectors.DefaultSelector() as selector:
            for fd in chunks:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    timed_out, deadline = True, None
                    if not group:
                        with contextlib.suppress(ProcessLookupError):  # ended already: Popen.kill ignores it too
                            os.kill(pid, signal.SIGKILL)
                        break
                    _kill_group(pid)  # then read to the end, as communicate() after the kill
                    continue
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        for fd in chunks:
            os.close(fd)
        line = answers.readline()
    if not line:
        raise RuntimeError(f"the test zygote died while running {command!r}")
    if group:
        _kill_group(pid)  # a rank or worker the child left behind
    code = os.waitstatus_to_exitcode(json.loads(line)["status"])
    return code, [b"".join(c) for c in chunks.values()], timed_out


def _spare_on(env: Mapping[str, str] | None) -> bool:
    """`SPARE` from the command's environment where it has the variable, else from this process's."""
    return switched_on((env if env is not None and SPARE in env else os.environ).get(SPARE, "on"))


def switched_on(value: str) -> bool:
    """A switch variable's value: on unless ``off``, ``0``, ``false`` or ``no``."""
    return value.strip().lower() not in ("off", "0", "false", "no")


def _off(why: str) -> None:
    """Turn the zygote off for the rest of the session; the caller then runs its command fresh."""
    _server["off"] = why
    warnings.warn(f"test zygote off, CLI tests start fresh processes: {why}", stacklevel=4)
    stop()


def _ignored(sig: signal.Signals) -> bool:
    try:
        return signal.getsignal(sig) == signal.SIG_IGN
    except (OSError, ValueError):
        return False
