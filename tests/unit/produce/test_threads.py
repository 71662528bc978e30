"""The reader threads run torch on one intra-op thread; the thread that starts them keeps its own."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import torch
from lance_lightning.produce.threads import ReaderThreads
threads = ReaderThreads(2)
work = lambda n: (torch.ones(n, n) @ torch.ones(n, n), torch.get_num_threads())
ahead = threads.ahead("transform", work, [64] * 4, 2)
inside = {count for _, count in ahead}
threads.stop()
print(sorted(inside), torch.get_num_threads())
"""


def test_the_training_thread_keeps_its_intra_op_threads() -> None:
    # A fresh interpreter whose training thread asks torch nothing before the pools start.
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": "2"}
    ).stdout.strip()
    assert out == "[1] 2", out


def test_inline_first_runs_the_first_item_on_the_calling_thread_and_keeps_the_order() -> None:
    """With ``inline_first`` the first item is done before any is submitted (no thread has to start
    for the first result); the results come in the items' order, as without it."""
    import threading

    from lance_lightning.produce.threads import ReaderThreads

    threads = ReaderThreads(2)
    caller = threading.get_ident()
    try:
        for inline in (False, True):
            ahead = threads.ahead("read", lambda n: (n * n, threading.get_ident()), range(7), 2, inline_first=inline)
            results = list(ahead)
            assert [value for value, _ in results] == [n * n for n in range(7)]
            assert (results[0][1] == caller) is inline
            assert all(ident != caller for _, ident in results[1:])
        assert list(threads.ahead("read", lambda n: n, [], 2, inline_first=True)) == []
    finally:
        threads.stop()
