"""Issue #50, "one screen, never a hang": ``lance-lightning prepare`` in a subprocess, on inputs and
faults that used to hang it or end it with a long traceback.

- FIFOs, sockets, dangling symbolic links, link loops and names that are not UTF-8 in the input are
  skipped and listed (never opened: a FIFO used to block the prepare forever), or named in a
  few lines with ``--on-bad-file error``;
- a Parquet column Lance reserves (``_rowaddr``, ``_rowid``) is a few lines naming it and the file,
  before anything is written;
- a full disk (a small tmpfs), a file-size limit (``RLIMIT_FSIZE``: ``EFBIG``), Ctrl-C (SIGINT
  once a unit is committed) and a SIGKILLed ``--pool processes`` worker each end with a few lines
  and a non-zero status; the rerun of the same command then equals the input (the oracle: the
  files' bytes), row for row.

Every case counts the lines of stderr (``--quiet``: no progress bar) against the project's
one-screen bound and checks no traceback is printed.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import sigint_as_at_a_terminal
from tests.reliability.helpers import ONE_SCREEN_LINES
from tests.unit.write.inputs import image_bytes
from tests.unit.write.test_prepare_blobs import class_folder

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "LANCE_LIGHTNING_TRACEBACK"}
    return {**env, "PYTHONPATH": str(REPO_ROOT), **extra}


def _prepare(args: list[str], *, moment: str | None = None, **popen: object) -> subprocess.CompletedProcess:
    """``lance-lightning prepare ARGS --quiet`` (through `KILLER` at ``moment`` when given)."""
    head = (
        [sys.executable, str(KILLER), moment, "cli"]
        if moment
        else [sys.executable, "-m", "lance_lightning.cli", "prepare"]
    )
    command = [*head, *args, "--quiet"]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, **popen)


def _one_screen(run: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """Assert the exit status, no traceback and a stderr of one screen holding ``fragments``."""
    assert run.returncode == code, f"exit {run.returncode}:\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) <= ONE_SCREEN_LINES, run.stderr
    for fragment in fragments:
        assert fragment in run.stderr, f"{fragment!r} not in:\n{run.stderr}"
    return run.stderr


def _videos(root: Path, size: int = 3000) -> tuple[list[str], list[dict]]:
    """A videofolder input of 12 files and its oracle rows; the prepare's arguments for ``out``."""
    rows = class_folder(root, ".mp4", classes=2, per_class=6, size=size)
    expected = [
        {"id": r["id"], "video": r["blob"], "label": r["label"], "label_name": r["label_name"], "path": r["path"]}
        for r in rows
    ]
    args = ["--format", "videofolder", "--input", str(root), "--unit-files", "1", "--workers", "1"]
    return ["--no-probe-media", *args], expected  # fake bytes: not opened as media


def _read_back(out: Path) -> list[dict]:
    return lance.dataset(str(out)).to_table(blob_handling="all_binary").to_pylist()


# -- entries that are not regular files -------------------------------------------------------
def _odd_input(root: Path) -> set[str]:
    """Three good images beside a FIFO, a socket, a dangling link, a link loop and a non-UTF-8
    name; the (escaped) paths of the odd ones."""
    folder = root / "cat"
    folder.mkdir(parents=True)
    for n in range(3):
        (folder / f"ok{n}.png").write_bytes(image_bytes(n))
    os.mkfifo(folder / "x.jpg")
    (folder / "dangling.png").symlink_to("nowhere.png")
    (folder / "loop.png").symlink_to("loop.png")
    with open(os.fsencode(folder) + b"/bad\xff.png", "wb") as handle:
        handle.write(image_bytes(9))
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "sock.png"))
    server.close()
    return {"cat/x.jpg", "cat/dangling.png", "cat/loop.png", "cat/bad\\xff.png", "cat/sock.png"}


def test_fifos_sockets_links_and_non_utf8_names_are_skipped_and_listed(tmp_path: Path) -> None:
    odd = _odd_input(tmp_path / "in")
    args = ["--format", "imagefolder", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out.lance")]
    run = subprocess.run(
        [sys.executable, "-m", "lance_lightning.cli", "prepare", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,  # a FIFO opened for reading would block forever: this bound is "never a hang"
    )
    assert run.returncode == 0 and "3 rows in 1 unit" in run.stdout and "5 files skipped" in run.stdout, run.stderr
    listed = {line.split(": ", 1)[0].removeprefix("  skipped ") for line in run.stdout.splitlines()[2:]}
    assert listed == odd, run.stdout
    assert "is a dangling symbolic link" in run.stdout and "is a symbolic link loop" in run.stdout
    assert "(a FIFO): never opened" in run.stdout and "(a socket)" in run.stdout and "not UTF-8" in run.stdout
    rows = lance.dataset(str(tmp_path / "out.lance")).to_table(columns=["path"]).to_pylist()
    assert [row["path"] for row in rows] == ["cat/ok0.png", "cat/ok1.png", "cat/ok2.png"]

    strict = _prepare([*args[:-1], str(tmp_path / "strict.lance"), "--on-bad-file", "error"])
    _one_screen(strict, 1, "parameter: --input", "cat/bad\\\\xff.png", "not UTF-8")
    assert not (tmp_path / "strict.lance").exists() and not (tmp_path / "strict.lance.partial").exists()


# -- a column name Lance reserves ---------------------------------------------------------------
@pytest.mark.parametrize("column", ["_rowaddr", "_rowid"])
def test_a_reserved_parquet_column_is_named_with_its_file_before_writing(tmp_path: Path, column: str) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"x": [1, 2], column: [3, 4]}), tmp_path / "in" / "part-0.parquet")
    out = tmp_path / "out.lance"
    run = _prepare(["--format", "parquet", "--input", str(tmp_path / "in"), "--output", str(out)])
    _one_screen(
        run, 1, f"column named `{column}`", "a name Lance reserves", "part-0.parquet", f"rename the column `{column}`"
    )
    assert not out.exists() and not Path(f"{out}.partial").exists()


