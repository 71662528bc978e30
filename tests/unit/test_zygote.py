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
from pathlib import Path

import pytest

from tests import zygote
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


@pytest.mark.parametrize("new_session", [False, True])
@pytest.mark.parametrize("as_module", [True, False], ids=["module", "script"])
def test_the_child_starts_as_a_fresh_interpreter(tmp_path: Path, as_module: bool, new_session: bool) -> None:
    entry = ["-m", "tests.zygote_probe"] if as_module else [PROBE]
    command, env = [sys.executable, *entry, "state"], {**zygote.zygote_env(), "ZYGOTE_PROBE": "seen"}
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
    assert forked == fresh


def test_a_variable_read_at_import_sends_the_command_to_a_fresh_process(tmp_path: Path) -> None:
    command, env = (
        [sys.executable, "-m", "tests.zygote_probe", "state"],
        {**zygote.zygote_env(), "OMP_NUM_THREADS": "7"},
    )
    assert zygote.mirrored(command, tmp_path, zygote.zygote_env())
    assert not zygote.mirrored(command, tmp_path, env)
    state = json.loads(zygote.run(command, cwd=tmp_path, env=env).stdout)
    assert state["ppid"] == os.getpid()


def test_a_timeout_kills_the_child_as_subprocess_does(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "pass"]  # not mirrored: only the shape of the API
    assert not zygote.mirrored(command, tmp_path, zygote.zygote_env())
    (tmp_path / "sleep.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    script = [sys.executable, str(tmp_path / "sleep.py")]
    assert zygote.mirrored(script, tmp_path, zygote.zygote_env())
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        zygote.run(script, cwd=tmp_path, env=zygote.zygote_env(), timeout=30)
    assert raised.value.output == b"started\n"
