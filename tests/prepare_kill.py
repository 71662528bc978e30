"""A prepare that SIGKILLs itself at a chosen moment, for the kill-and-rerun tests (the CLI scenario
and the contract checker). Moments: ``commit:N`` right after the writer's N-th unit commit,
``write:N`` after writing the files of unit N (before its commit; once units 0..N-1 are committed),
``rename`` after the completion commit, before the output is moved in place.

    python tests/prepare_kill.py MOMENT cli ARGS...        # lance-lightning prepare ARGS
    python tests/prepare_kill.py MOMENT spec SPEC_JSON OUT  # prepare(Prepare(**SPEC), OUT)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


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
    if kind == "rename":
        writer.os.replace = kill


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
