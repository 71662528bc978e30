"""Preloaded by the forkserver that starts DataLoader workers.

Guarantees: the server dies with the process that started it (`lance_lightning.lifetime`), and its
workers with it: the watch starts before anything else is imported (the imports take seconds, more
on a loaded machine; a server still importing outlived a SIGKILLed or SIGTERMed trainer by that
long, #51), for the pid the starting process left in ``LANCE_LIGHTNING_FORKSERVER_PARENT`` (a process that ended before
this line ends the server at once). The server then imports the readers (and with them torch,
Arrow and Lance) once, so workers fork from it ready to run. The server never opens a dataset,
which is the state the Lance fork tests found safe (20 of 20 clean), so Lance's generic fork
warning is silenced in it alone.
"""

import os

from lance_lightning.lifetime import watch_parent
from lance_lightning.load.lean_start import PARENT_ENV

_parent = os.environ.get(PARENT_ENV, "")
watch_parent(parent=int(_parent) if _parent.isdigit() else None)

import warnings  # noqa: E402

warnings.filterwarnings("ignore", message="lance is not fork-safe")

import lance_lightning.load.dataset  # noqa: E402,F401
