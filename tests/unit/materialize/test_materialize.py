"""Materialized views: a local or S3 (moto on loopback) source copied once to local disk.

Everything is real: Lance datasets in ``tmp_path`` or on a moto S3 server, the
``lance-lightning materialize`` console script in a subprocess killed with SIGKILL, writes that fail
because the kernel refuses them (a file size limit, a full tmpfs), a real Trainer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from lance_lightning import (
    ConfigError,
    LanceDataModule,
    LanceSource,
    MaterializedView,
    RowShuffle,
)
from lance_lightning.materialize.space import estimate_view_bytes
from lance_lightning.materialize.view import materialize_view
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import pin_source
from tests.harness import ckpt_file, fit
from tests.helpers import append_rows, flat, make_table, run_cli, write_dataset
from tests.s3_server import S3Server

REPO_ROOT = Path(__file__).resolve().parents[3]
CONSOLE_SCRIPT = Path(sys.executable).with_name("lance-lightning")
ROWS, FILTER, COLUMNS = 2000, "label < 4", ["id", "x"]


# -- fixtures and helpers ----------------------------------------------------------------------------
@pytest.fixture
def source_uri(tmp_path: Path) -> str:
    """2000 rows (id 0..1999, label = id % 10) in 4 fragments."""
    return write_dataset(tmp_path / "source.lance", ROWS, fragment_rows=500)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server.serving("views") as server:
        yield server


@pytest.fixture(scope="module")
def s3_uri(s3: S3Server) -> str:
    uri = "s3://views/source.lance"
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options(), max_rows_per_file=500)
    return uri


def ids(uri: str, filter: str | None = None) -> list[int]:
    """The ``id`` column in storage (scan) order."""
    return lance.dataset(uri).to_table(columns=["id"], filter=filter).column("id").to_pylist()


def expected_ids(filter: str | None, rows: int = ROWS) -> list[int]:
    labels = np.arange(rows) % 10
    keep = labels < 4 if filter == FILTER else np.ones(rows, bool)
    return np.arange(rows)[keep].tolist()


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path`` with its size and mtime (ns): unchanged means nothing was written."""
    return {
        str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def leftovers(cache: Path) -> list[str]:
    """What a failed copy left in ``cache`` besides the lock file."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))


def run_materialize(args: list[str]) -> tuple[int, str, str]:
    """``lance-lightning materialize ARGS`` in process: (exit status, stdout, stderr)."""
    return run_cli(["materialize", *args])


# -- 1. what a view holds ----------------------------------------------------------------------------
def test_view_of_local_source_is_filtered_column_subset_in_source_order(tmp_path: Path, source_uri: str) -> None:
    result = materialize_view(
        LanceSource(source_uri, columns=COLUMNS, filter=FILTER), tmp_path / "views", chunk_rows=300
    )
    view = lance.dataset(result.uri)
    assert view.schema.names == COLUMNS
    assert ids(result.uri) == expected_ids(FILTER) == ids(source_uri, FILTER)
    x = view.to_table(columns=["x"]).column("x").to_numpy()
    np.testing.assert_array_equal(x, lance.dataset(source_uri).to_table(columns=["x"], filter=FILTER)["x"].to_numpy())
    assert not result.reused and result.chunks == -(-800 // 300) and result.resumed_rows == 0
    manifest = json.loads(Path(result.uri).with_suffix(".json").read_text())
    assert manifest == result.manifest
    assert (manifest["rows"], manifest["columns"], manifest["filter"]) == (800, COLUMNS, FILTER)
    assert manifest["source"]["uri"] == source_uri and manifest["source"]["version"] == 1
    assert leftovers(tmp_path / "views") == sorted([Path(result.uri).name, Path(result.uri).with_suffix(".json").name])


def test_a_copy_by_take_of_the_known_matches_equals_the_filtered_scan(
    tmp_path: Path, source_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote cache copies a sparse split by take of its plan's matches (`ViewCopier` with
    ``matches``): the same rows, columns and order as the filtered scan, over several read batches
    and commits, and the same view key (a later filtered-scan request reuses it)."""
    monkeypatch.setattr("lance_lightning.materialize.copy.READ_BATCH_ROWS", 128)
    source = LanceSource(source_uri, columns=COLUMNS, filter=FILTER)
    matches = find_matches(pin_source(source, "train"))
    taken = materialize_view(source, tmp_path / "taken", chunk_rows=300, matched_rows=matches.rows, matches=matches)
    scanned = materialize_view(source, tmp_path / "scanned", chunk_rows=300)
    assert lance.dataset(taken.uri).to_table() == lance.dataset(scanned.uri).to_table()
    assert ids(taken.uri) == expected_ids(FILTER) and taken.chunks == -(-800 // 300)
    assert Path(taken.uri).name == Path(scanned.uri).name
    assert materialize_view(source, tmp_path / "taken").reused


@pytest.mark.parametrize("where", ["local", "s3"])
def test_preshuffled_view_same_seed_same_order_and_a_permutation(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        source = LanceSource(
            request.getfixturevalue("s3_uri"), columns=COLUMNS, filter=FILTER, storage_options=s3.storage_options()
        )
    else:
        source = LanceSource(request.getfixturevalue("source_uri"), columns=COLUMNS, filter=FILTER)
    first = materialize_view(source, tmp_path / "a", shuffle_seed=7, chunk_rows=250)
    again = materialize_view(source, tmp_path / "b", shuffle_seed=7, chunk_rows=64)  # other chunking
    other = materialize_view(source, tmp_path / "c", shuffle_seed=8)
    order = ids(first.uri)
    assert sorted(order) == expected_ids(FILTER), "the view must hold exactly the filtered rows, once each"
    assert order != expected_ids(FILTER), "the view was not shuffled"
    assert ids(again.uri) == order, "same seed, same order (whatever the chunk size)"
    assert ids(other.uri) != order and sorted(ids(other.uri)) == sorted(order)
    assert lance.dataset(first.uri).schema.names == COLUMNS
    assert Path(first.uri).name == Path(again.uri).name, "the key depends on the content, not on chunking"
    rows_x = lance.dataset(first.uri).to_table(columns=["id", "x"]).to_pydict()
    assert all(abs(x - i / ROWS) < 1e-6 for i, x in zip(rows_x["id"], rows_x["x"])), "columns stay aligned"
    if where == "s3":
        for path in (tmp_path / "a").rglob("*"):
            if path.is_file():
                assert s3.secret_key.encode() not in path.read_bytes(), f"credentials written into {path}"
        assert first.manifest["source"]["uri"] == source.uri


# -- 2. reuse and new versions -----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["local", "s3"])
def test_reused_while_source_version_is_unchanged(tmp_path: Path, where: str, request: pytest.FixtureRequest) -> None:
    if where == "s3":
        source = LanceSource(
            request.getfixturevalue("s3_uri"),
            columns=COLUMNS,
            filter=FILTER,
            storage_options=request.getfixturevalue("s3").storage_options(),
        )
    else:
        source = LanceSource(request.getfixturevalue("source_uri"), columns=COLUMNS, filter=FILTER)
    cache = tmp_path / "views"
    made = materialize_view(source, cache, shuffle_seed=1, chunk_rows=500)
    before = snapshot(cache)
    reused = materialize_view(source, cache, shuffle_seed=1, chunk_rows=500)
    assert reused.reused and reused.uri == made.uri and reused.chunks == 0
    assert reused.manifest["created"] == made.manifest["created"]
    assert snapshot(cache) == before, "reusing a view must not write anything"
    assert len(lance.dataset(made.uri).versions()) == 2, "one commit per chunk of 500 of the 800 rows, none added"


def test_new_source_version_gives_a_new_view(tmp_path: Path, source_uri: str) -> None:
    cache = tmp_path / "views"
    source = LanceSource(source_uri, columns=COLUMNS, filter=FILTER)
    old = materialize_view(source, cache)
    old_files = snapshot(Path(old.uri))
    append_rows(source_uri, 500)  # version 2
    appended = materialize_view(source, cache)
    assert not appended.reused and appended.uri != old.uri
    assert appended.manifest["source"]["version"] == 2
    assert ids(appended.uri) == expected_ids(FILTER, ROWS + 500)
    lance.dataset(source_uri).delete("id < 100")  # version 3
    deleted = materialize_view(source, cache)
    assert deleted.manifest["source"]["version"] == 3
    assert ids(deleted.uri) == [i for i in expected_ids(FILTER, ROWS + 500) if i >= 100]
    pinned_old = materialize_view(LanceSource(source_uri, columns=COLUMNS, filter=FILTER, version=1), cache)
    assert pinned_old.reused and pinned_old.uri == old.uri, "an explicitly pinned old version reuses its view"
    assert snapshot(Path(old.uri)) == old_files and ids(old.uri) == expected_ids(FILTER), "old views stay intact"


def test_concurrent_writers_copy_once(tmp_path: Path, source_uri: str) -> None:
    """Two writers of the same view (e.g. two DDP ranks on one node): one copies, the other reuses."""
    results: list[Any] = []
    source = LanceSource(source_uri, columns=COLUMNS)
    threads = [
        threading.Thread(target=lambda: results.append(materialize_view(source, tmp_path / "views", chunk_rows=100)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(r.reused for r in results) == [False, True]
    assert results[0].uri == results[1].uri and ids(results[0].uri) == list(range(ROWS))


@pytest.mark.timeout(120)
def test_paused_store_during_the_copy_is_retried_and_counted(tmp_path: Path, s3: S3Server) -> None:
    """The S3 server is frozen (SIGSTOP) after the first chunk commit and thawed 1.5 s later.

    100 fragments of 100 rows: the scan has far more to read than Lance reads ahead at a commit.
    """
    uri, rows = "s3://views/many-fragments.lance", 10_000
    lance.write_dataset(make_table(rows), uri, storage_options=s3.storage_options(), max_rows_per_file=100)
    fail_fast = {"client_max_retries": "0", "timeout": "300ms", "connect_timeout": "300ms"}
    source = LanceSource(uri, columns=COLUMNS, storage_options={**s3.storage_options(), **fail_fast})
    thaw = threading.Timer(1.5, os.kill, args=(s3._process.pid, signal.SIGCONT))

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


# -- 3. interrupted copies ---------------------------------------------------------------------------
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


# -- 4. disk full ------------------------------------------------------------------------------------
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


# -- 5. the command line -----------------------------------------------------------------------------
def test_cli_quiet_prints_only_the_path_and_reuses(tmp_path: Path, source_uri: str) -> None:
    args = [
        "--uri",
        source_uri,
        "--out-dir",
        str(tmp_path / "views"),
        "--columns",
        "id",
        "x",
        "--filter",
        FILTER,
        "--shuffle-seed",
        "3",
        "--chunk-rows",
        "300",
    ]
    code, out, err = run_materialize([*args, "--quiet"])
    assert code == 0 and err == ""
    view = out.strip()
    assert out == view + "\n" and Path(view).is_dir() and Path(view).parent == tmp_path / "views"
    assert sorted(ids(view)) == expected_ids(FILTER)
    code, out, err = run_materialize(args)
    assert code == 0 and f"view: {view}" in out and "reused (source version unchanged)" in out
    assert "rows: 800" in out and err == "", "a reused view commits nothing, so no progress lines"


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--uri", "{tmp}/nope.lance"], 1, "`materialize.uri`='{tmp}/nope.lance': no Lance dataset exists there"),
        (["--uri", "{src}", "--columns", "id", "nope"], 1, "column(s) ['nope'] are not in the dataset"),
        (["--uri", "{src}", "--filter", "label <"], 1, "`materialize.filter`='label <': Lance cannot run this filter"),
        (
            ["--uri", "{src}", "--filter", "label > 100"],
            1,
            "`materialize.filter`='label > 100': matches no rows of {src} (version 1), so the view would be empty",
        ),
        (["--uri", "{src}", "--version", "9"], 1, "`materialize.version`=9: that version does not exist"),
        (["--uri", "{src}", "--chunk-rows", "0"], 1, "`materialize.chunk_rows`=0: must be an integer >= 1"),
        (["--uri", "{src}", "--shuffle-seed", "-1"], 1, "`materialize.shuffle_seed`=-1: must be an integer >= 0"),
        (["--uri", "{src}", "--storage-option", "region"], 2, "--storage-option 'region' must be KEY=VALUE"),
        ([], 2, "the following arguments are required: --uri"),
    ],
    ids=[
        "missing-uri",
        "missing-column",
        "bad-sql",
        "zero-match",
        "no-version",
        "chunk-rows",
        "seed",
        "option",
        "usage",
    ],
)
def test_cli_errors_and_exit_codes(tmp_path: Path, source_uri: str, args: list[str], code: int, text: str) -> None:
    fill = {"tmp": str(tmp_path), "src": source_uri}
    got, out, err = run_materialize([a.format(**fill) for a in args] + ["--out-dir", str(tmp_path / "views")])
    assert got == code, err
    assert text.format(**fill) in err, err
    assert out == ""
    assert not (tmp_path / "views").exists() or leftovers(tmp_path / "views") == []


def test_cli_help_exits_zero() -> None:
    code, out, _ = run_materialize(["--help"])
    assert code == 0 and "--chunk-rows" in out and "--storage-option" in out


def test_cli_reads_s3_with_storage_options_and_never_prints_them(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    options = [f"--storage-option={k}={v}" for k, v in s3.storage_options().items()]
    code, out, err = run_materialize(
        ["--uri", s3_uri, "--out-dir", str(tmp_path / "views"), "--filter", FILTER, *options]
    )
    assert code == 0, err
    assert s3.secret_key not in out + err and s3.access_key not in out + err
    view = out.split("view: ")[1].split()[0]
    assert ids(view) == expected_ids(FILTER)
    wrong = [o for o in options if "secret" not in o] + ["--storage-option=aws_secret_access_key=wrong-secret-42"]
    code, _, err = run_materialize(["--uri", s3_uri, "--out-dir", str(tmp_path / "views"), *wrong])
    assert code == 1 and f"`materialize.uri`='{s3_uri}'" in err and "wrong-secret-42" not in err, err


# -- 6. the data module ------------------------------------------------------------------------------
def test_datamodule_trains_from_the_view_and_reuses_it(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "views"

    def make() -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(source_uri, columns=COLUMNS, filter=FILTER),
            val=LanceSource(source_uri, columns=COLUMNS, filter="label >= 8"),
            batch_size=16,
            materialize=MaterializedView(cache_dir=str(cache), shuffle_seed=3, splits=["train"]),
        )

    caplog.set_level(logging.INFO, logger="lance_lightning.materialize.view")
    dm = make()
    first = fit(tmp_path, dm, name="a")
    views = list(cache.glob("*.lance"))
    assert len(views) == 1
    view = str(views[0])
    assert dm.plans["train"].source.uri == view and view in dm.explain("train")
    assert dm.plans["val"].source.uri == source_uri, "splits=['train'] leaves val on the source"
    assert flat(first.seen) == ids(view)[: 800 // 16 * 16], "training did not read the view in its order"
    assert "made in" in caplog.text
    created = json.loads(Path(view).with_suffix(".json").read_text())["created"]
    files = snapshot(cache)

    caplog.clear()
    dm = make()
    second = fit(tmp_path, dm, name="b")
    assert dm.plans["train"].source.uri == view
    assert "reused" in caplog.text and "made in" not in caplog.text
    assert json.loads(Path(view).with_suffix(".json").read_text())["created"] == created
    assert snapshot(cache) == files, "the second run wrote into the cache"
    assert second.seen == first.seen


def test_reopen_finds_only_complete_views_of_its_cache_dir(tmp_path: Path, source_uri: str) -> None:
    config = MaterializedView(cache_dir=str(tmp_path / "views"))
    made = materialize_view(LanceSource(source_uri, columns=COLUMNS), config.cache_dir)
    assert config.reopen(made.uri) == LanceSource(uri=made.uri, columns=COLUMNS)
    assert config.reopen(str(tmp_path / "views" / "0123456789abcdef0123.lance")) is None
    assert config.reopen(source_uri) is None, "a dataset outside cache_dir is not a view"
    assert MaterializedView(cache_dir=str(tmp_path / "other")).reopen(made.uri) is None
    Path(made.uri).with_suffix(".json").unlink()
    assert config.reopen(made.uri) is None, "a view without its manifest is not complete"


def test_resume_after_the_source_moved_on_reads_the_checkpoint_view(tmp_path: Path, source_uri: str) -> None:
    """The checkpoint's cursor was read from the view of version 1; the source is at version 3 now.

    Exact resume needs the old view (kept in cache_dir), as a plain source re-pins its old version.
    Needs `LanceDataModule.load_state_dict` to re-plan train from
    ``self.materialize.reopen(cursor["plan"]["uri"])`` when that differs from the current plan's URI.
    """

    def make() -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(source_uri, columns=COLUMNS, filter=FILTER),
            batch_size=16,
            shuffle=RowShuffle(seed=2),
            materialize=MaterializedView(cache_dir=str(tmp_path / "v")),
        )

    k = 20
    whole = fit(tmp_path, make(), name="whole")
    first = fit(tmp_path, make(), name="first", max_steps=k, ckpt_every=k)
    old_view = next((tmp_path / "v").glob("*.lance"))
    append_rows(source_uri, 300)
    lance.dataset(source_uri).delete("id < 50")
    dm = make()
    rest = fit(tmp_path, dm, name="rest", ckpt_path=ckpt_file(tmp_path, "first", k))
    assert dm.plans["train"].source.uri == str(old_view)
    assert first.seen + rest.seen == whole.seen


def test_datamodule_rejects_bad_materialize_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`materialize.cache_dir`='s3://bucket/views': views are written to local"):
        MaterializedView(cache_dir="s3://bucket/views")
    with pytest.raises(ConfigError, match=r"`materialize.splits`=\['training'\]: splits must be among"):
        MaterializedView(cache_dir=str(tmp_path), splits=["training"])


def test_yaml_config_with_materialize(tmp_path: Path, source_uri: str) -> None:
    cache = tmp_path / "views"
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 3
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {source_uri}, columns: [id, x], filter: "{FILTER}"}}
  batch_size: 16
  materialize: {{cache_dir: {cache}, shuffle_seed: 5, chunk_rows: 256}}
""")
    code, printed, err = run_cli(["fit", "--config", str(config), "--print_config"])
    assert code == 0, err
    assert yaml.safe_load(printed)["data"]["materialize"] == {
        "cache_dir": str(cache),
        "shuffle_seed": 5,
        "splits": None,
        "chunk_rows": 256,
    }
    code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err
    views = list(cache.glob("*.lance"))
    assert len(views) == 1 and json.loads(views[0].with_suffix(".json").read_text())["shuffle_seed"] == 5
    checkpoint = next((tmp_path / "root" / "checkpoints").glob("*.ckpt"))
    cursor = torch.load(checkpoint, weights_only=True)["LanceDataModule"]["train_cursor"]
    assert cursor["plan"]["uri"] == str(views[0]) and cursor["steps"] == 3
