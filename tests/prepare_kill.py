"""A prepare that SIGKILLs itself at a chosen moment, for the kill-and-rerun tests (the CLI scenario
and the contract checker). Moments: ``commit:N`` right after the writer's N-th unit commit,
``write:N`` after writing the files of unit N (before its commit; once units 0..N-1 are committed),
``index:N`` after the completion's first N indexes (before its record),
``rename`` after the completion commit, before the output is moved in place; and, instead of a
SIGKILL: ``pause:N`` after the N-th unit commit creates the file named by ``$PREPARE_PAUSED`` and
sleeps (until a SIGINT, say), ``worker:N`` makes the ``--pool processes`` worker that writes unit N
SIGKILL itself (spawned workers import this file as ``__mp_main__``, which arms them).

    python tests/prepare_kill.py MOMENT cli ARGS...        # lance-lightning prepare ARGS
    python tests/prepare_kill.py MOMENT spec SPEC_JSON OUT  # prepare(Prepare(**SPEC), OUT)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def arm(moment: str) -> None:
    """Make this process's prepare writer SIGKILL itself at ``moment``."""
    from lance_lightning.write import writer

    kind, _, n = moment.partition(":")
    real_commit, real_write, commits = writer.DatasetWriter.commit, writer.DatasetWriter.write_unit, []

    def kill(*_: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def commit(self, unit, *args):  # noqa: ANN001, ANN202
        real_commit(self, unit, *args)
        commits.append(unit.index)
        if kind == "commit" and len(commits) == int(n):
            kill()
        if kind == "pause" and len(commits) == int(n):
            Path(os.environ["PREPARE_PAUSED"]).write_text("paused")
            while True:
                time.sleep(0.05)

    def write_unit(self, unit, *args):  # noqa: ANN001, ANN202
        out = real_write(self, unit, *args)
        if kind == "write" and unit.index == int(n):
            # Units are written in parallel: wait for the commits of the units before it (they do not
            # need this one), so that the kill always leaves units 0..N-1 committed and N written only.
            deadline = time.monotonic() + 120
            while len(commits) < int(n) and time.monotonic() < deadline:
                time.sleep(0.01)
            kill()
        return out

    writer.DatasetWriter.commit, writer.DatasetWriter.write_unit = commit, write_unit
    if kind == "worker":
        os.environ[_WORKER_ENV] = n  # inherited by the spawned workers
    if kind == "rename":
        writer.os.replace = kill
    if kind == "index":  # after the first N of the completion's indexes, before its record
        real_build = writer.build_indexes

        def build_indexes(dataset, columns):  # noqa: ANN001, ANN202
            real_build(dataset, columns[: int(n)])
            kill()

        writer.build_indexes = build_indexes


#: The unit whose spawned worker SIGKILLs itself (moment ``worker:N``).
_WORKER_ENV = "PREPARE_KILL_WORKER"


def _arm_worker(unit_index: int) -> None:
    """In a spawned worker: SIGKILL this process when it starts writing unit ``unit_index``."""
    from lance_lightning.write import writer

    real_write = writer.DatasetWriter.write_unit

    def write_unit(self, unit, *args):  # noqa: ANN001, ANN202
        if unit.index == unit_index:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(self, unit, *args)

    writer.DatasetWriter.write_unit = write_unit


def main(argv: list[str]) -> None:
    moment, how, *rest = argv
    arm(moment)
    if how == "cli":
        from lance_lightning.cli.main import main as cli_main

        cli_main(["prepare", *rest])
    else:
        from lance_lightning.source import Prepare
        from lance_lightning.write.prepare import prepare

        prepare(Prepare(**json.loads(rest[0])), rest[1], progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
elif __name__ == "__mp_main__" and os.environ.get(_WORKER_ENV):
    _arm_worker(int(os.environ[_WORKER_ENV]))
