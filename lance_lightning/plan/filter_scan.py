"""Evaluating a source's filter once, in a child process when the dataset is large.

Guarantees:
- `find_matches(source)` returns the `RowSet` of the pinned version's rows that match the
  filter, from one streaming scan (`lance_lightning.plan.rowset.scan_matches`): the same
  structure, whichever process scanned.
- From `CHILD_SCAN_ROWS` rows up the scan runs in a child Python process
  (``python -m lance_lightning.plan.filter_scan``). The heap that Lance's threads leave behind
  after scanning (glibc keeps it in per-thread arenas) leaves with the child; only the result's
  arrays come back, through one temporary file without a name (``O_TMPFILE``; elsewhere unlinked
  as soon as it is created) that the child writes through an inherited descriptor and this
  process reads once: a kill of either process, at any moment, leaves nothing in the temp
  directory (the kernel frees the file with its last descriptor). A 10% filter of
  10^8 rows left 93 MB in the process that scanned it and 2 MB in the parent of a child; of 10^9
  rows, 188 MB and 82 MB (a 71 MiB row set; benchmarks/results/filter_scan.md). Smaller datasets
  scan in process: a child added 0.24-0.27 s at 10^6-10^7 rows.
- The child imports lance_lightning from where this process did, imports neither torch nor
  Lightning, dies with its parent
  (`lance_lightning.lifetime.ParentWatch`), and reads the source, storage options (credentials)
  included, from its stdin: never from its command line.
- A child that fails raises `DataReadError` naming the URI, version and filter, with the child's
  last error line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from lance_lightning.errors import DataReadError
from lance_lightning.plan.rowset import RowSet, rowset_from_arrays, scan_matches
from lance_lightning.source import PinnedSource

#: Datasets of at least this many rows are scanned in a child process (10^8 rows: 1.12 s in a
#: child, 1.56 s in process; benchmarks/results/filter_scan.md).
CHILD_SCAN_ROWS = 1 << 25


def find_matches(source: PinnedSource, child_from_rows: int | None = None) -> RowSet:
    """The rows of ``source`` matching its filter (see the module docstring); in a child process
    from ``child_from_rows`` rows up (default `CHILD_SCAN_ROWS`)."""
    assert source.filter is not None
    if source.total_rows < (CHILD_SCAN_ROWS if child_from_rows is None else child_from_rows):
        return scan_matches(source.open(), source.filter, source.total_rows)
    with tempfile.TemporaryFile(prefix="lance-lightning-filter-") as out:
        request = {
            "uri": source.location,
            "version": source.version,
            "storage_options": source.storage_options,
            "filter": source.filter,
            "total_rows": source.total_rows,
            "out_fd": out.fileno(),
        }
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(os.getpid())],  # the parent it must die with
            input=json.dumps(request),
            capture_output=True,
            text=True,
            check=False,
            env=_child_env(),
            pass_fds=(out.fileno(),),
        )
        if done.returncode != 0:
            last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no output")
            raise DataReadError(
                f"evaluating filter {source.filter!r} on {source.uri} (version {source.version}) failed in its "
                f"child process (exit {done.returncode}): {last}",
                uri=source.uri,
                version=source.version,
                what=f"filter {source.filter!r}",
                attempts=1,
                transient=False,
            )
        out.seek(0)  # the child wrote through a descriptor that shares this file's offset
        with np.load(out) as arrays:
            return rowset_from_arrays({name: arrays[name] for name in arrays.files})


def _child_env() -> dict[str, str]:
    """This environment, with the folder this package was imported from first on the child's path."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _child() -> None:
    """The child's side: scan, write the result's arrays, exit."""
    from lance_lightning.lifetime import ParentWatch

    ParentWatch(parent=int(sys.argv[1])).start()  # also if the parent died while this module was imported
    import lance

    request = json.loads(sys.stdin.read())
    dataset = lance.dataset(request["uri"], version=request["version"], storage_options=request["storage_options"])
    found = scan_matches(dataset, request["filter"], request["total_rows"])
    with os.fdopen(request["out_fd"], "wb") as out:
        np.savez(out, **found.arrays())  # type: ignore[arg-type]  # numpy's stub: **kwds typed as allow_pickle's bool


if __name__ == "__main__":
    _child()
