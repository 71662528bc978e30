"""Shared fixtures. Test-specific fixtures belong in the test files that use them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# `tests.helpers` and `examples.digits` import from the repository root, whatever the cwd.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.helpers import write_dataset  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # DataLoader workers started by forkserver/spawn import `tests.helpers` by module path.
    paths = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), paths) if p)
    # The remote cache's default directory is under XDG_CACHE_HOME: tests never write to the user's.
    if "LANCE_LIGHTNING_TEST_CACHE" not in os.environ:
        import tempfile

        os.environ["LANCE_LIGHTNING_TEST_CACHE"] = tempfile.mkdtemp(prefix="lance-lightning-cache-")
        os.environ["XDG_CACHE_HOME"] = os.environ["LANCE_LIGHTNING_TEST_CACHE"]


@pytest.fixture
def dataset_uri(tmp_path: Path) -> str:
    """A 1000-row id/label/x/vec Lance dataset (see `tests.helpers.write_dataset`)."""
    return write_dataset(tmp_path / "ds.lance", 1000)


@pytest.fixture
def small_uri(tmp_path: Path) -> str:
    """A 100-row dataset in 4 fragments of 25 rows."""
    return write_dataset(tmp_path / "small.lance", 100, fragment_rows=25)


@pytest.fixture
def trainer_kwargs(tmp_path: Path) -> dict:
    """Quiet CPU Trainer arguments writing only under ``tmp_path``."""
    return dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """An S3-compatible server on loopback with a bucket ``data``, one per test module."""
    with S3Server.serving("data") as server:
        yield server
