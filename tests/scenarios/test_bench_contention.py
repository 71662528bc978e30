"""`benchmarks.harness.contention.BusyLoops` (``run --busy N``): the processes it starts each spin
in a session of their own, all of them end at `stop`, and the result file says they ran."""

from __future__ import annotations

import os
import time

import psutil

from benchmarks.harness import report
from benchmarks.harness.contention import BusyLoops


def test_busy_loops_spin_each_in_its_own_session_until_stopped() -> None:
    busy = BusyLoops(2).start()
    try:
        pids = busy.pids
        assert len(set(pids)) == 2
        assert all(os.getsid(pid) == pid for pid in pids), "each loop leads a session of its own"
        assert os.getsid(0) not in pids
        deadline = time.monotonic() + 120  # CPU seconds accrue however loaded the machine is; no margin
        while min(psutil.Process(pid).cpu_times().user for pid in pids) < 0.2:
            assert time.monotonic() < deadline, "a busy loop never ran"
            time.sleep(0.1)
    finally:
        busy.stop()
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert busy.pids == []


def test_no_busy_loop_starts_nothing_and_says_nothing() -> None:
    with BusyLoops(0) as busy:
        assert busy.pids == []
    assert busy.describe() == ""


def test_the_result_file_says_how_many_loops_ran_beside_the_cells() -> None:
    rows = {"rows": 3000, "rows_per_s": 1000.0, "first_batch_s": 0.01, "build_s": 0.5, "quality": 1.0}
    rows |= {"read_bytes": 1, "read_calls": 1, "rss_mb": 1.0, "cpu_s": 0.3, "epochs": 1, "check": "ok"}
    raw = {"results": {"scan/ours/3k/0/local": [rows]}, "cells": [["scan", "ours", "3k", "0", "local"]]}
    raw |= {"suite": None, "selector": "scan", "stamp": "now", "seconds": 1.0, "command": "cmd", "machine": "m"}
    raw |= {"load_average": "1, 1, 1", "reps": 1, "seconds_per_cell": 0.3}
    assert "busy-loop" not in report.render(raw)
    text = report.render(raw | {"contention": BusyLoops(2).describe()})
    assert "Contention: 2 busy-loop process(es), each in a session of its own (`--busy 2`)" in text
    assert "| 100 |" in text  # CPU ms / 1k rows: 0.3 s over 3,000 rows
