"""The survey cache: a filtered split's matches computed once per node, never served stale or damaged.

Real Lance datasets in temporary directories and real processes (``spawn``): processes started
together at a barrier survey the same split, and the one filter scan is proven by Lance's I/O
counters of each process's planning handle (a process that loads reads no byte of the dataset).
Each test has its own cache directory (``LANCE_LIGHTNING_SURVEY_CACHE_DIR``).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_lightning.errors import ConfigError
from lance_lightning.plan import survey_cache
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.plan.survey_cache import ENV_DIR, ENV_ENTRIES, ENV_GB, ENV_SWITCH, SUFFIX, cached_survey
from lance_lightning.plan.survey_entry import MAGIC
from lance_lightning.source import LanceSource, PinnedSource, pin_source

ROWS = 240_000
FILTER = "label < 10"
#: Processes started together: one computes, the others load (each spawned process imports torch, ~6 s of CPU).
PROCESSES = 3


def write_random(path: Path, rows: int = ROWS, seed: int = 0) -> str:
    """``id`` int64 and ``label`` int32 uniform in 0..99 (incompressible enough that a scan of the
    labels reads hundreds of KB), in 4 fragments, with some rows deleted (deletion files)."""
    labels = np.random.default_rng(seed).integers(0, 100, rows, dtype=np.int32)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "label": labels})
    dataset = lance.write_dataset(table, str(path), max_rows_per_file=rows // 4)
    dataset.delete("id % 97 = 5")
    return str(path)


def pinned(uri: str, flt: str = FILTER, version: int | None = None) -> PinnedSource:
    return pin_source(LanceSource(uri, columns=["id", "label"], filter=flt, version=version), "train")


def expected_positions(uri: str, flt: str, version: int | None = None) -> np.ndarray:
    dataset = lance.dataset(uri, version=version)
    return np.flatnonzero(dataset.to_table(columns=["label"]).column(0).to_numpy() < int(flt.split("<")[1]))


def surveyed(source: PinnedSource) -> survey_cache.Surveyed:
    """The cached survey of ``source`` (its matches, as the planner's survey computes them)."""
    return cached_survey(source, lambda: (find_matches(source), 12))


def positions(found: survey_cache.Surveyed) -> np.ndarray:
    return found.matches.select(np.arange(found.matches.rows))


def entries(root: Path) -> list[Path]:
    return sorted(root.glob(f"*{SUFFIX}"))


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "surveys"
    monkeypatch.setenv(ENV_DIR, str(root))
    for name in (ENV_SWITCH, ENV_GB, ENV_ENTRIES):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_random(tmp_path_factory.mktemp("survey_cache") / "ds.lance")


# -- processes ------------------------------------------------------------------------------------
def _survey_at_barrier(source: PinnedSource, barrier: Any, results: Any) -> None:
    """Open the pinned source, wait for the others, plan the split through the planner's survey,
    report. Pinned by the test: pinning checks the filter with a short scan of its own, through a
    handle that shares this one's I/O counters (one Lance session per dataset and process)."""
    from lance_lightning.plan.survey import survey

    handle = source.open()
    handle.io_stats_incremental()  # the open's manifest read is not the survey's
    if barrier is not None:
        barrier.wait()
    found = survey("train", source)
    results.put(
        {
            "pid": os.getpid(),
            "outcomes": dict(survey_cache.OUTCOMES),
            "read_bytes": handle.io_stats_incremental().read_bytes,
            "arrays": found.matches.arrays(),
            "matched": found.matched_rows,
        }
    )


def _hold_the_lock(uri: str, computing: Any) -> None:
    """Take the entry's lock and never finish computing."""
    source = pinned(uri)

    def compute() -> Any:
        computing.set()
        time.sleep(3600)

    cached_survey(source, compute)


def _blocked_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` waits for a file lock (``->`` lines of /proc/locks are waiters)."""
    return any("->" in line and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines())


def test_processes_started_together_survey_once_and_get_the_same_plan(uri: str, cache_dir: Path) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    source = pinned(uri)
    workers = [context.Process(target=_survey_at_barrier, args=(source, barrier, results)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=240) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    outcomes = sorted(next(iter(r["outcomes"])) for r in reports)
    assert outcomes == ["computed"] + ["loaded"] * (PROCESSES - 1)
    scanned = [r["read_bytes"] for r in reports]
    assert sorted(scanned)[:-1] == [0] * (PROCESSES - 1), f"more than one process read the dataset: {scanned}"
    assert max(scanned) > 100_000, scanned  # the one filter scan read the label column
    expected = expected_positions(uri, FILTER)
    first = reports[0]["arrays"]
    for report in reports:
        assert report["matched"] == len(expected)
        assert first.keys() == report["arrays"].keys()
        assert all(np.array_equal(first[name], report["arrays"][name]) for name in first)
    assert len(entries(cache_dir)) == 1


def test_a_process_killed_holding_the_lock_does_not_block_the_others(uri: str, cache_dir: Path) -> None:
    context = multiprocessing.get_context("spawn")
    computing, results = context.Event(), context.Queue()
    holder = context.Process(target=_hold_the_lock, args=(uri, computing))
    holder.start()
    assert computing.wait(240), "the holder never started computing"
    waiter = context.Process(target=_survey_at_barrier, args=(pinned(uri), None, results))
    waiter.start()
    deadline = time.monotonic() + 240
    while not _blocked_on_a_lock(waiter.pid):
        assert time.monotonic() < deadline and waiter.is_alive(), "the waiter never waited on the lock"
        time.sleep(0.05)
    os.kill(holder.pid, signal.SIGKILL)
    report = results.get(timeout=240)
    waiter.join(60)
    holder.join(60)
    assert holder.exitcode == -signal.SIGKILL and waiter.exitcode == 0
    assert report["outcomes"] == {"computed": 1}  # it found no entry, and surveyed itself
    assert report["matched"] == len(expected_positions(uri, FILTER))
    assert len(entries(cache_dir)) == 1 and not list(cache_dir.glob("*.tmp-*"))


# -- keys -----------------------------------------------------------------------------------------
def test_another_filter_or_version_gets_its_own_entry(tmp_path: Path, cache_dir: Path) -> None:
    uri = write_random(tmp_path / "ds.lance")
    version = pinned(uri).version
    first = surveyed(pinned(uri))
    assert first.outcome == "computed"
    other = surveyed(pinned(uri, "label < 20"))
    assert other.outcome == "computed" and np.array_equal(positions(other), expected_positions(uri, "label < 20"))
    appended = pa.table({"id": np.arange(ROWS, ROWS + 1000, dtype=np.int64), "label": np.zeros(1000, np.int32)})
    lance.write_dataset(appended, uri, mode="append")
    latest = surveyed(pinned(uri))
    assert latest.outcome == "computed" and latest.matches.rows == first.matches.rows + 1000
    again = surveyed(pinned(uri, version=version))
    assert again.outcome == "loaded" and np.array_equal(positions(again), positions(first))
    assert surveyed(pinned(uri, "label < 20", version)).outcome == "loaded"
    assert len(entries(cache_dir)) == 3


def test_a_dataset_rewritten_at_the_same_uri_and_version_is_not_served_the_old_entry(
    tmp_path: Path, cache_dir: Path
) -> None:
    uri = write_random(tmp_path / "ds.lance", seed=1)
    before = pinned(uri)
    assert surveyed(before).outcome == "computed"
    shutil.rmtree(uri)
    write_random(tmp_path / "ds.lance", seed=2)  # same path, version, row count and deletions
    after = pinned(uri)
    assert (after.version, after.total_rows) == (before.version, before.total_rows)
    found = surveyed(after)
    assert found.outcome == "computed"
    assert np.array_equal(positions(found), expected_positions(uri, FILTER))
    assert len(entries(cache_dir)) == 2


# -- damage ---------------------------------------------------------------------------------------
def _flip_last_byte(entry: Path, _other: Path) -> None:
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0x01
    entry.write_bytes(bytes(data))


def _damage_frame_and_rehash(entry: Path, _other: Path) -> None:
    """A writer's bug, not a disk's: the digest matches, the compressed arrays do not parse."""
    data = bytearray(entry.read_bytes())
    data[-8:] = b"\xff" * 8
    start = len(MAGIC) + 32
    data[len(MAGIC) : start] = hashlib.sha256(data[start:]).digest()
    entry.write_bytes(bytes(data))


DAMAGE = {
    "flipped byte": _flip_last_byte,
    "frame damaged, digest remade": _damage_frame_and_rehash,
    "truncated": lambda entry, _other: entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2]),
    "empty": lambda entry, _other: entry.write_bytes(b""),
    "header only": lambda entry, _other: entry.write_bytes(MAGIC),
    "another survey's entry": lambda entry, other: shutil.copyfile(other, entry),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_detected_and_recomputed(
    uri: str, cache_dir: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = pinned(uri)
    expected = positions(surveyed(source))
    surveyed(pinned(uri, "label < 20"))
    entry, other = sorted(entries(cache_dir), key=lambda path: path.stat().st_mtime)
    DAMAGE[damage](entry, other)
    with caplog.at_level(logging.WARNING, logger="lance_lightning"):
        again = surveyed(source)
    assert again.outcome == "computed" and np.array_equal(positions(again), expected)
    assert any(str(entry) in record.getMessage() and "damaged" in record.getMessage() for record in caplog.records)
    reloaded = surveyed(source)  # the entry was replaced by a good one
    assert reloaded.outcome == "loaded" and np.array_equal(positions(reloaded), expected)


# -- bound and settings ---------------------------------------------------------------------------
def test_the_entry_bound_evicts_the_least_recently_used(
    uri: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ENTRIES, "2")
    filters = ["label < 10", "label < 20", "label < 30"]
    for flt in filters[:2]:
        assert surveyed(pinned(uri, flt)).outcome == "computed"
    assert surveyed(pinned(uri, filters[0])).outcome == "loaded"  # now the most recently used
    assert surveyed(pinned(uri, filters[2])).outcome == "computed"  # evicts filters[1]
    assert len(entries(cache_dir)) == 2 and len(list(cache_dir.glob("*.lock"))) == 2
    assert surveyed(pinned(uri, filters[0])).outcome == "loaded"
    assert surveyed(pinned(uri, filters[1])).outcome == "computed"


def test_the_byte_bound_evicts_and_a_survey_larger_than_it_is_not_cached(
    uri: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert surveyed(pinned(uri)).outcome == "computed"
    (size,) = [path.stat().st_size for path in entries(cache_dir)]
    monkeypatch.setenv(ENV_GB, str(size * 1.5 / 1e9))  # room for one entry
    assert surveyed(pinned(uri, "label < 11")).outcome == "computed"
    assert len(entries(cache_dir)) == 1 and surveyed(pinned(uri)).outcome == "computed"
    monkeypatch.setenv(ENV_GB, str(size / 2 / 1e9))
    assert surveyed(pinned(uri, "label < 12")).outcome == "computed"
    assert surveyed(pinned(uri, "label < 12")).outcome == "computed"  # never written


def test_off_surveys_in_every_process_and_writes_nothing(
    uri: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert [surveyed(pinned(uri)).outcome for _ in range(2)] == ["off", "off"]
    assert not cache_dir.exists()


@pytest.mark.parametrize(
    ("name", "value"), [(ENV_SWITCH, "maybe"), (ENV_GB, "-1"), (ENV_ENTRIES, "1.5"), (ENV_DIR, "file")]
)
def test_a_bad_setting_is_a_config_error_naming_it(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    if value == "file":
        (tmp_path / "a_file").write_text("")
        value = str(tmp_path / "a_file" / "surveys")  # cannot be made under a file
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        surveyed(pinned(uri))
    assert raised.value.param == name and raised.value.value == value
    assert raised.value.fix


def test_a_default_directory_that_cannot_be_made_leaves_the_survey_uncached(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a_file").write_text("")
    monkeypatch.delenv(ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))
    with caplog.at_level(logging.WARNING, logger="lance_lightning"):
        found = surveyed(pinned(uri))
    assert found.outcome == "off" and np.array_equal(positions(found), expected_positions(uri, FILTER))
    assert any("survey cache directory" in record.getMessage() for record in caplog.records)
