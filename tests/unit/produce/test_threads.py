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
