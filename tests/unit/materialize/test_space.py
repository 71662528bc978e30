"""The disk-space messages of materialized views: needed and free sizes that differ read differently."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from lance_lightning.errors import MaterializeError
from lance_lightning.materialize.space import check_space, space_error
from lance_lightning.source import LanceSource, pin_source
from tests.helpers import write_dataset


def _free(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: type(usage)(usage.total, usage.used, nbytes))


def _sizes(message: str) -> tuple[str, str]:
    found = re.search(r"needs about (\S+) MB, (\S+) MB are free", message)
    assert found is not None, message
    return found.group(1), found.group(2)


@pytest.mark.parametrize(("needed", "free"), [(1_000_500, 1_000_000), (1_400_000, 1_300_000), (10_501_000, 10_500_000)])
def test_needed_and_free_sizes_that_differ_read_differently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, needed: int, free: int
) -> None:
    pinned = pin_source(LanceSource(write_dataset(tmp_path / "ds.lance", 10)), "train")
    _free(monkeypatch, free)
    with pytest.raises(MaterializeError) as refused:
        check_space(pinned, tmp_path, needed)
    shown: list[Any] = [_sizes(str(refused.value))]
    shown.append(_sizes(str(space_error(pinned, tmp_path, needed, OSError(28, "No space left on device"), 28))))
    for need, have in shown:
        assert need != have and float(need.replace(",", "")) >= needed / 1e6, (need, have)
    assert re.search(r": free 0\.\d*[1-9] MB or", str(refused.value)), str(refused.value)  # never "free 0 MB"
