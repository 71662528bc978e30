"""The fork server forked from the training process (`lance_lightning.load.forked_server`, #51).

Each case runs a script in a process of its own, forked from the test zygote, which imported
Lightning but never opened a dataset, as a training script is when its data module's ``setup``
starts the server (the fork server is one per process, and in the test process Lance runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lance_lightning.checks import env_switch
from lance_lightning.load.forked_server import ENV_SWITCH, SERVER_NAME
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.race import CHOICE_SWITCH
from tests import zygote
from tests.helpers import write_dataset

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Before ``setup``: a socket pair and a pipe, Python handlers for SIGTERM and SIGUSR1.
#: Then a forced worker read.
_SERVED = """
import json, os, select, signal, socket, sys
from multiprocessing import forkserver
import lance_lightning as ll
from tests.worker_probe import ReportServer

signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGUSR1, lambda *_: None)
ours, peer = socket.socketpair()
read_end, write_end = os.pipe()
held = {os.fstat(fd).st_ino for fd in (ours.fileno(), write_end)}

dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=2,
                        transform=ReportServer())
dm.setup("fit")
server = forkserver._forkserver._forkserver_pid
ours.close()
os.close(write_end)
peer.settimeout(60)
pipe_ended = bool(select.select([read_end], [], [], 60)[0]) and os.read(read_end, 1) == b""
ends = {"socket": peer.recv(1) == b"", "pipe": pipe_ended}
server_holds = set()
for fd in os.listdir(f"/proc/{server}/fd"):
    try:
        server_holds.add(os.stat(f"/proc/{server}/fd/{fd}").st_ino)
    except OSError:
        pass
ids, reports = [], set()
for batch in dm.train_dataloader():
    ids += batch["id"].tolist()
    reports.add(batch["report"][0])
print(json.dumps({
    "ids": ids, "main": os.getpid(), "server": server, "ends": ends, "held_by_server": sorted(held & server_holds),
    "server_name": open(f"/proc/{server}/comm").read().strip(),
    "server_cmdline": open(f"/proc/{server}/cmdline").read().split("\\0")[:-1],
    "cmdline": open("/proc/self/cmdline").read().split("\\0")[:-1],
    "reports": [json.loads(r) for r in sorted(reports)],
}))
"""

#: An exit handler that appends the pid of the process running it to a file; a forked server
#: started, used and stopped as ``multiprocessing`` stops it (its liveness pipe closed, then waited for).
_STOPPED = """
import atexit, json, os, sys
from multiprocessing import forkserver, get_context
from lance_lightning.load.lean_start import ensure_server

atexit.register(lambda: open(sys.argv[1], "a").write(f"{os.getpid()}\\n"))
ensure_server()
server = forkserver._forkserver._forkserver_pid
child = get_context("forkserver").Process(target=os.getpid)
child.start()
child.join()
name = open(f"/proc/{server}/comm").read().strip()  # named before it served
forkserver._forkserver._stop()
print(json.dumps({"main": os.getpid(), "name": name, "gone": not os.path.exists(f"/proc/{server}"),
                  "child": child.exitcode}))
"""

#: Why the server is not forked, case by case, and which server starts then.
_REFUSED = """
import json, sys, time
import lance
from multiprocessing import forkserver
from lance_lightning.load import forked_server
from lance_lightning.load.lean_start import ensure_server

found = {"fresh": forked_server.ForkedServer().refusal()}
forked_server.MEMORY_LIMIT_BYTES = 1 << 20
found["memory"] = forked_server.ForkedServer().refusal()
forked_server.MEMORY_LIMIT_BYTES = 2 << 30
lance.dataset(sys.argv[1]).count_rows()
found["lance"] = forked_server.ForkedServer().refusal()
ensure_server()
pid = forkserver._forkserver._forkserver_pid
for _ in range(600):  # empty while the new process is between fork and exec
    found["server_cmdline"] = open(f"/proc/{pid}/cmdline").read()
    if found["server_cmdline"]:
        break
    time.sleep(0.1)
print(json.dumps(found))
"""


#: `_REFUSED` with the switch off and without Lance's runtime (nor a lowered memory limit): the
#: switch is then the only reason not to fork the server.
_SWITCHED = """
import json, sys, time
from multiprocessing import forkserver
from lance_lightning.load import forked_server
from lance_lightning.load.lean_start import ensure_server

found = {"switch": forked_server.ForkedServer().refusal(), "fresh": forked_server.ForkedServer().refusal()}
found["lance"] = "lance" in sys.modules
ensure_server()
pid = forkserver._forkserver._forkserver_pid
for _ in range(600):  # empty while the new process is between fork and exec
    found["server_cmdline"] = open(f"/proc/{pid}/cmdline").read()
    if found["server_cmdline"]:
        break
    time.sleep(0.1)
