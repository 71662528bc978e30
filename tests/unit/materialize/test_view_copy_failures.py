"""A copy that fails partway never leaves a view that looks complete: a store that pauses mid-copy is
retried and the retries are counted; a copy killed with SIGKILL leaves only its work directory and a
rerun resumes it to the same view as an uninterrupted copy; a file size limit or a full disk fails with
a clear ``no space left`` error and leaves no view, manifest or partial copy behind.

Everything is real: a moto S3 server frozen with SIGSTOP, the ``lance-lightning materialize`` console
script in a subprocess killed with SIGKILL, writes that fail because the kernel refuses them (a file
size limit, a full tmpfs in a private mount namespace).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_lightning import LanceSource
from lance_lightning.materialize.space import estimate_view_bytes
from lance_lightning.materialize.view import materialize_view
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import pin_source
from tests.helpers import make_table, write_dataset
from tests.s3_server import S3Server
from tests.unit.materialize.view_helpers import COLUMNS, ids, leftovers

REPO_ROOT = Path(__file__).resolve().parents[3]
CONSOLE_SCRIPT = Path(sys.executable).with_name("lance-lightning")


# -- 1. a store that pauses mid-copy -----------------------------------------------------------------
@pytest.mark.timeout(120)
def test_paused_store_during_the_copy_is_retried_and_counted(tmp_path: Path, s3: S3Server) -> None:
    """The S3 server is frozen (SIGSTOP) after the first chunk commit and thawed 10 s later.

    100 fragments of 100 rows: the scan has far more to read than Lance reads ahead at a commit.
    A request times out after 1.5 s and Lance's reader tries a request up to 4 times (6 s), so the
    10 s freeze surfaces as a failed attempt; thawed, a loaded machine's server answers well within
    1.5 s (with 300 ms, attempts after the thaw timed out too under load and the copy gave up).
    """
    uri, rows = "s3://views/many-fragments.lance", 10_000
    lance.write_dataset(make_table(rows), uri, storage_options=s3.storage_options(), max_rows_per_file=100)
    fail_fast = {"client_max_retries": "0", "timeout": "1500ms", "connect_timeout": "1500ms"}
    source = LanceSource(uri, columns=COLUMNS, storage_options={**s3.storage_options(), **fail_fast})
    thaw = threading.Timer(10.0, os.kill, args=(s3._process.pid, signal.SIGCONT))

    def freeze_once(done: int, total: int) -> None:
        if thaw.ident is None and done < total:  # the first commit only
            os.kill(s3._process.pid, signal.SIGSTOP)
            thaw.start()

    try:
        result = materialize_view(
            source,
            tmp_path / "views",
            chunk_rows=500,
            on_chunk=freeze_once,
            retry=RetryPolicy(attempts=10, initial_backoff_s=0.2, max_backoff_s=1.0),
        )
    finally:
        thaw.cancel()
        os.kill(s3._process.pid, signal.SIGCONT)
    assert thaw.finished.is_set(), "the server was never frozen"
    assert result.stats["retries"] >= 1
    assert ids(result.uri) == list(range(rows))


# -- 2. interrupted copies ---------------------------------------------------------------------------
def _kill_after_commits(args: list[str], commits: int) -> None:
    """Run the console script; SIGKILL it once it reported ``commits`` committed chunks."""
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "materialize", *args],
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO_ROOT,
    )
    seen: list[str] = []
    try:
        for line in process.stderr:
            seen.append(line)
            if sum(" / " in s and s.strip().endswith("rows") for s in seen) >= commits:
                process.send_signal(signal.SIGKILL)
                break
    finally:
        process.wait(timeout=120)
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL, f"the copy ended before it was killed:\n{''.join(seen)}"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("seed", "commits"),
    [(None, 1), (7, 1), (7, 101)],
    ids=["source-order", "shuffled-killed-while-staging", "shuffled-killed-writing-view"],
)
def test_interrupted_copy_never_looks_complete_and_resumes(tmp_path: Path, seed: int | None, commits: int) -> None:
    rows, chunk = 10_000, 100  # 100 commits per pass: the kill lands mid-copy
    uri = write_dataset(tmp_path / "big.lance", rows, fragment_rows=2500)
    cache = tmp_path / "views"
    args = ["--uri", uri, "--out-dir", str(cache), "--chunk-rows", str(chunk), "--columns", "id", "x"]
    args += ["--shuffle-seed", str(seed)] if seed is not None else []
    _kill_after_commits(args, commits)

    assert not list(cache.glob("*.lance")) and not list(cache.glob("*.json")), "a killed copy looked complete"
    partials = list(cache.glob("*.partial-*"))
    assert len(partials) == 1
    committed = sum(lance.dataset(str(d)).count_rows() for d in partials[0].glob("*.lance"))
    assert 0 < committed < rows * (2 if seed is not None else 1)

    resumed = materialize_view(LanceSource(uri, columns=["id", "x"]), cache, shuffle_seed=seed, chunk_rows=chunk)
    assert resumed.resumed_rows > 0 and resumed.manifest["resumed_from_rows"] == resumed.resumed_rows
    assert resumed.chunks < (rows // chunk) * (2 if seed is not None else 1), "the rerun copied everything again"
    whole = materialize_view(LanceSource(uri, columns=["id", "x"]), tmp_path / "uninterrupted", shuffle_seed=seed)
    assert ids(resumed.uri) == ids(whole.uri), "the resumed view differs from an uninterrupted copy"
    assert sorted(ids(resumed.uri)) == list(range(rows))
    assert not list(cache.glob("*.partial-*")), "the finished copy left its work directory"


# -- 3. disk full ------------------------------------------------------------------------------------
def _growing_rows_dataset(path: Path) -> str:
    """4000 rows: the first 2000 carry 10-byte payloads, the rest 4 KB each (the copy fails midway)."""
    payload = [bytes(10) if i < 2000 else np.random.default_rng(i).bytes(4000) for i in range(4000)]
    return write_dataset(path, 4000, fragment_rows=1000, extra={"payload": pa.array(payload, pa.binary())})


def _with_file_size_limit(limit: int, argv: list[str]) -> list[str]:
    """``argv`` exec'd under RLIMIT_FSIZE=``limit`` with SIGXFSZ ignored (a write past it fails with EFBIG)."""
    setup = (
        f"import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", setup, *argv]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_file_size_limit_while_copying_gives_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    uri = _growing_rows_dataset(tmp_path / "growing.lance")
    cache = tmp_path / "views"
    argv = [str(CONSOLE_SCRIPT), "materialize", "--uri", uri, "--out-dir", str(cache), "--chunk-rows", "200"]
    result = subprocess.run(
        _with_file_size_limit(300_000, argv), capture_output=True, text=True, timeout=150, cwd=REPO_ROOT
    )
    assert result.returncode == 1, result.stderr
    assert "2,000 / 4,000 rows" in result.stderr, "chunks were committed before the limit was hit"
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(
        f"lance-lightning materialize: error: no space left while materializing {uri} "
        f"(version 1) into {cache}: raise the file size limit (ulimit -f)"
    ), message
    assert "File too large (os error 27)" in message and message.endswith("no view was left behind"), message
    assert leftovers(cache) == [], "a view, manifest or partial copy was left behind"


