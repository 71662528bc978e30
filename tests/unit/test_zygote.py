"""The test zygote (tests/zygote.py) gives what a fresh process gives: for each command, the
exit status, stdout and stderr of `zygote.run` equal those of ``subprocess.run`` of the same
command, and the zygote's child is the command's own process (its parent is the zygote; a command
the zygote cannot mirror runs in a fresh process whose parent is this one)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests import zygote, zygote_server
from tests.helpers import write_dataset
from tests.reliability.helpers import write_config

pytestmark = pytest.mark.skipif(
    os.environ.get(zygote.SWITCH, "on").strip().lower() == "off", reason=f"{zygote.SWITCH}=off: no zygote to check"
)

CLI = str(Path(sys.executable).with_name("lance-lightning"))
HOLD_TAG = re.compile(rb"lance-lightning-\d{8}-\d{6}-[0-9a-f]+")
PROBE = str(Path(zygote.__file__).with_name("zygote_probe.py"))


def _both(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[tuple, tuple]:
    """(status, stdout, stderr) from the zygote and from a fresh process; the zygote must take it."""
    env = {**zygote.zygote_env(), **(env or {})}
    assert zygote.mirrored(command, cwd, env), "the zygote would not take this command"
    forked = zygote.run(command, cwd=cwd, env=env, timeout=600)
    fresh = subprocess.run(command, cwd=cwd, env=env, capture_output=True, timeout=600)
    return (forked.returncode, forked.stdout, forked.stderr), (fresh.returncode, fresh.stdout, fresh.stderr)


def _fit_config(root: Path, uri: str, data: str = "") -> Path:
    root.mkdir()
    return write_config(root, f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 10\n{data}")


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("zygote") / "ds.lance", 40)


@pytest.mark.parametrize(
    ("data", "status"),
    [("", 0), ("  num_workers: -1\n", 1), ("  no_such_parameter: 1\n", 2)],
    ids=["fit", "config error", "parser error"],
)
def test_a_fit_gives_what_a_fresh_process_gives(tmp_path: Path, uri: str, data: str, status: int) -> None:
    # Each run in its own folder, its cwd (checkpoints are written there); the folder's name and the
    # version hold's tag (a time and a random suffix) are masked.
    done = []
    for name, run in (("a", zygote.run), ("b", subprocess.run)):
        root, env = tmp_path / name, zygote.zygote_env()
        command = [CLI, "fit", "--config", str(_fit_config(root, uri, data))]
        assert zygote.mirrored(command, root, env)
        extra = {} if run is zygote.run else {"capture_output": True}
        result = run(command, cwd=root, env=env, timeout=600, **extra)
        outputs = (HOLD_TAG.sub(b"<tag>", o.replace(bytes(root), b"<root>")) for o in (result.stdout, result.stderr))
        done.append((result.returncode, *outputs))
    assert done[0] == done[1]
    assert done[0][0] == status, done[0][2].decode()[-2000:]
    if status == 0:
        assert list((tmp_path / "a" / "root").rglob("*.ckpt")), "the forked fit saved no checkpoint"


@pytest.mark.parametrize(
    "args", [["prepare", "--help"], ["fit", "--nope"], ["prepare", "--source", "x"]], ids=["help", "usage", "bad"]
)
def test_the_module_entry_point_gives_what_a_fresh_process_gives(tmp_path: Path, args: list[str]) -> None:
    forked, fresh = _both([sys.executable, "-m", "lance_lightning.cli", *args], tmp_path)
    assert forked == fresh
    assert forked[1] or forked[2]


@pytest.mark.parametrize("as_module", [True, False], ids=["module", "script"])
@pytest.mark.parametrize(
    "what",
    [["raise"], ["exit", "3"], ["exit", "0"], ["exit-text"], ["interrupt"], ["kill"], ["atexit"]],
    ids=lambda w: "-".join(w),
)
def test_each_way_of_ending_gives_what_a_fresh_process_gives(tmp_path: Path, as_module: bool, what: list[str]) -> None:
    entry = ["-m", "tests.zygote_probe"] if as_module else [PROBE]
    forked, fresh = _both([sys.executable, *entry, *what], tmp_path)
    assert forked == fresh
    expected = {"raise": 1, "exit-text": 1, "interrupt": -signal.SIGINT, "kill": -signal.SIGKILL, "atexit": 0}
    assert forked[0] == (int(what[1]) if what[0] == "exit" else expected[what[0]])


def _script(tmp_path: Path, code: str) -> list[str]:
    (tmp_path / "script.py").write_text(code)
    return [sys.executable, str(tmp_path / "script.py")]


#: Scripts that end each way the interpreter gives an exit status for, and that status. The
#: zygote's child leaves by ``os._exit`` after its atexit handlers (`zygote_server.FAST_EXIT`).
ENDINGS = {
    "end": ("import sys\nsys.stdout.write('unflushed')\nsys.stderr.write('no newline')\n", 0),
    "exit-none": ("import sys\nsys.exit()\n", 0),
    "exit-int": ("import sys\nsys.exit(3)\n", 3),
    "exit-past-a-byte": ("import sys\nsys.exit(259)\n", 3),
    "exit-negative": ("import sys\nsys.exit(-2)\n", 254),
    "exit-past-a-long": ("import sys\nsys.exit(2**70)\n", 255),
    "exit-bool": ("import sys\nsys.exit(True)\n", 1),
    "exit-text": ("import sys\nprint('out', end='')\nsys.exit('the message')\n", 1),
    "exit-object": ("import sys\nsys.exit(3.5)\n", 1),
    "exit-subclass": ("class Stop(SystemExit):\n    pass\n\nraise Stop(4)\n", 4),
    "exit-in-atexit": ("import atexit, sys\natexit.register(sys.exit, 5)\nsys.exit(2)\n", 2),
    "raise": ("raise ValueError('raised')\n", 1),
    "stdout-flush-fails": ("import sys\nsys.stdout = open('/dev/full', 'w')\nprint('lost')\nsys.exit(3)\n", 120),
}


@pytest.mark.parametrize(("code", "status"), ENDINGS.values(), ids=list(ENDINGS))
def test_the_fast_exit_gives_the_status_and_output_a_fresh_process_gives(
    tmp_path: Path, code: str, status: int
) -> None:
    forked, fresh = _both(_script(tmp_path, code), tmp_path)
    assert forked == fresh
    assert forked[0] == status, forked[2].decode()


def test_a_file_left_open_in_a_global_is_written_as_a_fresh_process_writes_it(tmp_path: Path) -> None:
    # Buffered text and binary files, never flushed nor closed: a fresh process writes them at teardown.
    command = _script(
        tmp_path,
        "text = open('text.txt', 'w')\ntext.write('x' * 100_000 + 'end')\n"
        "data = open('data.bin', 'wb')\ndata.write(b'y' * 10 + b'end')\n",
    )
    env = zygote.zygote_env()
    assert zygote.mirrored(command, tmp_path, env)
    written = []
    for forked in (True, False):
        done = (
            zygote.run(command, cwd=tmp_path, env=env)
            if forked
            else subprocess.run(command, cwd=tmp_path, env=env, capture_output=True)
        )
        files = [(tmp_path / name).read_bytes() for name in ("text.txt", "data.bin")]
        written.append((done.returncode, done.stdout, done.stderr, files))
    assert written[0] == written[1] == (0, b"", b"", [b"x" * 100_000 + b"end", b"y" * 10 + b"end"])


#: Cyclic garbage left at exit: finalization collects it, so its ``__del__`` prints (what it prints
#: to a buffered stdout comes last) and, as it raises, is reported ("Exception ignored in").
CYCLE = """import sys
class Cycle:
    def __del__(self):
        print('collected', file=sys.stderr)
        print('stdout of __del__')
        raise RuntimeError('raised in __del__')