print(json.dumps(found))
"""


def _run(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    path = tmp_path / "script.py"
    path.write_text(script)
    full = {k: v for k, v in zygote.zygote_env().items() if k not in (CHOICE_SWITCH, HANDOFF, ENV_SWITCH)}
    full.update(env or {})
    proc = zygote.run([sys.executable, str(path), *args], cwd=REPO_ROOT, env=full, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
def test_workers_come_from_a_fork_of_the_trainer_that_keeps_none_of_its_connections_or_handlers(
    tmp_path: Path,
) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 60, fragment_rows=30)
    found = _run(tmp_path, _SERVED, uri, env={CHOICE_SWITCH: "workers", HANDOFF: "off"})
    assert found["ids"] == list(range(60)), "every row once, in order"
    assert found["server_name"] == SERVER_NAME and found["server_cmdline"] == found["cmdline"], "a fork of the trainer"
    reports = found["reports"]
    assert len(reports) == 2 and {r["pid"] for r in reports}.isdisjoint({found["main"]}), reports
    for report in reports:
        assert report["parent"] == found["server"] and report["inherited"], report
        assert report["sigterm"] == report["sigusr1"] == "default" and report["sigint"] == "KeyboardInterrupt", report
        assert report["locks_free"], "a lock held when the trainer forked the server stays held in its workers"
    assert found["ends"] == {"socket": True, "pipe": True}, "the server kept a copy of the trainer's connections"
    assert found["held_by_server"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
def test_the_stock_server_starts_where_forking_is_not_safe(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 20, fragment_rows=20)
    found = _run(tmp_path, _REFUSED, uri)
    assert found["fresh"] is None
    assert "MiB of private memory, more than 1 MiB" in found["memory"], found["memory"]
    assert "Lance's runtime runs in this process" in found["lance"], found["lance"]
    assert "multiprocessing.forkserver" in found["server_cmdline"], "the stock server, a fresh interpreter"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
def test_the_switch_starts_the_stock_server(tmp_path: Path) -> None:
    """In a process where nothing else refuses a fork (no Lance runtime, the memory limit as
    shipped): the switch alone refuses it, and the server `ensure_server` starts is the stock one."""
    found = _run(tmp_path, _SWITCHED, env={ENV_SWITCH: "off"})
    assert found["switch"] == f"{ENV_SWITCH}=off" and found["fresh"] == found["switch"]
    assert found["lance"] is False, "Lance ran here: it, not the switch, may have refused the fork"
    assert "multiprocessing.forkserver" in found["server_cmdline"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
def test_the_server_leaves_without_running_the_trainers_exit_handlers(tmp_path: Path) -> None:
    marker = tmp_path / "exit_handlers_ran_in.txt"
    found = _run(tmp_path, _STOPPED, str(marker))
    assert found["name"] == SERVER_NAME and found["child"] == 0 and found["gone"], found
    assert marker.read_text().split() == [str(found["main"])], "exit handlers ran outside the trainer"


#: A transform calling a function the script defines only below its ``fit``.
_DEFINED_LATER = """
import sys
import lance_lightning as ll

class Later:
    def __call__(self, batch):
        return helper(batch)

if __name__ == "__main__":
    dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=1,
                            transform=Later())
    dm.setup("fit")
    print("rows", sum(len(batch["id"]) for batch in dm.train_dataloader()))

