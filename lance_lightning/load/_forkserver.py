"""Preloaded by the forkserver that starts DataLoader workers.

Guarantees: the server imports the readers (and with them torch, Arrow and Lance) once, so
workers fork from it ready to run. The server never opens a dataset, which is the state the Lance fork
tests found safe (20 of 20 clean), so Lance's generic fork warning is silenced in it alone. The
server dies with the process that started it (`lance_lightning.lifetime`), and its workers with it.
"""

import warnings

warnings.filterwarnings("ignore", message="lance is not fork-safe")

import lance_lightning.load.dataset  # noqa: E402,F401
from lance_lightning.lifetime import watch_parent  # noqa: E402

watch_parent()