_TMPFS_SCRIPT = """
set -u
for name in tiny snug; do mkdir -p "$ROOT/$name"; done
mount -t tmpfs -o size=256k tmpfs "$ROOT/tiny" || exit 99
mount -t tmpfs -o size="$SNUG" tmpfs "$ROOT/snug" || exit 99
for name in tiny snug; do
  "$PYTHON" -m lance_lightning.cli.materialize --uri "$URI" --out-dir "$ROOT/$name/views" --chunk-rows 50 --quiet
  echo "exit=$?"
  echo "left=$(ls -A "$ROOT/$name/views" | grep -v '\\.lock$' | tr '\\n' ' ')"
done
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_full_disk_gives_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    """Real tmpfs mounts in a private mount namespace: one too small to start, one that fills up mid-copy."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a private tmpfs")
    uri = _growing_rows_dataset(tmp_path / "growing.lance")
    pinned = pin_source(LanceSource(uri), "materialize")
    estimate = estimate_view_bytes(pinned, pinned.open(), pinned.total_rows, staged=False)
    # Room for the estimated data but not for Lance's per-commit manifests (80 commits of 50 rows).
    env = {
        **os.environ,
        "ROOT": str(tmp_path / "mnt"),
        "URI": uri,
        "PYTHON": sys.executable,
        "SNUG": str(estimate + 128 * 1024),
    }
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _TMPFS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=REPO_ROOT,
        env=env,
    )
    if result.returncode == 99 or "unshare: " in result.stderr:
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    errors = [line for line in result.stderr.splitlines() if line.startswith("lance-lightning materialize: error:")]
    assert result.stdout.splitlines() == ["exit=1", "left=", "exit=1", "left="], (result.stdout, result.stderr)
    assert len(errors) == 2, result.stderr
    tiny, snug = errors
    assert (
        f"no space left while materializing {uri} (version 1) into {tmp_path / 'mnt' / 'tiny' / 'views'}: free " in tiny
        and "MB are free); no view was left behind" in tiny
    ), tiny
    assert f"into {tmp_path / 'mnt' / 'snug' / 'views'}: free " in snug, snug
    assert "No space left on device (os error 28)" in snug and snug.endswith("no view was left behind"), snug