def helper(batch):
    return batch
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forked server is Linux's")
@pytest.mark.parametrize("server", ["forked", "stock"])
def test_a_function_defined_below_fit_is_missing_only_in_a_forked_servers_workers(tmp_path: Path, server: str) -> None:
    """As docs/fork-safety.md says: the forked server holds the script as it was at ``setup``; the
    stock server's workers import the whole script (its guarded block aside)."""
    uri = write_dataset(tmp_path / "ds.lance", 20, fragment_rows=20)
    path = tmp_path / "script.py"
    path.write_text(_DEFINED_LATER)
    env = {k: v for k, v in zygote.zygote_env().items() if k not in (HANDOFF, ENV_SWITCH)}
    env.update({CHOICE_SWITCH: "workers", HANDOFF: "off", ENV_SWITCH: "on" if server == "forked" else "off"})
    proc = zygote.run([sys.executable, str(path), uri], cwd=REPO_ROOT, env=env, text=True, timeout=600)
    if server == "stock":
        assert proc.returncode == 0 and "rows 20" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode != 0 and "NameError: name 'helper' is not defined" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_switch_set_to_neither_on_nor_off_stops_setup_naming_it(tmp_path: Path, value: str) -> None:
    """Before training starts, in the training process: the variable, its value and the fix."""
    uri = write_dataset(tmp_path / "ds.lance", 20, fragment_rows=20)
    script = _SERVED.split("dm.setup", 1)[0] + 'dm.setup("fit")\n'
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {k: v for k, v in zygote.zygote_env().items() if k not in (CHOICE_SWITCH, HANDOFF)}
    env[ENV_SWITCH] = value
    proc = zygote.run([sys.executable, str(path), uri], cwd=REPO_ROOT, env=env, text=True, timeout=600)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("lance_lightning.errors.ConfigError: "), proc.stderr[-3000:]
    assert ENV_SWITCH in last and value in last and "must be on or off" in last, last


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("on", True), ("1", True), ("YES", True), ("off", False), (" 0 ", False)]
)
def test_env_switch_reads_on_and_off(monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv(ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(ENV_SWITCH, value)
    assert env_switch(ENV_SWITCH) is on


#: A process that started the stock server runs a script whose loader starts its workers itself
#: (the hand-over off: torch starts the fork server, not the package), as a notebook's
#: ``subprocess.run`` or a job script's second command would.
_STARTS_A_CHILD = """
import json, os, subprocess, sys
from lance_lightning.load.lean_start import PARENT_ENV, YIELD_ENV, ensure_server

CHILD = '''
import sys
import lance_lightning as ll
dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=2)
print(sum((batch["id"].tolist() for batch in dm.train_dataloader()), []))
'''

ensure_server()
env = {**os.environ, "LANCE_LIGHTNING_WORKER_HANDOFF": "off"}
child = subprocess.run([sys.executable, "-c", CHILD, sys.argv[1]], env=env, capture_output=True, text=True, timeout=300)
print(json.dumps({"left": {name: os.environ.get(name) for name in (PARENT_ENV, YIELD_ENV)},
                  "rc": child.returncode, "out": child.stdout.strip().splitlines()[-1:], "err": child.stderr[-3000:]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stock server's watch is tested on Linux")
def test_a_process_that_started_the_stock_server_leaves_its_subprocesses_able_to_start_workers(tmp_path: Path) -> None:
    """The variables that tell the stock server which process to die with are set only while it
    starts: a subprocess started later whose workers' server torch starts does not inherit the
    first process's pid, which made that server, whose parent differs, kill itself at once
    (``EOFError`` while the workers started; contract scenario 1285)."""
    uri = write_dataset(tmp_path / "ds.lance", 30, fragment_rows=10)
    found = _run(tmp_path, _STARTS_A_CHILD, uri, env={ENV_SWITCH: "off"})
    assert found["left"] == {"LANCE_LIGHTNING_FORKSERVER_PARENT": None, "LANCE_LIGHTNING_FORKSERVER_YIELD": None}
    assert found["rc"] == 0 and found["out"] == [str(list(range(30)))], found["err"]


#: A loader whose workers' fork server (the stock one, started by torch: the hand-over off) is told
#: to die with a process that is not its parent: it kills itself as it starts.
_SERVER_DIES = """
import json, os, sys
import lance_lightning as ll
from lance_lightning.errors import ConfigError

os.environ["LANCE_LIGHTNING_FORKSERVER_PARENT"] = str(os.getppid())
dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id"]), batch_size=10, num_workers=2)
try:
    next(iter(dm.train_dataloader()))
    error = None
except ConfigError as refused:
    error = str(refused)
del os.environ["LANCE_LIGHTNING_FORKSERVER_PARENT"]  # what killed it is gone: iterating again starts a new one
ids = [i for batch in dm.train_dataloader() for i in batch["id"].tolist()]
print(json.dumps({"error": error, "ids": ids}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stock server's watch is tested on Linux")
def test_a_fork_server_that_dies_as_the_workers_start_is_named_with_how_it_ended(tmp_path: Path) -> None:
    """Not the advice for a worker that fails as it starts (the script's main guard): the server's
    pid, how it ended, and that iterating again starts a new one (it does, once what killed it is gone)."""
    uri = write_dataset(tmp_path / "ds.lance", 30, fragment_rows=10)
    found = _run(tmp_path, _SERVER_DIES, uri, env={ENV_SWITCH: "off", HANDOFF: "off"})
    error = found["error"]
    assert error is not None and error.startswith("`num_workers`=2: the fork server that starts the workers (pid "), (
        error
    )
    assert "was killed by SIGKILL" in error and "before they started" in error and "iterate again" in error, error
    assert "__main__" not in error, "the advice for a script without a main guard"
    assert found["ids"] == list(range(30)), "iterating again did not start a new fork server"
