"""A materialized view holds exactly the filtered column subset of its source, in source order or a
seeded permutation that does not depend on chunking, whether copied by filtered scan or by take of the
known matches, with a manifest beside it that records its rows, columns, filter and source version and,
for an S3 source, no credentials anywhere in its files. It is reused without a single write while the
source version is unchanged; a new source version gives a new view and leaves the old one intact; two
concurrent writers of one view copy it once.

Everything is real: Lance datasets in ``tmp_path`` or on a moto S3 server (loopback).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pytest

from lance_lightning import LanceSource
from lance_lightning.materialize.view import materialize_view
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.source import pin_source
from tests.helpers import append_rows
from tests.s3_server import S3Server
from tests.unit.materialize.view_helpers import COLUMNS, FILTER, ROWS, expected_ids, ids, leftovers, snapshot


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
