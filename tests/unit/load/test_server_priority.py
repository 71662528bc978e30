"""The stock fork server's imports yield the CPU to the training process when the race starts it, and
only then; its workers run at the training process's priority either way (#51).

Beside two busy loops on 2 cores the race read a GIL-holding transform in process at 0.40x-0.70x
the rows/s of ``num_workers=0`` for 8 epochs (benchmarks/results/worker_gate_gil_busy_before.md): the
server's imports (seconds of CPU) took half of the training process's share of the machine. Now
the server imports on a thread at nice 19 (`lance_lightning.load._forkserver`). Each case runs in a
process of its own, forked from the test zygote (the fork server is one per process, and an
earlier test's may run here; the zygote never starts one): the
data module's ``setup`` starts the server, and a process the server forks reports its own nice and
the one the imports ran at.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_lightning.load.forked_server import ENV_SWITCH as FORKED_SERVER
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.import_pace import IMPORT_SHARE_ENV
from lance_lightning.load.race import CHOICE_SWITCH
from tests import zygote

REPO_ROOT = Path(__file__).resolve().parents[3]

_SCRIPT = """
import json, os, sys
import lance_lightning as ll
from lance_lightning.load.lean_start import worker_context
from tests.worker_probe import PythonRows, report_priority

transform = PythonRows(rounds=1)  # holds the GIL: setup starts the fork server
dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1]), batch_size=8, num_workers=2, transform=transform)
dm.setup("fit")
context = worker_context("forkserver", transform)
ours, theirs = context.Pipe(duplex=False)
child = context.Process(target=report_priority, args=(theirs,))
child.start()
report = ours.recv()
child.join()
print(json.dumps({**report, "trainer_nice": os.getpriority(os.PRIO_PROCESS, 0)}))
"""


@pytest.fixture(scope="module")
def vec_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("priority")
    (folder / "report_priorities.py").write_text(_SCRIPT)
    uri = str(folder / "vec.lance")
    vec = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    table = pa.table({"id": pa.array(range(64), pa.int64()), "vec": pa.FixedSizeListArray.from_arrays(vec.ravel(), 4)})
    lance.write_dataset(table, uri)
    return uri


def _priorities(uri: str, choice: str | None, share: str | None = None) -> dict:
    env = {k: v for k, v in zygote.zygote_env().items() if k not in (CHOICE_SWITCH, HANDOFF, IMPORT_SHARE_ENV)}
    env[FORKED_SERVER] = "off"  # the stock server, which imports (a forked one imports nothing: test_forked_server)
    if share is not None:
        env[IMPORT_SHARE_ENV] = share
    if choice is not None:
        env[CHOICE_SWITCH] = choice
    script = str(Path(uri).with_name("report_priorities.py"))
    proc = zygote.run([sys.executable, script, uri], cwd=REPO_ROOT, env=env, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_race_starts_a_server_whose_imports_yield_and_whose_workers_do_not(vec_uri: str) -> None:
    report = _priorities(vec_uri, None)
    assert report["import_nice"] == 19 and report["import_slept"] == 0, report
    assert report["nice"] == report["trainer_nice"], f"a forked worker runs at another priority: {report}"


def test_a_forced_outcome_starts_a_server_at_the_training_process_priority(vec_uri: str) -> None:
    report = _priorities(vec_uri, "workers")
    assert report["import_nice"] == report["trainer_nice"] == report["nice"], report


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_variable_paces_the_yielding_imports_of_the_server_the_data_module_starts(vec_uri: str) -> None:
    # LANCE_LIGHTNING_FORKSERVER_IMPORT_SHARE as a user sets it: the server `setup` starts slept.
    report = _priorities(vec_uri, None, share="0.5")
    assert report["import_nice"] == 19 and report["import_slept"] > 0, report