cycle = Cycle()
cycle.me = cycle
del cycle
print('main done')
"""


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_cyclic_garbage_at_exit_is_collected_as_in_a_fresh_process(tmp_path: Path, unbuffered: bool) -> None:
    command, env = _script(tmp_path, CYCLE), _session_env(unbuffered)
    assert zygote.mirrored(command, tmp_path, env)
    forked = zygote.run_in_session(command, cwd=tmp_path, env=env, timeout=600)
    fresh = _fresh_session(command, tmp_path, env, 600)
    assert forked._replace(output=_masked(forked.output)) == fresh._replace(output=_masked(fresh.output))
    lines = fresh.output.splitlines()
    assert lines[:2] == ["main done", "collected"], fresh.output
    assert lines.index("stdout of __del__") == (2 if unbuffered else len(lines) - 1), fresh.output
    assert "RuntimeError: raised in __del__" in lines


def _masked(output: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", output)


def test_the_c_library_s_buffered_stdout_is_flushed_as_exit_flushes_it(tmp_path: Path) -> None:
    # A buffer of its own (never freed) makes C's stdout fully buffered whatever the zygote's
    # PYTHONUNBUFFERED made it: only exit()'s flush writes it.
    command = _script(
        tmp_path,
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
        "stdout = ctypes.c_void_p.in_dll(libc, 'stdout')\n"
        "assert libc.setvbuf(stdout, ctypes.c_void_p(libc.malloc(4096)), 0, 4096) == 0\n"
        "libc.printf(b'from C')\n",
    )
    forked, fresh = _both(command, tmp_path)
    assert forked == fresh == (0, b"from C", b"")


def test_with_the_fast_exit_off_module_teardown_runs_as_in_a_fresh_process(tmp_path: Path) -> None:
    # Module teardown's __del__ of an object a module global holds: not mirrored by the fast exit.
    command = _script(
        tmp_path,
        "import sys\nclass Held:\n    def __del__(self):\n        print('torn down', file=sys.stderr)\nheld = Held()\n",
    )
    off, fresh = _both(command, tmp_path, {zygote_server.FAST_EXIT: "off"})
    assert off == fresh == (0, b"", b"torn down\n")
    # The fresh process ignores the switch: `fresh` above is its run with the switch on too.
    env = {**zygote.zygote_env(), zygote_server.FAST_EXIT: "on"}
    assert zygote.mirrored(command, tmp_path, env)
    on = zygote.run(command, cwd=tmp_path, env=env, timeout=600)
    assert (on.returncode, on.stdout, on.stderr) == (0, b"", b"")


#: The signals faulthandler handles: with it on, ``signal.getsignal`` gives None for them in a fresh
#: interpreter and SIG_DFL in the zygote's child (not mirrored, `tests.zygote`).
FAULTHANDLER_SIGNALS = [
    str(int(s)) for s in (signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL)
]


@pytest.mark.parametrize("start_up", ["zygote's", "phase's"])
@pytest.mark.parametrize("new_session", [False, True])
@pytest.mark.parametrize("as_module", [True, False], ids=["module", "script"])
def test_the_child_starts_as_a_fresh_interpreter(
    tmp_path: Path, as_module: bool, new_session: bool, start_up: str
) -> None:
    # "phase's": the start-up variables of a contract phase, each but PYTHONFAULTHANDLER the other
    # way from the zygote's own (PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE, PYTHONPYCACHEPREFIX).
    entry = ["-m", "tests.zygote_probe"] if as_module else [PROBE]
    env = {**zygote.zygote_env(), "ZYGOTE_PROBE": "seen"}
    if start_up == "phase's":
        env = {**_session_env(not env.get("PYTHONUNBUFFERED")), "ZYGOTE_PROBE": "seen"}
        if not zygote.zygote_env().get("PYTHONDONTWRITEBYTECODE"):
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    command = [sys.executable, *entry, "state"]
    assert zygote.mirrored(command, tmp_path, env)
    forked = json.loads(zygote.run(command, cwd=tmp_path, env=env, start_new_session=new_session).stdout)
    fresh = json.loads(
        subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, start_new_session=new_session).stdout
    )
    assert forked["variable"] == "seen"
    assert forked["cwd"] == str(tmp_path)
    assert forked["own_session"] is new_session
    assert forked.pop("ppid") != os.getpid(), "not forked from the zygote"
    assert fresh.pop("ppid") == os.getpid()
    if fresh["faulthandler"]:
        for sig in FAULTHANDLER_SIGNALS:
            assert (forked["signals"].pop(sig), fresh["signals"].pop(sig)) == ("0", "None")
    assert forked == fresh
    assert fresh["faulthandler"] is (start_up == "phase's")


def test_a_variable_read_at_import_sends_the_command_to_a_fresh_process(tmp_path: Path) -> None:
    command, env = (
        [sys.executable, "-m", "tests.zygote_probe", "state"],
        {**zygote.zygote_env(), "OMP_NUM_THREADS": "7"},
    )
    assert zygote.mirrored(command, tmp_path, zygote.zygote_env())
    assert not zygote.mirrored(command, tmp_path, env)
    state = json.loads(zygote.run(command, cwd=tmp_path, env=env).stdout)
    assert state["ppid"] == os.getpid()


def test_a_variable_read_when_used_keeps_the_command_in_the_zygote(tmp_path: Path) -> None:
    """``PYTHONBREAKPOINT`` is read by ``breakpoint()`` from ``os.environ`` when called (``ray.init``
    sets it in its process for good, and every later command of that pytest worker ran fresh): a
    request with another value is still forked, and its child reads the request's value."""
    script = tmp_path / "hook.py"
    script.write_text("import os\nprint(os.environ.get('PYTHONBREAKPOINT'))\n")
    command = [sys.executable, str(script)]
    env = {**zygote.zygote_env(), "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace"}
    assert zygote.mirrored(command, tmp_path, env)
    done = zygote.run(command, cwd=tmp_path, env=env, text=True, timeout=120)
    assert done.stdout == "ray.util.rpdb._driver_set_trace\n", done.stdout + done.stderr


