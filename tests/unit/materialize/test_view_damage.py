"""A damaged view is never read: a view is bound to its files when it is copied (their sizes and
SHA-256 in ``<key>.json``), every reuse checks them, and a view whose data files were truncated,
deleted, replaced by other rows or had three bits flipped is copied again with one warning line that
names the view, the file and the check; the rows then equal the source's. An untouched view is reused
without reading its files or writing anything; a touched but intact file is re-read once and trusted.
``verify="checksum"`` also catches damage that leaves the change time alone. A view made before views
recorded their files, or one Lance cannot open, is copied again; one that cannot be copied again is a
`ConfigError` naming the view and the option, without Lance's traceback, and a later run recovers.

Everything is real: Lance datasets in ``tmp_path``, damaged on disk by `tests.helpers.damage_cached_copy`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import lance
import pytest

from lance_lightning import ConfigError, LanceSource, MaterializedView, RemoteCache
from lance_lightning.materialize.copy import bind_files, file_stats, stamp
from lance_lightning.materialize.view import materialize_view
from lance_lightning.read.retry import RetryPolicy
from tests.helpers import DAMAGE_KINDS, damage_cached_copy
from tests.unit.materialize.view_helpers import COLUMNS, FILTER, expected_ids, ids, snapshot

VIEW_LOG = "lance_lightning.materialize.view"
#: The check that finds each kind of damage, as the warning line names it.
CHECK = {"truncate": "(size check)", "delete": "is missing (file set check)", "flip": "SHA-256", "replace": "SHA-256"}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == VIEW_LOG and r.levelno >= logging.WARNING]


def _source(uri: str) -> LanceSource:
    return LanceSource(uri, columns=COLUMNS, filter=FILTER)


def _manifest(view: str) -> dict:
    return json.loads(Path(view).with_suffix(".json").read_text())


def _write_manifest(view: str, manifest: dict) -> None:
    Path(view).with_suffix(".json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_a_damaged_view_is_copied_again_with_one_line_and_reads_the_source_rows(
    tmp_path: Path, source_uri: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache, chunk_rows=300)  # 3 data files
    expected = lance.dataset(made.uri).to_table()
    sizes = {name: record["bytes"] for name, record in made.manifest["files"].items()}
    damaged = damage_cached_copy(made.uri, kind)
    names = [path.relative_to(made.uri).as_posix() for path in damaged]
    if kind in ("flip", "replace"):  # the damage Lance would read silently: other rows, same size
        assert lance.dataset(made.uri).to_table() != expected
        assert all(Path(made.uri, name).stat().st_size == sizes[name] for name in names)

    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    again = materialize_view(_source(source_uri), cache, chunk_rows=300)
    assert not again.reused and again.uri == made.uri and again.chunks == 3
    assert lance.dataset(again.uri).to_table() == expected
    assert ids(again.uri) == expected_ids(FILTER)
    (line,) = _warnings(caplog)
    assert "\n" not in line and made.uri in line and "copying it again" in line, line
    assert any(name in line for name in names) and CHECK[kind] in line, line

    caplog.clear()
    before = snapshot(cache)
    reused = materialize_view(_source(source_uri), cache, chunk_rows=300)
    assert reused.reused and reused.chunks == 0 and not _warnings(caplog)
    assert snapshot(cache) == before


def test_an_untouched_view_is_reused_by_stat_alone_and_a_touched_one_is_re_read_once(
    tmp_path: Path, source_uri: str
) -> None:
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache, chunk_rows=300)
    files = made.manifest["files"]
    assert {name.split("/")[0] for name in files} >= {"data", "_versions"}
    assert all(len(record["sha256"]) == 64 and record["bytes"] > 0 for record in files.values())
    before = snapshot(cache)
    reused = materialize_view(_source(source_uri), cache, chunk_rows=300)
    assert reused.reused and reused.chunks == 0
    assert reused.verified.startswith(f"{len(files)} files checked by size and change time"), reused.verified
    assert "re-read" not in reused.verified
    assert snapshot(cache) == before, "reusing an untouched view wrote something"

    data = next(Path(made.uri, "data").glob("*.lance"))
    os.utime(data)  # touched, not changed: re-read by SHA-256, trusted, remembered
    touched = materialize_view(_source(source_uri), cache, chunk_rows=300)
    assert touched.reused and "1 re-read by SHA-256" in touched.verified, touched.verified
    recorded = _manifest(made.uri)["checked"]["stamps"]
    assert recorded[data.relative_to(made.uri).as_posix()] == stamp(data.stat())
    after = snapshot(cache)
    again = materialize_view(_source(source_uri), cache, chunk_rows=300)
    assert again.reused and "re-read" not in again.verified and snapshot(cache) == after


def test_checksum_mode_catches_damage_that_leaves_the_change_time(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bit rot below the file system changes no ctime: simulated by recording the damaged files'
    stamps as checked (by an earlier process). ``stat`` trusts them (the documented limit);
    ``checksum`` re-reads every file and copies the view again."""
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache, chunk_rows=300)
    expected = lance.dataset(made.uri).to_table()
    damage_cached_copy(made.uri, "flip")
    manifest = _manifest(made.uri)
    stats = file_stats(Path(made.uri))
    manifest["checked"] = {"at": 0.0, "full": True, "stamps": {name: stamp(st) for name, st in stats.items()}}
    _write_manifest(made.uri, manifest)
    assert materialize_view(_source(source_uri), cache, chunk_rows=300).reused  # verify="stat"

    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    checked = materialize_view(_source(source_uri), cache, chunk_rows=300, verify="checksum")
    assert not checked.reused and lance.dataset(checked.uri).to_table() == expected
    (line,) = _warnings(caplog)
    assert "SHA-256 check)" in line and "changed on disk" not in line, line
    # Once per process: the copy this process just made is not re-read.
    again = materialize_view(_source(source_uri), cache, chunk_rows=300, verify="checksum")
    assert again.reused and "re-read" not in again.verified


