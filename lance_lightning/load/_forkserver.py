"""Preloaded by the stock fork server that starts DataLoader workers: the one started where the
server may not be a fork of the training process (`lance_lightning.load.forked_server`: Lance's
runtime already runs there, ``LANCE_LIGHTNING_FORKED_SERVER=off``, ...).

Guarantees: the server dies with the process that started it (`lance_lightning.lifetime`), and its
workers with it: the watch starts before anything else is imported (the imports take seconds, more
on a loaded machine; a server still importing outlived a SIGKILLed or SIGTERMed trainer by that
long, #51), for the pid the starting process left in ``LANCE_LIGHTNING_FORKSERVER_PARENT`` (a process that ended before
this line ends the server at once). The server then imports the readers (and with them torch,
Arrow and Lance) once, so workers fork ready to run. The server never opens a dataset,
which is the state the Lance fork tests found safe (20 of 20 clean), so Lance's generic fork
warning is silenced in it alone.

With ``LANCE_LIGHTNING_FORKSERVER_YIELD=1`` (set by the race, which reads in process while the
server starts: `lance_lightning.load.lean_start.ensure_server`) those imports run on a thread of
their own at nice 19 (Linux; priority is per thread there), so on a contended machine they take
the CPU the training process leaves idle instead of half of its share (#51: the race read a
GIL-holding transform at 0.40x-0.70x the rows/s of ``num_workers=0`` for 8 epochs beside two busy
loops while the server imported, benchmarks/results/worker_gate_gil_busy_before.md). The thread
that forks the workers keeps the server's priority, so the workers run at the training
process's. `IMPORT_NICE` is the nice the imports ran at. Priority gives back CPU, not the imports'
own work (reading and mapping the libraries): beside a ``num_workers=0`` read, a nice-19 import of
these modules cost it 0.91x-1.00x where a nice-19 Python loop cost nothing
(benchmarks/results/import_cost_gil.md, import_cost_gil_light.md). The yielding imports can also
be paced to a share of one core, for diagnosis (`lance_lightning.load.import_pace`; off by default).
"""

import os
import sys
import threading

from lance_lightning.lifetime import watch_parent
from lance_lightning.load.import_pace import ImportPacer, import_share
from lance_lightning.load.lean_start import PARENT_ENV, YIELD_ENV

_parent = os.environ.get(PARENT_ENV, "")
watch_parent(parent=int(_parent) if _parent.isdigit() else None)

import warnings  # noqa: E402

warnings.filterwarnings("ignore", message="lance is not fork-safe")

#: The nice value the server's imports ran at.
IMPORT_NICE = os.getpriority(os.PRIO_PROCESS, 0)
#: The seconds the pace of the server's imports slept (`lance_lightning.load.import_pace`).
IMPORT_SLEPT = 0.0


def _import_readers() -> None:
    import lance_lightning.load.dataset  # noqa: F401


def _import_yielding() -> None:
    """`_import_readers` on a thread at nice 19; its error, if any, raised here."""
    failed: list[BaseException] = []

    def run() -> None:
        global IMPORT_NICE, IMPORT_SLEPT
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            IMPORT_NICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        except OSError:  # a sandbox that forbids it: import at the server's priority
            pass
        pacer = ImportPacer(import_share())
        try:
            with pacer:
                _import_readers()
        except BaseException as error:  # noqa: BLE001  (re-raised on the server's thread)
            failed.append(error)
        IMPORT_SLEPT = pacer.slept

    thread = threading.Thread(target=run, name="lance-lightning-server-imports")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


if os.environ.get(YIELD_ENV) == "1" and sys.platform.startswith("linux"):
    _import_yielding()
else:
    _import_readers()