# -- faults while writing: one screen, then the rerun equals the input ----------------------------
def _rerun_equals(args: list[str], out: Path, expected: list[dict], resumed: bool = True) -> None:
    rerun = _prepare([*args, "--output", str(out)])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert ("resumed after" in rerun.stdout) == resumed, rerun.stdout
    assert _read_back(out) == expected


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs mounted at ``tmp_path / "disk"`` (unmounted after): a disk that fills up."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root; the EFBIG case covers a size limit")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({made.stderr.strip()}); the EFBIG case covers a size limit")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("fmt", ["parquet", "videofolder"])
def test_a_full_disk_ends_in_a_few_lines_and_the_rerun_completes(tmp_path: Path, small_disk: Path, fmt: str) -> None:
    if fmt == "videofolder":  # blobs: Lance reports the cut blob file as a bad range, not as ENOSPC
        args, expected = _videos(tmp_path / "in", size=300_000)
    else:
        (tmp_path / "in").mkdir()
        for k in range(6):
            table = pa.table({"x": range(k * 1000, (k + 1) * 1000), "b": [os.urandom(300) for _ in range(1000)]})
            pq.write_table(table, tmp_path / "in" / f"p{k}.parquet", compression="none")
        args = ["--format", "parquet", "--input", str(tmp_path / "in"), "--unit-files", "1", "--workers", "1"]
        whole = pa.concat_tables(pq.read_table(tmp_path / "in" / f"p{k}.parquet") for k in range(6))
        expected = [{"id": i, **row} for i, row in enumerate(whole.to_pylist())]
    out = small_disk / "out.lance"
    run = _prepare([*args, "--output", str(out)])
    _one_screen(run, 1, "stopped: the output's disk is full", "output is intact", "lance-lightning prepare ")
    assert f"--format {fmt} --input" in run.stderr  # the command to rerun, as given
    assert not out.exists()  # never looks complete
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    _rerun_equals(args, out, expected)


def test_a_file_size_limit_ends_in_a_few_lines_and_the_rerun_completes(tmp_path: Path) -> None:
    args, expected = _videos(tmp_path / "in", size=300_000)
    args[args.index("--unit-files") + 1] = "6"  # two units: the first already past the limit
    out = tmp_path / "out.lance"

    def limit() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    run = _prepare([*args, "--output", str(out)], preexec_fn=limit)
    _one_screen(run, 1, "stopped: a file of the output reached the size limit (File too large)", "output is intact")
    _rerun_equals(args, out, expected, resumed=False)


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_ctrl_c_after_a_commit_ends_in_a_few_lines_and_the_rerun_completes(tmp_path: Path, pool: str) -> None:
    """SIGINT to the whole process group (as a terminal's Ctrl-C sends it) once the first unit is
    committed: `KILLER`'s ``pause:1`` creates a file then, and the test waits for it (no sleep)."""
    args, expected = _videos(tmp_path / "in")
    args += ["--pool", pool]
    out, paused = tmp_path / "out.lance", tmp_path / "paused"
    command = [sys.executable, str(KILLER), "pause:1", "cli", *args, "--output", str(out), "--quiet"]
    proc = subprocess.Popen(
        command,
        env=_env(PREPARE_PAUSED=str(paused)),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_at_a_terminal,
    )
    try:
        deadline = time.monotonic() + 240
        while not paused.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert paused.exists(), proc.communicate(timeout=60)[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        stderr = proc.communicate(timeout=240)[1]
    finally:  # a prepare that did not stop is not left running (holding the output's lock)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _one_screen(subprocess.CompletedProcess(command, proc.returncode, "", stderr), 130, "stopped: interrupted (Ctrl-C)")
    _rerun_equals(args, out, expected)


def test_a_killed_process_worker_ends_in_a_few_lines_and_the_rerun_completes(tmp_path: Path) -> None:
    args, expected = _videos(tmp_path / "in")
    args += ["--pool", "processes"]
    out = tmp_path / "out.lance"
    run = _prepare([*args, "--output", str(out)], moment="worker:2")  # the worker writing unit 2 SIGKILLs itself
    _one_screen(run, 1, "stopped: a worker process of --pool processes died", "output is intact")
    _rerun_equals(args, out, expected)