def test_checksum_mode_re_reads_an_intact_view_once_per_process(tmp_path: Path, source_uri: str) -> None:
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache, chunk_rows=300)
    manifest = _manifest(made.uri)
    manifest["checked"]["at"] = 0.0  # checked before this process started
    _write_manifest(made.uri, manifest)
    files = len(manifest["files"])
    first = materialize_view(_source(source_uri), cache, chunk_rows=300, verify="checksum")
    assert first.reused and f"{files} re-read by SHA-256" in first.verified, first.verified
    assert _manifest(made.uri)["checked"]["full"], "the full check is recorded for the node's other ranks"
    second = materialize_view(_source(source_uri), cache, chunk_rows=300, verify="checksum")
    assert second.reused and "re-read" not in second.verified, second.verified


def test_two_writers_of_a_damaged_view_copy_it_again_once(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two ranks of a node find the same damaged view: the first (under the writer lock) copies it
    again, the second then checks the new copy and reuses it; one line in all."""
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache, chunk_rows=300)
    damage_cached_copy(made.uri, "replace")
    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(materialize_view(_source(source_uri), cache, chunk_rows=300)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(r.reused for r in results) == [False, True]
    assert len(_warnings(caplog)) == 1 and ids(made.uri) == expected_ids(FILTER)


def test_a_view_made_before_views_recorded_their_files_is_copied_again(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache)
    old = {k: v for k, v in _manifest(made.uri).items() if k not in ("files", "checked")}
    _write_manifest(made.uri, {**old, "format": 1})
    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    again = materialize_view(_source(source_uri), cache)
    assert not again.reused and again.uri == made.uri and ids(again.uri) == expected_ids(FILTER)
    (line,) = _warnings(caplog)
    assert "made before copies recorded their files" in line and made.uri in line, line
    assert "files" in _manifest(made.uri)


def test_a_view_lance_cannot_open_is_copied_again(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A view whose files match their record but that Lance cannot open (its version manifest was
    broken before it was recorded): the read error is damage too."""
    cache = tmp_path / "views"
    made = materialize_view(_source(source_uri), cache)
    latest = max(Path(made.uri, "_versions").glob("*.manifest"), key=lambda p: p.stat().st_mtime_ns)
    os.truncate(latest, 40)
    manifest = _manifest(made.uri)
    manifest["files"], stamps = bind_files(Path(made.uri))
    manifest["checked"] = {"at": 0.0, "full": True, "stamps": stamps}
    _write_manifest(made.uri, manifest)
    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    again = materialize_view(_source(source_uri), cache)
    assert not again.reused and ids(again.uri) == expected_ids(FILTER)
    (line,) = _warnings(caplog)
    assert "Lance cannot open it" in line and "\n" not in line, line


def test_a_damaged_view_that_cannot_be_copied_again_is_one_config_error(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache, source = tmp_path / "views", LanceSource(source_uri, columns=COLUMNS)  # no filter: pinning reads no rows
    made = materialize_view(source, cache, param="train")
    damage_cached_copy(made.uri, "truncate")
    backup = tmp_path / "backup.lance"
    shutil.copytree(source_uri, backup)
    for data in Path(source_uri, "data").glob("*.lance"):
        data.unlink()  # the source opens (its manifest), but its rows are gone
    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    with pytest.raises(ConfigError) as raised:
        materialize_view(source, cache, param="train", retry=RetryPolicy(attempts=1))
    error = raised.value
    text = str(error)
    assert error.param == "materialize.cache_dir" and made.uri in text and "(size check)" in text, text
    assert "copying it again failed" in text and "Fix:" in text and "drop `materialize`" in text, text
    assert "\n" not in text and len(text) < 1500 and "Traceback" not in text, text
    assert error.__cause__ is None and error.__suppress_context__, "Lance's traceback would be chained"
    assert not Path(made.uri).with_suffix(".json").exists(), "the damaged view must not stay readable"
    assert len(_warnings(caplog)) == 1

    shutil.rmtree(source_uri)
    shutil.copytree(backup, source_uri)  # the source is readable again: the next run recovers
    again = materialize_view(source, cache, param="train")
    assert not again.reused and again.uri == made.uri and ids(again.uri) == list(range(2000))


def test_reopen_copies_a_damaged_checkpoint_view_again(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = MaterializedView(cache_dir=str(tmp_path / "views"))
    made = materialize_view(_source(source_uri), config.cache_dir)
    damage_cached_copy(made.uri, "replace")
    caplog.set_level(logging.INFO, logger=VIEW_LOG)
    assert config.reopen(made.uri) == LanceSource(uri=made.uri, columns=COLUMNS)
    assert ids(made.uri) == expected_ids(FILTER)
    (line,) = _warnings(caplog)
    assert made.uri in line and "SHA-256" in line, line


def test_damage_helper_refuses_what_it_cannot_damage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no copy"):
        damage_cached_copy(tmp_path, "flip")
    (tmp_path / "x.lance").mkdir()
    with pytest.raises(ValueError, match="kind must be one of"):
        damage_cached_copy(tmp_path / "x.lance", "burn")


@pytest.mark.parametrize("config", [RemoteCache, lambda **kw: MaterializedView(cache_dir="/tmp/views", **kw)])
def test_an_unknown_verify_mode_names_the_option(config: object) -> None:
    with pytest.raises(ConfigError) as raised:
        config(verify="sha1")  # type: ignore[operator]
    assert raised.value.param.endswith(".verify") and "checksum" in raised.value.fix
