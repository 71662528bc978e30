"""Plain helpers shared by the materialized-view tests: the source's shape and how to read a view back.

The source every test copies has ``ROWS`` rows (``id`` 0..ROWS-1, ``label = id % 10``); ``FILTER`` keeps
labels 0..3 and ``COLUMNS`` is the column subset a view holds. The fixtures live in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np

ROWS, FILTER, COLUMNS = 2000, "label < 4", ["id", "x"]


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
