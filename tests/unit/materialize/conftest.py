"""Fixtures shared by the materialized-view tests (test_view_contents_and_reuse.py,
test_view_copy_failures.py, test_view_cli_and_datamodule.py): a local source and a moto S3 one.

``s3`` and ``s3_uri`` are module-scoped: each test module that uses them starts its own server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lance
import pytest

from tests.helpers import make_table, write_dataset
from tests.s3_server import S3Server
from tests.unit.materialize.view_helpers import ROWS


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
