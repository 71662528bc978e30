"""`ImportPacer` (the fork server's diagnostic pace, #51): the entering thread's imports keep its
CPU time at most ``share`` of the wall time, other threads' are never delayed, nothing is left in
``sys.meta_path``; `import_share` reads the variable, anything but a share in (0, 1] is 1."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from lance_lightning.load.import_pace import IMPORT_SHARE_ENV, ImportPacer, import_share

#: Each module burns this much of its thread's CPU when imported.
BURN_S = 0.02
MODULES = 12
BURN = f"import time\nstart = time.thread_time()\nwhile time.thread_time() - start < {BURN_S}:\n    pass\n"


def _modules(tmp_path: Path, prefix: str) -> list[str]:
    names = [f"{prefix}_{tmp_path.name.replace('-', '_')}_{i}" for i in range(MODULES)]
    for name in names:
        (tmp_path / f"{name}.py").write_text(BURN)
    return names


def test_the_entering_thread_s_imports_keep_its_cpu_within_the_share(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    names = _modules(tmp_path, "paced")
    entries = list(sys.meta_path)
    started = time.monotonic()
    with ImportPacer(0.25) as pacer:
        cpu = time.thread_time()
        for name in names:
            __import__(name)
        cpu = time.thread_time() - cpu
    wall = time.monotonic() - started
    assert sys.meta_path == entries, "the pacer was left in sys.meta_path"
    # Paced before each module: by the last one's start, wall >= CPU so far / share (load only adds).
    assert wall >= (cpu - 2 * BURN_S) / 0.25, (wall, cpu)
    assert pacer.slept > 0


def test_other_threads_imports_are_not_paced(tmp_path: Path, monkeypatch) -> None:
    # Entered on a fresh thread (its CPU clock near 0), so a pacer that paced every thread by the
    # entering thread's budget would sleep for the other thread's imports.
    monkeypatch.syspath_prepend(str(tmp_path))
    names = _modules(tmp_path, "unpaced")
    paced: list[ImportPacer] = []

    def enter() -> None:
        with ImportPacer(0.01) as pacer:
            paced.append(pacer)
            other = threading.Thread(target=lambda: [__import__(name) for name in names])
            other.start()
            other.join()

    entering = threading.Thread(target=enter)
    entering.start()
    entering.join()
    assert paced[0].slept == 0 and all(name in sys.modules for name in names)


def test_a_share_of_one_core_paces_nothing() -> None:
    entries = list(sys.meta_path)
    with ImportPacer(1.0) as pacer:
        assert sys.meta_path == entries
        __import__("json")
    assert pacer.slept == 0 and sys.meta_path == entries


@pytest.mark.parametrize(
    ("value", "share"), [(None, 1.0), ("0.05", 0.05), ("1", 1.0), ("0", 1.0), ("-1", 1.0), ("2", 1.0), ("x", 1.0)]
)
def test_import_share_reads_a_share_of_one_core(monkeypatch, value: str | None, share: float) -> None:
    if value is None:
        monkeypatch.delenv(IMPORT_SHARE_ENV, raising=False)
    else:
        monkeypatch.setenv(IMPORT_SHARE_ENV, value)
    assert import_share() == share
