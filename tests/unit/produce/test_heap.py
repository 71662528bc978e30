"""HeapTrimmer: freed heap pages go back to the OS after an epoch, at most once per interval."""

from __future__ import annotations

import sys

import psutil
import pytest

from lance_lightning.produce.heap import HeapTrimmer

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or HeapTrimmer()._libc is None,
    reason="malloc_trim is a glibc function (Linux)",
)


@glibc
def test_trim_returns_freed_holes_to_the_os() -> None:
    """100 MB of 2 kB blocks (malloc, not pymalloc), 9 in 10 freed: the holes stay resident
    (the kept blocks pin the heap's top) until the trimmer hands them back."""
    process = psutil.Process()
    blocks = [bytes(2000) + bytes([i % 256]) for i in range(50_000)]
    kept = blocks[::10]
    del blocks
    before = process.memory_info().rss
    HeapTrimmer(interval_s=0).after_epoch()
    after = process.memory_info().rss
    assert before - after > 30 * 2**20, f"RSS {before / 2**20:.0f} MB -> {after / 2**20:.0f} MB"
    assert len(kept) == 5_000


@glibc
def test_trims_at_most_once_per_interval() -> None:
    trimmer = HeapTrimmer(interval_s=3600)
    started = trimmer._last
    trimmer.after_epoch()  # an epoch right after the start: too soon
    assert trimmer._last == started
    trimmer.interval_s = 0
    trimmer.after_epoch()
    assert trimmer._last > started