def test_a_timeout_kills_the_child_as_subprocess_does(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "pass"]  # not mirrored: only the shape of the API
    assert not zygote.mirrored(command, tmp_path, zygote.zygote_env())
    (tmp_path / "sleep.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    script = [sys.executable, str(tmp_path / "sleep.py")]
    assert zygote.mirrored(script, tmp_path, zygote.zygote_env())
    # The timeout always runs out (the child sleeps 10 minutes), so no load makes this pass wrongly:
    # the TimeoutExpired is certain, and "started" is the one line the child prints before sleeping.
    # 3 s (was 10) is what a forked child (no imports, from the zygote `mirrored` started above) has
    # to print that line: it printed within 1 s each time at a load of 6 on the 2-core VM (it does
    # not wait for its exit, whose gc took up to 2.8 s there).
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        zygote.run(script, cwd=tmp_path, env=zygote.zygote_env(), timeout=3)
    assert raised.value.output == b"started\n"


def test_a_timeout_after_the_child_ended_while_a_grandchild_holds_its_output(tmp_path: Path) -> None:
    """The child exits at once, leaving a grandchild that holds its stdout: ``subprocess.run``
    waits for the end of the output and raises ``TimeoutExpired``; so does the zygote (it raised
    ``ProcessLookupError`` killing the child that had already ended). The grandchild prints
    "orphaned" once the child has ended (its parent is no longer the child): that line in the
    output read before the timeout shows the child had ended by then, in both runs."""
    (tmp_path / "orphan.py").write_text(
        "import os, sys, time\n"
        "while os.getppid() == int(sys.argv[1]):\n    time.sleep(0.01)\n"
        "print('orphaned', flush=True)\ntime.sleep(60)\n"
    )
    (tmp_path / "leave.py").write_text(
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, 'orphan.py', str(os.getpid())])\n"
        "print('left', flush=True)\n"
    )
    script = [sys.executable, str(tmp_path / "leave.py")]
    assert zygote.mirrored(script, tmp_path, zygote.zygote_env())
    # The fresh reference runs on a thread while the zygote runs the same command: both wait out
    # their 8 s at once (only this thread uses the zygote, so it still forks). No load makes this
    # pass wrongly: "orphaned" in both outputs shows each child had ended before its timeout (else
    # the zygote's kill would find it alive, and the defect would not show). Not shorter: the
    # forked child's exit (the fast exit's gc, `tests.zygote_server`) took up to 2.8 s at a load of
    # 6 on the 2-core VM.
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(
            subprocess.run, script, cwd=tmp_path, env=zygote.zygote_env(), timeout=8, capture_output=True
        )
        with pytest.raises(subprocess.TimeoutExpired) as forked:
            zygote.run(script, cwd=tmp_path, env=zygote.zygote_env(), timeout=8)
        fresh = reference.exception()
    assert isinstance(fresh, subprocess.TimeoutExpired), fresh
    assert forked.value.output == fresh.output == b"left\norphaned\n"


