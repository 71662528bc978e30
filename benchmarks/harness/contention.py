"""Other programs competing for the CPU, made on purpose: ``run --busy N``.

Guarantees:
- `BusyLoops` runs ``count`` processes that each spin in pure Python (one core's demand each),
  every one in a session of its own (on Linux each session is its own autogroup, so each competes
  with the benchmark's cell as another user's program would, not as threads of the cell's group).
  They start before the first cell and end at `stop` (SIGKILL to each one's process group), also
  when the run fails: a run under contention is reproducible instead of depending on whatever
  else the machine runs.
- ``count`` 0 starts nothing. `describe` is the sentence the result file's header carries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

SPIN = "while True:\n    pass\n"


class BusyLoops:
    """``count`` busy-loop processes, each in its own session, from `start` to `stop`."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"--busy {count}: give a count of busy loops, 0 or more")
        self.count = count
        self._procs: list[subprocess.Popen] = []

    def start(self) -> BusyLoops:
        for _ in range(self.count):
            self._procs.append(
                subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True, stdin=subprocess.DEVNULL)
            )
        return self

    def stop(self) -> None:
        for proc in self._procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        self._procs.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> BusyLoops:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def describe(self) -> str:
        if not self.count:
            return ""
        return (
            f"Contention: {self.count} busy-loop process(es), each in a session of its own (`--busy "
            f"{self.count}`), spun beside every cell from the first to the last."
        )
