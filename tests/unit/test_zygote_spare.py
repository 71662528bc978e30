"""The DDP rank's spare (tests/zygote_spare.py): a 2-rank fit run by `zygote.run_in_session` starts
rank 1 in the spare (Lightning came imported) as what a fresh rank 1 is: the same process state,
environment, rank at import, output, and a handle on it that gives its pid and exit status; a launch
the zygote could not mirror starts fresh; the spare holds none of the child's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import zygote

pytestmark = pytest.mark.skipif(
    os.environ.get(zygote.SWITCH, "on").strip().lower() == "off", reason=f"{zygote.SWITCH}=off: no zygote to check"
)

PROBE = str(Path(zygote.__file__).with_name("zygote_probe.py"))
#: The signals faulthandler handles (`tests.unit.test_zygote`: None in a fresh interpreter, SIG_DFL in a forked one).
FAULTHANDLER_SIGNALS = [
    str(int(s)) for s in (signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL)
]
#: Variables Lightning's and torch's imports set in ``os.environ``.
SET_BY_IMPORTS = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR")


def _ddp(out: Path, forked: bool) -> tuple[int, str, list[dict]]:
    """The probe's 2-rank fit in its own session, from the zygote or fresh: (status, output, records by rank)."""
    out.mkdir()
    command, env = [sys.executable, PROBE, "ddp", str(out)], {**zygote.zygote_env(), zygote.SPARE: "on"}
    if forked:
        assert zygote.mirrored(command, out, env), "the zygote would not take this command"
        done = zygote.run_in_session(command, cwd=out, env=env, timeout=300)
        status, output = done.returncode, done.output
    else:
        fresh = subprocess.run(
            command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, timeout=300,
        )  # fmt: skip
        status, output = fresh.returncode, fresh.stdout
    assert status == 0, output[-4000:]
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    return status, output, records


def _lines(output: str, out: Path) -> list[str]:
    """The output's lines in order of text (the ranks print at once), the run's folder masked."""
    return sorted(line.replace(str(out), "OUT") for line in output.splitlines())


def test_a_ddp_fit_s_rank_one_starts_in_the_spare_as_a_fresh_rank_starts(tmp_path: Path) -> None:
    _, forked_output, forked = _ddp(tmp_path / "forked", forked=True)
    _, fresh_output, fresh = _ddp(tmp_path / "fresh", forked=False)
    assert [r["early"] for r in forked] == [True, True], "rank 1 did not start in the spare"
    assert [r["early"] for r in fresh] == [False, False]
    for records in (forked, fresh):
        rank0, rank1 = records
        assert rank0["rank1"] == {"pid": rank1["pid"], "status": 0}, "the launcher's handle is not rank 1's"
        assert rank1["state"].pop("ppid") == rank0["pid"], "rank 1 is not the launcher's child"
        rank0["state"].pop("ppid")  # the zygote, or this process
        for record in records:
            for key in ("early", "pid", "rank1"):
                record.pop(key, None)
            if record["state"]["faulthandler"]:
                for sig in FAULTHANDLER_SIGNALS:
                    record["state"]["signals"].pop(sig)
            record["state"]["argv"][-1] = record["state"]["orig_argv"][-1] = record["state"]["cwd"] = "OUT"
    assert [r["rank_at_import"] for r in fresh] == [[0, 0], [1, 1]]
    assert forked == fresh
    assert _lines(forked_output, tmp_path / "forked") == _lines(fresh_output, tmp_path / "fresh")


#: Rank 0 launches rank 1 through Lightning's launcher ``Popen``; rank 1 prints the variables NAMES.
ENV_PROBE = """
import json, os, sys
import lightning.pytorch
if os.environ.get("LOCAL_RANK") == "1":
    print(json.dumps({name: os.environ.get(name) for name in NAMES}))
else:
    from lightning.pytorch.strategies.launchers import subprocess_script
    env = {**os.environ, "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert subprocess_script.subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env).wait() == 0
"""


def test_the_launcher_s_environment_reaches_rank_one_as_a_fresh_rank_s(tmp_path: Path) -> None:
    # What the zygote's imports set in os.environ, seen by each rank after its own imports, and the
    # launcher's own variables; the spare's rank against a fresh one.
    script = tmp_path / "env_probe.py"
    script.write_text(ENV_PROBE.replace("NAMES", repr([*SET_BY_IMPORTS, "LOCAL_RANK", "WORLD_SIZE"])))
    command, env = [sys.executable, str(script)], {**zygote.zygote_env(), zygote.SPARE: "on"}
    forked = zygote.run_in_session(command, cwd=tmp_path, env=env, timeout=300)
    fresh = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert (forked.returncode, fresh.returncode) == (0, 0), forked.output[-3000:] + fresh.stderr[-3000:]
    seen = json.loads(forked.output.strip().splitlines()[-1])
    assert seen == json.loads(fresh.stdout.strip().splitlines()[-1])
    assert seen["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1" and seen["LOCAL_RANK"] == "1"


def test_a_launch_the_zygote_cannot_mirror_starts_fresh_and_the_spare_serves_once(tmp_path: Path) -> None:
    # `launch`: OMP_NUM_THREADS changed (read at import), then only the launcher's variables, then again.
    env = {**zygote.zygote_env(), zygote.SPARE: "on"}  # whatever this process's switch says
    done = zygote.run_in_session([sys.executable, PROBE, "launch"], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.output[-4000:]
    children = [json.loads(line) for line in done.output.splitlines() if line.startswith("{")]
    assert [child["early"] for child in children] == [False, True, False]
    assert len({child["ppid"] for child in children}) == 1, "a launch that is not the launcher's child"


@pytest.mark.parametrize("switch", ["on", "off"])
def test_the_spare_holds_none_of_the_output_and_shares_the_child_s_group(tmp_path: Path, switch: str) -> None:
    env = {**zygote.zygote_env(), zygote.SPARE: switch}
    done = zygote.run_in_session([sys.executable, PROBE, "spare"], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.output[-4000:]
    spare = json.loads(done.output)
    assert spare == (None if switch == "off" else {"fds": ["/dev/null"] * 3, "session": True, "group": True})


#: A process that forks a spare and never launches it: ``close`` closes its end and reports how the
#: spare ended; ``exit`` ends at once; ``held`` ends while a child of it holds its end open.
UNUSED = """
import os, sys, time
from tests import zygote_spare
assert zygote_spare.split() is None
spare = zygote_spare.SparePopen.spare
print(spare.pid, flush=True)
if sys.argv[1] == "close":
    spare._channel.close()
    print(os.waitstatus_to_exitcode(os.waitpid(spare.pid, 0)[1]), flush=True)
elif sys.argv[1] == "held" and os.fork() == 0:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1), os.dup2(null, 2)
    time.sleep(600)
os._exit(0)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", ["close", "exit", "held"])
def test_a_spare_never_launched_ends_with_its_launcher(tmp_path: Path, how: str) -> None:
    script = tmp_path / "unused.py"
    script.write_text(UNUSED)
    env = zygote.zygote_env()
    done = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.split()
    if how == "close":
        assert said[1] == "0", "the spare did not end by itself at the end of its socket"
        return
    deadline = time.monotonic() + 60
    try:
        while not _gone(int(said[0])):  # ended with its parent (held: by PR_SET_PDEATHSIG alone)
            assert time.monotonic() < deadline, "the spare outlived its launcher by 60 s"
            time.sleep(0.1)
    finally:
        for process in psutil.process_iter(["cmdline"]):
            if process.info["cmdline"] == [sys.executable, str(script), how]:
                process.kill()
