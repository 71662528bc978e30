"""Sources on an S3-compatible store (a real moto server on loopback), fit → checkpoint → resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lance
import pytest
import torch

from lance_lightning import ConfigError, LanceDataModule, LanceSource, RowShuffle
from tests.harness import ckpt_file, fit
from tests.helpers import flat, make_table
from tests.s3_server import S3Server, environment_credentials

ROWS, BATCH = 240, 16


@pytest.fixture(scope="module")
def s3_uri(s3: S3Server) -> str:
    uri = s3.fresh_uri("data", "train")
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options(), max_rows_per_file=100)
    return uri


def _module(uri: str, options: dict[str, str] | None) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], storage_options=options),
        batch_size=BATCH,
        shuffle=RowShuffle(seed=5),
    )


def test_fit_checkpoint_resume_against_s3(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    full = flat(fit(tmp_path, _module(s3_uri, s3.storage_options()), name="full", max_steps=100).seen)
    assert sorted(full) == list(range(ROWS // BATCH * BATCH)) or len(set(full)) == len(full) == ROWS // BATCH * BATCH

    first = fit(tmp_path, _module(s3_uri, s3.storage_options()), name="a", max_steps=6, ckpt_every=6)
    checkpoint = ckpt_file(tmp_path, "a", 6)
    raw = checkpoint.read_bytes()
    assert s3.secret_key.encode() not in raw, "credentials must never be written into checkpoints"
    state = torch.load(checkpoint, weights_only=True)
    assert state["LanceDataModule"]["train_cursor"]["plan"]["uri"] == s3_uri

    resumed = fit(tmp_path, _module(s3_uri, s3.storage_options()), name="b", max_steps=100, ckpt_path=checkpoint)
    assert flat(first.seen) + flat(resumed.seen) == full


def test_credentials_from_environment(
    tmp_path: Path, s3: S3Server, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment_credentials(s3).items():
        monkeypatch.setenv(name, value)
    dm = _module(s3_uri, None)
    dm.setup("fit")
    assert s3.secret_key not in repr(dm.plans["train"]) and s3.secret_key not in dm.explain("train")
    ids = [i for batch in dm.train_dataloader() for i in batch["id"].tolist()]
    assert len(ids) == ROWS // BATCH * BATCH and len(set(ids)) == len(ids)


def test_wrong_credentials_fail_early_with_the_uri(s3: S3Server, s3_uri: str) -> None:
    dm = _module(s3_uri, s3.storage_options(secret="wrong-secret"))
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    message = str(error.value)
    assert "train.uri" in message or "storage_options" in message
    assert s3_uri in message and "wrong-secret" not in message


def test_missing_dataset_on_s3_names_the_uri(s3: S3Server) -> None:
    dm = _module("s3://data/missing.lance", s3.storage_options())
    with pytest.raises(ConfigError, match="missing.lance"):
        dm.setup("fit")


#: The parent of a filter-scan child: pins the source, waits for a line on stdin, then scans the
#: filter in a child process. Credentials come over stdin, as the child's do.
_SCANNING_PARENT = """
import json, sys
from lance_lightning import LanceSource
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.source import pin_source
uri, options = sys.argv[1], json.loads(sys.stdin.readline())
source = pin_source(LanceSource(uri, filter="id % 3 = 1", storage_options=options), "train")
print("pinned", flush=True)
sys.stdin.readline()
print(find_matches(source, child_from_rows=0).rows, flush=True)
"""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an unreaped zombie, whose parent is gone, counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from Linux's /proc")
def test_filter_scan_child_gets_credentials_only_on_stdin_and_dies_with_its_parent(s3: S3Server, s3_uri: str) -> None:
    """The child is caught mid-scan (the server paused): the secret is in neither its command line
    nor its environment, and it dies when its parent is killed (SIGKILL), while still waiting on
    the store."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _SCANNING_PARENT, s3_uri],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    server = s3.pid
    child = None
    try:
        parent.stdin.write(json.dumps(s3.storage_options()) + "\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "pinned"
        os.kill(server, signal.SIGSTOP)
        parent.stdin.write("scan\n")
        parent.stdin.flush()
        deadline = time.monotonic() + 120
        while child is None and time.monotonic() < deadline:
            child = next(
                (
                    pid
                    for pid in _children(parent.pid)
                    if b"lance_lightning.plan.filter_scan" in Path(f"/proc/{pid}/cmdline").read_bytes()
                ),
                None,
            )
            time.sleep(0.05)
        assert child is not None, "the parent started no filter-scan child"
        secret = s3.secret_key.encode()
        assert secret not in Path(f"/proc/{child}/cmdline").read_bytes()
        assert secret not in Path(f"/proc/{child}/environ").read_bytes()
        time.sleep(1)  # let it reach the paused store
        assert _alive(child), "the child ended while the store was paused"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the filter-scan child outlived its killed parent"
    finally:
        os.kill(server, signal.SIGCONT)
        if parent.poll() is None:
            parent.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_workers_read_with_credentials_set_after_their_forkserver_started(
    tmp_path: Path, s3: S3Server, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's order: a loader with workers on local data first (its forkserver starts with
    this environment), then credentials exported and a remote split read by workers. Found by
    the contract checker (sample seed 39 after seeds 7 or 15: 'Failed to resolve region')."""
    from lance_lightning import RemoteCache
    from tests.helpers import write_dataset

    local = LanceDataModule(
        train=LanceSource(write_dataset(tmp_path / "local.lance", 64), columns=["id"]), batch_size=8, num_workers=2
    )
    assert len([b for b in local.train_dataloader()]) == 8  # the forkserver now runs, without credentials
    for name in environment_credentials(s3):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment_credentials(s3).items():
        monkeypatch.setenv(name, value)
    remote = LanceDataModule(
        train=LanceSource(s3_uri, columns=["id", "x"]),
        batch_size=BATCH,
        num_workers=2,
        remote_cache=RemoteCache(enabled=False),
    )
    ids = [i for batch in remote.train_dataloader() for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(ROWS // BATCH * BATCH))
    assert s3.secret_key not in repr(remote.train_dataloader().worker_init_fn)
