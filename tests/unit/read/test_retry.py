"""Transient storage errors are retried with backoff and counted; permanent ones fail fast and clearly.

Faults are real: a moto S3 server on loopback is paused with SIGSTOP (requests time out, as with a
stalled store) and resumed with SIGCONT, or stopped for good (connections refused), or the
dataset's data files are deleted from the bucket (a permanent "not found"). Lance's own object
store client is told to fail fast (``timeout``/``connect_timeout`` 300 ms, ``client_max_retries``
0) so that our `RetryPolicy` is what rides out the fault.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import boto3
import lance
import numpy as np
import pytest

from lance_lightning import ConfigError, LanceDataModule, LanceSource, RemoteCache, RowShuffle
from lance_lightning.metrics.clock import StageClock
from lance_lightning.read.retry import (
    DataReadError,
    RetryPolicy,
    describe_rows,
    describe_span,
    is_storage_error,
    is_transient,
)
from tests.helpers import make_table
from tests.s3_server import S3Server

ROWS = 2000
#: Lance's client gives up on a stalled request quickly, so our policy sees the failure.
FAST_FAIL = {"client_max_retries": "0", "timeout": "300ms", "connect_timeout": "300ms"}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server.serving("data") as server:
        try:
            yield server
        finally:
            _resume(server)  # a test may leave it frozen: stop() must reach a live process


def _options(server: S3Server) -> dict[str, str]:
    return {**server.storage_options(), **FAST_FAIL}


def _write(server: S3Server, name: str, rows: int = ROWS) -> str:
    uri = f"s3://data/{name}.lance"
    lance.write_dataset(make_table(rows), uri, storage_options=server.storage_options(), max_rows_per_file=250)
    return uri


@pytest.fixture(scope="module")
def s3_uri(s3: S3Server) -> str:
    return _write(s3, "retry")


def _pause(server: S3Server) -> None:
    os.kill(server._process.pid, signal.SIGSTOP)


def _resume(server: S3Server) -> None:
    if server._process is not None:
        os.kill(server._process.pid, signal.SIGCONT)


def _delete_data_files(server: S3Server, uri: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
    )
    prefix = uri.removeprefix("s3://data/") + "/data/"
    for item in client.list_objects_v2(Bucket="data", Prefix=prefix)["Contents"]:
        client.delete_object(Bucket="data", Key=item["Key"])


# -- the policy itself -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"attempts": 0}, "retry.attempts"),
        ({"attempts": True}, "retry.attempts"),
        ({"attempts": 2.5}, "retry.attempts"),
        ({"initial_backoff_s": -1}, "retry.initial_backoff_s"),
        ({"deadline_s": float("inf")}, "retry.deadline_s"),
        ({"deadline_s": float("nan")}, "retry.deadline_s"),
        ({"initial_backoff_s": 2.0, "max_backoff_s": 1.0}, "retry.max_backoff_s"),
    ],
)
def test_policy_rejects_bad_settings(kwargs: dict, param: str) -> None:
    with pytest.raises(ConfigError, match=param.replace(".", r"\.")) as error:
        RetryPolicy(**kwargs)
    assert "Fix:" in str(error.value)


def test_backoff_is_exponential_capped_and_deterministic() -> None:
    policy = RetryPolicy(initial_backoff_s=0.2, max_backoff_s=1.0)
    waits = [policy.backoff(k, "key") for k in range(1, 7)]
    assert waits == [policy.backoff(k, "key") for k in range(1, 7)], "jitter must not change between runs"
    assert 0.15 <= waits[0] <= 0.25 and 0.3 <= waits[1] <= 0.5
    assert all(w <= 1.0 for w in waits) and waits[-1] >= 0.75
    assert [policy.backoff(k, "other") for k in range(1, 7)] != waits, "different reads get different jitter"


@pytest.mark.parametrize(
    "error, transient",
    [
        (
            OSError(
                "LanceError(IO): Generic S3 error: Error performing GET http://127.0.0.1:5/d in 300ms - HTTP error: "
                "error sending request"
            ),
            True,
        ),
        (OSError("Generic S3 error: Client error with status 503 Service Unavailable: <Code>SlowDown</Code>"), True),
        (ValueError("Generic S3 error: Server error with status 500 Internal Server Error"), True),
        (OSError("Generic S3 error: 429 Too Many Requests"), True),
        (TimeoutError("read timed out"), True),
        (  # a response cut off mid-body (the store stalled while sending it): seen with the store paused
            OSError(
                "LanceError(IO): Generic N/A error: LanceError(IO): Generic S3 error: HTTP error: request or "
                "response body error"
            ),
            True,
        ),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (OSError("LanceError(IO): Generic N/A error: Not found: t.lance/data/ab503c.lance"), False),
        (OSError("Generic S3 error: Client error with status 403 Forbidden: AccessDenied"), False),
        (OSError("Generic S3 error: NoSuchBucket after timeout"), False),  # permanent wins
        (OSError("LanceError(IO): No space left on device (os error 28)"), False),
        (OSError("data file 1102503.lance is corrupt"), False),  # digits inside names are not status codes
        (  # a request time is not a status code (this throttle once read as a permanent 404)
            ValueError(
                "LanceError(IO): Generic S3 error: Error performing GET http://127.0.0.1:35637/d.lance in 404.35µs "
                "- Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>"
            ),
            True,
        ),
        (OSError("Generic S3 error: Error performing GET http://h/d in 503ms - status code: 404 Not Found"), False),
        (OSError("Generic S3 error: Error performing GET http://h/d in 1.503s - returned status 403."), False),
        (RuntimeError("error sending request"), False),  # not a storage error type
        (ConfigError("train.uri", "x", "bad", "fix"), False),
    ],
)
def test_transient_classification(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_non_storage_errors_pass_through_unchanged() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.0)
    for error in (TypeError("bug"), KeyError("k"), ConfigError("p", 1, "bad", "fix"), KeyboardInterrupt()):
        calls = []

        def fail(error: BaseException = error) -> None:
            calls.append(1)
            raise error

        with pytest.raises(type(error)):
            policy.call(fail, what="x", uri="u")
        assert calls == [1], f"{type(error).__name__} must not be retried"
    assert not is_storage_error(DataReadError("m", uri="u", version=1, what="w", attempts=1, transient=True))


def test_describe_rows() -> None:
    assert describe_rows(np.arange(1024, 2048), "scan", ["x"]) == "rows at positions 1024..2047 (scan), columns ['x']"
    assert describe_rows([5, 9, 700], "take", None) == "3 rows at positions in 5..700 (take)"
    # A range read (two ranges, the later one first) is described like its positions.
    positions = np.concatenate([np.arange(900, 1000), np.arange(0, 50)])
    assert describe_span(0, 999, 150, "scan", ["x"]) == describe_rows(positions, "scan", ["x"])


# -- real faults on a real S3-compatible server -------------------------------------------------
@pytest.mark.timeout(60)
def test_paused_server_is_retried_and_counted(s3: S3Server, s3_uri: str) -> None:
    dataset = lance.dataset(s3_uri, storage_options=_options(s3))
    expected = dataset.take([3, 777, 1999], columns=["id"]).column("id").to_pylist()
    dataset = lance.dataset(s3_uri, storage_options=_options(s3))  # a fresh handle: nothing cached
    clock = StageClock()
    policy = RetryPolicy(attempts=8, initial_backoff_s=0.2, max_backoff_s=1.0, deadline_s=30)
    _pause(s3)
    resume = threading.Timer(1.5, _resume, args=(s3,))
    resume.start()
    started = time.monotonic()
    try:
        table = policy.call(
            lambda: dataset.take([3, 777, 1999], columns=["id"]),
            what="rows 3, 777, 1999 (take)",
            uri=s3_uri,
            version=1,
            clock=clock,
        )
    finally:
        resume.cancel()
        _resume(s3)
    assert table.column("id").to_pylist() == expected == [3, 777, 1999]
    assert clock.peek().get("retries", 0) >= 1, "the paused server must have made at least one attempt fail"
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_scan_on_paused_server_is_retried(s3: S3Server, s3_uri: str) -> None:
    dataset = lance.dataset(s3_uri, storage_options=_options(s3))
    clock = StageClock()
    _pause(s3)
    resume = threading.Timer(1.5, _resume, args=(s3,))
    resume.start()
    try:
        table = RetryPolicy(attempts=8, max_backoff_s=1.0).call(
            lambda: dataset.scanner(columns=["id"], offset=1200, limit=300).to_table(),
            what=describe_rows(np.arange(1200, 1500), "scan", ["id"]),
            uri=s3_uri,
            version=1,
            clock=clock,
        )
    finally:
        resume.cancel()
        _resume(s3)
    assert table.column("id").to_pylist() == list(range(1200, 1500))
    assert clock.peek().get("retries", 0) >= 1


@pytest.fixture
def dead_store() -> Iterator[tuple[str, lance.LanceDataset]]:
    """A dataset handle whose server was stopped for good: every connection is refused."""
    with S3Server.serving("data") as server:
        uri = _write(server, "gone", rows=600)
        dataset = lance.dataset(uri, storage_options=_options(server))
    yield uri, dataset


@pytest.mark.timeout(60)
def test_dead_store_gives_up_with_a_clear_error(dead_store: tuple[str, lance.LanceDataset]) -> None:
    uri, dataset = dead_store
    clock = StageClock()
    what = describe_rows(np.arange(250, 500), "scan", ["id", "x"])
    started = time.monotonic()
    with pytest.raises(DataReadError) as info:
        RetryPolicy(attempts=3, initial_backoff_s=0.05).call(
            lambda: dataset.scanner(columns=["id", "x"], offset=250, limit=250).to_table(),
            what=what,
            uri=uri,
            version=1,
            clock=clock,
        )
    error = info.value
    message = str(error)
    assert uri in message and "version 1" in message and "rows at positions 250..499 (scan)" in message
    assert "['id', 'x']" in message and "3 attempt(s)" in message and "Fix:" in message
    assert error.transient and error.attempts == 3 and clock.peek()["retries"] == 2
    assert error.__cause__ is not None and "error sending request" in str(error.__cause__)
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_deadline_stops_retrying(dead_store: tuple[str, lance.LanceDataset]) -> None:
    uri, dataset = dead_store
    policy = RetryPolicy(attempts=1000, initial_backoff_s=0.1, max_backoff_s=0.2, deadline_s=1.5)
    started = time.monotonic()
    with pytest.raises(DataReadError, match=r"deadline_s=1\.5") as info:
        policy.call(lambda: dataset.take([1, 2], columns=["id"]), what="rows 1, 2 (take)", uri=uri, version=1)
    assert time.monotonic() - started < 10
    assert 2 <= info.value.attempts < 1000


@pytest.mark.timeout(60)
def test_permanent_error_is_not_retried(s3: S3Server) -> None:
    uri = _write(s3, "deleted", rows=500)
    dataset = lance.dataset(uri, storage_options=_options(s3))
    _delete_data_files(s3, uri)
    clock = StageClock()
    started = time.monotonic()
    with pytest.raises(DataReadError) as info:
        RetryPolicy(attempts=5).call(
            lambda: dataset.take([10, 400], columns=["id"]),
            uri=uri,
            version=1,
            what=describe_rows([10, 400], "take", ["id"]),
            clock=clock,
        )
    message = str(info.value)
    assert time.monotonic() - started < 5
    assert info.value.attempts == 1 and not info.value.transient and "retries" not in clock.peek()
    assert uri in message and "permanent" in message and "Not found" in message
    assert "2 rows at positions in 10..400 (take)" in message


# -- through the data module (read/lance_io.py wraps its reads in the default policy) -----------
def _ids_of_epoch(
    dm: LanceDataModule, pause_after: int | None = None, server: S3Server | None = None
) -> tuple[list[int], float]:
    """One epoch's ids; with ``pause_after``, the server is paused after that batch and resumed only
    once the consumer has waited a second for a batch (so a read ran into the pause, whatever the
    machine's load) and at least 1.5 s passed."""
    dm.setup("fit")
    loader = dm.train_dataloader()
    ids: list[int] = []
    last_batch = [time.monotonic()]
    done = threading.Event()

    def resume_when_stalled() -> None:
        paused_at = time.monotonic()
        while not done.wait(0.05):
            now = time.monotonic()
            if (now - paused_at >= 1.5 and now - last_batch[0] >= 1.0) or now - paused_at > 60:
                break
        _resume(server)

    watcher: threading.Thread | None = None
    try:
        for index, batch in enumerate(loader):
            ids.extend(batch["id"].tolist())
            last_batch[0] = time.monotonic()
            if index == pause_after:
                _pause(server)
                watcher = threading.Thread(target=resume_when_stalled, daemon=True)
                watcher.start()
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
            _resume(server)
    return ids, loader.metrics_snapshot().totals.get("retries", 0.0)


def _module(uri: str, options: dict[str, str], num_workers: int = 0) -> LanceDataModule:
    """Takes from the store while training (the remote cache would read a local copy)."""
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], storage_options=options),
        batch_size=16,
        shuffle=RowShuffle(seed=4),
        num_workers=num_workers,
        reader_threads=1,
        prefetch_groups=1,
        remote_cache=RemoteCache(enabled=False),
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_loader_rides_out_a_paused_store(s3: S3Server, s3_uri: str, num_workers: int) -> None:
    reference, _ = _ids_of_epoch(_module(s3_uri, s3.storage_options()))
    ids, retries = _ids_of_epoch(_module(s3_uri, _options(s3), num_workers), pause_after=5, server=s3)
    assert ids == reference, "a retried read must deliver exactly the planned rows"
    assert retries >= 1, "retries must be counted in the loader's metrics"


@pytest.mark.timeout(60)
def test_loader_names_uri_and_rows_on_a_permanent_error(s3: S3Server) -> None:
    uri = _write(s3, "vanishing", rows=800)
    dm = _module(uri, _options(s3))
    dm.setup("fit")
    _delete_data_files(s3, uri)
    started = time.monotonic()
    with pytest.raises(DataReadError) as info:
        for _ in dm.train_dataloader():
            pass
    message = str(info.value)
    assert uri in message and "version 1" in message and "(take)" in message and "columns ['id', 'x']" in message
    assert time.monotonic() - started < 10
    assert s3.secret_key not in message
