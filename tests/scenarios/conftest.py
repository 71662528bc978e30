"""Fixtures shared by the resume scenarios (test_resume_exact.py, test_resume_interrupted.py,
test_resume_restore.py). A module that defines its own ``uri`` fixture uses that one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import ROWS
from tests.helpers import write_dataset


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """300 rows (ids 0..299, label = id % 10) in 3 fragments."""
    return write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=100)
