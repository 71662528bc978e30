"""Worker processes that start without running the training script again.

Guarantees:
- A process started through `LeanForkServerContext` skips the import of the parent's main module
  (the training script, or ``python -m`` module) that ``multiprocessing`` performs in every child,
  whenever nothing pickled to the process refers to that module (the script's imports, Lightning
  and model code, cost seconds per worker and per loader), or its server is a fork of this process
  (its workers hold the main module already, a notebook's too). When the payload does refer to it
  (a transform defined in the script), a stock server's child imports it as ``multiprocessing``
  always does, so the pickled objects resolve.
- Workers run the code this process runs, or do not start: `check_worker_launch` when a loader with
  workers is made, and every launch, refuse with a `ConfigError` a payload whose classes or
  functions the workers would hold in an older version or could not import
  (`lance_lightning.load.server_code`), and a transform that cannot be pickled. Where workers
  start through ``multiprocessing``'s own launch (``spawn``; ``forkserver`` without `lean_launch`),
  which tells each to run the main module again, a main module read from no file (``python -``)
  is refused the same way: every such worker would die as it starts.
- Everything else is the stock ``forkserver`` start: the same server, preload modules, ``sys.path``,
  working directory and ``argv`` (the preparation data keeps every other field).
- Only on the Python versions whose forkserver launch this mirrors (`LEAN_PYTHONS`), and unless
  ``LANCE_LIGHTNING_LEAN_WORKERS=off`` (for a script whose import sets up what workers need besides
  the objects sent to them); otherwise `worker_context` returns the stock context.
- `start_worker_server` starts the server ahead of the first loader (the data module's
  ``setup``, where `lance_lightning.load.handoff.start_server_early` decides): where it is safe, a
  fork of the training process, ready in milliseconds (`lance_lightning.load.forked_server`);
  else the stock server, whose imports (torch, Arrow, Lance: seconds) then overlap with planning
  and the model's set-up. Asked to
  (``yield_cpu``: the race starts it, to read in process meanwhile), the server runs those imports
  at the lowest priority, so they take only CPU this process leaves idle
  (`lance_lightning.load._forkserver`). The
  server's socket folder (``pymp-*``) gets its janitor first (`lance_lightning.lifetime.shared_temp_dir`):
  a training process SIGKILLed before its first worker starts leaves no folder behind.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import sys
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from typing import Any

from lance_lightning.checks import env_switch
from lance_lightning.errors import ConfigError
from lance_lightning.lifetime import shared_temp_dir
from lance_lightning.load.forked_server import ForkedServer, forked_code, running_server
from lance_lightning.load.server_code import (
    MAIN_MODULES,
    check_workers_code,
    dump_recording,
    references,
    unrunnable_main_path,
)

#: Python versions whose ``popen_forkserver.Popen._launch`` `LeanPopen` mirrors.
LEAN_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
#: ``off`` starts workers the stock way (each imports the main module).
ENV_SWITCH = "LANCE_LIGHTNING_LEAN_WORKERS"
#: The pid of the process starting a fork server, for the server to die with (`lance_lightning.load._forkserver`).
PARENT_ENV = "LANCE_LIGHTNING_FORKSERVER_PARENT"
#: ``1``: the fork server runs its imports on a thread at the lowest priority (`lance_lightning.load._forkserver`).
YIELD_ENV = "LANCE_LIGHTNING_FORKSERVER_YIELD"
#: Preparation-data keys that make a child import the parent's main module.
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


class LeanPopen(popen_forkserver.Popen):
    """The forkserver launch, with the main-module keys left out when the payload does not need
    them: it refers to nothing of the main module, or a forked server's worker holds the main
    module already; and refused (`check_workers_code`) when the worker would not run the code of
    this process."""

    def _launch(self, process_obj: Any) -> None:
        body, buf = io.BytesIO(), io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            refs = dump_recording(process_obj, body)
            held = forked_code()
            check_workers_code("transform", refs, held)
            prep_data = spawn.get_preparation_data(process_obj._name)
            if held is not None or not any(module in MAIN_MODULES for module, _ in refs):
                for key in _MAIN_KEYS:
                    prep_data.pop(key, None)
            reduction.dump(prep_data, buf)
        finally:
            mp_context.set_spawning_popen(None)
        buf.write(body.getbuffer())

        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]  # CPython's Popen attribute, not in typeshed
        # A duplicate of the data pipe's write end tells the child that its parent lives.
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))  # type: ignore[attr-defined]  # in CPython's multiprocessing.util, not in typeshed
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class LeanForkServerProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> LeanPopen:
        return LeanPopen(process_obj)


class LeanForkServerContext(mp_context.ForkServerContext):
    """The ``forkserver`` context (same server and preload list) whose processes start lean."""

    Process = LeanForkServerProcess


def worker_context(method: str, transform: Any) -> Any:
    """The multiprocessing context of a loader's workers. With ``forkserver`` the server preloads the
    package (importing Lance is fork-safe; opening a dataset is not) and the transform's module, so
    workers fork ready to run, and they start lean where this Python is verified (`LEAN_PYTHONS`)."""
    if method != "forkserver":
        return multiprocessing.get_context(method)
    context = LeanForkServerContext() if lean_launch() else multiprocessing.get_context(method)
    modules = ["lance_lightning.load._forkserver"]
    if transform is not None:
        modules.append(type(transform).__module__)
    context.set_forkserver_preload(modules)
    return context


def lean_launch() -> bool:
    """Whether ``forkserver`` workers start through `LeanPopen` (`LEAN_PYTHONS`, the switch on)."""
    return sys.version_info[:2] in LEAN_PYTHONS and env_switch(ENV_SWITCH)


def check_worker_launch(transform: Any, method: str) -> None:
    """When a loader with workers is made, before a worker starts: refuse workers that would die
    as they start, running again a main module read from no file (`unrunnable_main_path`), and a
    ``transform`` its workers could not run as this process has it (`check_workers_code`; a forked
    server that is yet to fork will hold the code as it is then) or could not receive at all (not
    picklable)."""
    main_path = unrunnable_main_path()
    if main_path is not None and (method == "spawn" or (method == "forkserver" and not lean_launch())):
        switch_off = method == "forkserver" and not env_switch(ENV_SWITCH)
        param, value = (ENV_SWITCH, os.environ.get(ENV_SWITCH)) if switch_off else ("multiprocessing_context", method)
        raise ConfigError(
            param,
            value,
            f"workers started this way run the main module again from its file, and it was read from {main_path!r} "
            "(`python -`), which is no file: every worker would die as it starts",
            "run the script from a .py file; or use the forkserver context with LANCE_LIGHTNING_LEAN_WORKERS "
            "unset (on Python 3.10-3.13); or set num_workers=0",
        )
    if transform is None:
        return
    try:
        refs = references(transform)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ConfigError(
            "transform",
            transform,
            f"worker processes receive the transform pickled, and it cannot be ({type(error).__name__}: {error})",
            "make it a module-level class or function (not a lambda, closure or local class); or set num_workers=0",
        ) from error
    held = forked_code() if method == "forkserver" else None
    if held is None and method == "forkserver" and running_server() is None and ForkedServer().refusal() is None:
        return  # the server, forked when workers need it, holds this process's code as it is then
    check_workers_code("transform", refs, held, value=transform)


def start_worker_server(num_workers: int, method: str, transform: Any, yield_cpu: bool = False) -> None:
    """With ``forkserver`` workers, start the fork server now, so that its imports overlap with the
    rest of the job's start-up (a no-op when it runs already; its preload list is fixed when it
    starts); with ``yield_cpu`` its imports yield the CPU to this process (`ensure_server`)."""
    if num_workers <= 0 or method != "forkserver":
        return
    worker_context(method, transform)
    ensure_server(yield_cpu)


def ensure_server(yield_cpu: bool = False) -> None:
    """Start the fork server unless it runs: its socket's folder (``pymp-*``) with its janitor first
    (`shared_temp_dir`), then, where it is safe, a fork of this process that imports nothing
    (`lance_lightning.load.forked_server`); else the stock server, told which process to die with
    (`PARENT_ENV`) and, with ``yield_cpu``, to run its imports at the lowest priority (`YIELD_ENV`).
    Those variables are set only while the server starts: a process this one starts later (a
    script's ``subprocess.run``) whose own server torch starts must not watch this pid (that
    server, another process's child, would kill itself at once)."""
    shared_temp_dir()
    if ForkedServer().start():  # where it is safe, a fork of this process: nothing to import
        return
    told = {PARENT_ENV: str(os.getpid()), YIELD_ENV: "1" if yield_cpu else "0"}
    before = {name: os.environ.get(name) for name in told}
    os.environ.update(told)
    try:
        forkserver.ensure_running()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