# -- run_in_session: the contract checker's phases (tests/contract/runner.py) ----------------------
def _session_env(unbuffered: bool, faulthandler: bool = True) -> dict[str, str]:
    """The zygote's environment with the start-up variables the zygote applies in the child
    (`zygote.APPLIED`) set as given: a contract phase's (tests.contract.runner._env) or not."""
    env = {k: v for k, v in zygote.zygote_env().items() if k not in zygote.APPLIED}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    if faulthandler:
        env["PYTHONFAULTHANDLER"] = "1"
    return env


def _fresh_session(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> zygote.Grouped:
    """The reference: ``Popen(stdout=PIPE, stderr=STDOUT, start_new_session=True)``, its process
    group SIGKILLed past the timeout and after the end (the contract runner's code before the zygote)."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return zygote.Grouped(proc.returncode, output, timed_out)


def _sessions(
    what: list[str], cwd: Path, env: dict[str, str], timeout: float = 600, at_once: bool = False
) -> list[zygote.Grouped]:
    """`zygote.run_in_session` of the probe (the zygote must take it), then the fresh reference;
    ``at_once``: the reference runs on a thread meanwhile (for commands that wait out a timeout)."""
    command = [sys.executable, PROBE, *what]
    assert zygote.mirrored(command, cwd, env), "the zygote would not take this command"
    if not at_once:
        return [
            zygote.run_in_session(command, cwd=cwd, env=env, timeout=timeout),
            _fresh_session(command, cwd, env, timeout),
        ]
    with ThreadPoolExecutor(1) as pool:
        reference: Future[zygote.Grouped] = pool.submit(_fresh_session, command, cwd, env, timeout)
        forked = zygote.run_in_session(command, cwd=cwd, env=env, timeout=timeout)
        return [forked, reference.result()]


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_merged_output_comes_in_the_order_a_fresh_process_gives(tmp_path: Path, unbuffered: bool) -> None:
    # One pipe for both streams: the order is the order the child's streams reached it, which
    # PYTHONUNBUFFERED decides (buffered: stderr by line, stdout at exit); one of the two values
    # differs from the zygote's own.
    forked, fresh = _sessions(["interleave"], tmp_path, _session_env(unbuffered))
    assert forked == fresh
    lines = fresh.output.splitlines()
    assert lines == (
        ["out 0", "err 0", "out 1", "err 1", "out 2", "err 2", "no newline"]
        if unbuffered
        else ["err 0", "err 1", "err 2", "out 0", "out 1", "out 2", "no newline"]
    )


@pytest.mark.parametrize("what", ["kill", "term"])
def test_death_by_a_signal_gives_the_status_a_fresh_process_gives(tmp_path: Path, what: str) -> None:
    forked, fresh = _sessions([what], tmp_path, _session_env(True))
    assert forked == fresh
    assert forked.returncode == -(signal.SIGKILL if what == "kill" else signal.SIGTERM)
    assert forked.output == "partial"


def _report(output: str) -> str:
    """A faulthandler report less what is the zygote's own (`tests.zygote`): its frames below the
    entry point, its extension modules; thread ids masked."""
    lines = [
        line
        for line in output.splitlines()
        if "zygote_server.py" not in line and "<frozen runpy>" not in line and not line.startswith("Extension modules:")
    ]
    return re.sub(r"0x[0-9a-f]+", "0x?", "\n".join(lines)).rstrip("\n")


@pytest.mark.parametrize("faulthandler", [True, False], ids=["PYTHONFAULTHANDLER", "without"])
def test_a_crash_prints_what_a_fresh_process_prints(tmp_path: Path, faulthandler: bool) -> None:
    forked, fresh = _sessions(["segv"], tmp_path, _session_env(True, faulthandler))
    assert (forked.returncode, forked.timed_out) == (fresh.returncode, fresh.timed_out) == (-signal.SIGSEGV, False)
    assert _report(forked.output) == _report(fresh.output)
    assert ("Fatal Python error: Segmentation fault" in forked.output) is faulthandler
    if faulthandler:
        assert re.search(r'File ".*zygote_probe.py", line \d+ in main', forked.output), forked.output


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie) within a minute."""
    try:
        psutil.Process(pid).wait(60)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


def test_a_grandchild_left_behind_is_killed_with_the_group(tmp_path: Path) -> None:
    # The child starts a grandchild in its group (its output closed, sleeping 10 minutes) and exits.
    grandchildren = []
    try:
        for done in _sessions(["group", "closed", "600"], tmp_path, _session_env(True)):
            assert (done.returncode, done.timed_out) == (0, False), done.output
            grandchildren.append(int(done.output))
            assert _ended(grandchildren[-1]), "the grandchild outlived its session"
    finally:
        for pid in grandchildren:
            if not _ended(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_timeout_kills_the_whole_group_and_reads_to_the_end(tmp_path: Path) -> None:
    # The child and a grandchild (as a DDP rank) hold the output past the timeout; the grandchild
    # would print after 60 s: killing only the child would leave the output open until then.
    # The timeout always runs out (the child sleeps 10 minutes). No load makes this pass wrongly:
    # the output must be the grandchild's pid alone, which the child prints once Popen has started
    # it (exec'd, holding the output), so the grandchild was there to be killed in both runs. 4 s
    # (was 10) is what each run has to print it: a fresh child did in 0.08 s at a load of 6 on the
    # 2-core VM (a bare interpreter, no heavy imports), a forked one within 1 s.
    for done in _sessions(["group", "hold", "60", "hang"], tmp_path, _session_env(True), timeout=4, at_once=True):
        assert (done.returncode, done.timed_out) == (-signal.SIGKILL, True), done.output
        assert re.fullmatch(r"\d+\n", done.output), done.output
        assert "grandchild done" not in done.output
