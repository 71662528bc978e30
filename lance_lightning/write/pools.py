"""Where a prepare's units are written: threads, spawned processes or Ray tasks, behind one
`concurrent.futures.Executor` (`unit_executor`); the writer commits their results in order.

Guarantees:
- ``processes`` are spawned, never forked (Lance is not fork-safe). A spawned worker ignores
  Ctrl-C (the calling process stops the prepare) and exits when the prepare that started it dies
  (SIGKILL): none is left running.
- ``ray`` runs each unit as a Ray task (one CPU) of the Ray instance the caller started or joined;
  Ray is imported only then, and its absence is a `ConfigError` naming ``prepare.pool`` and the fix.
  A task's result raises the task's own exception (a `ConfigError` naming a bad file), not Ray's
  wrapper. Tasks writing a local output are pinned to this machine (node).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from lance_lightning.errors import ConfigError


def unit_executor(pool: str, workers: int, *, local: bool) -> Executor:
    """The executor of ``pool`` (``threads``, ``processes`` or ``ray``) with ``workers`` workers
    (Ray: as many tasks as submitted); ``local``: the output is on this machine's file system."""
    if pool == "threads":
        return ThreadPoolExecutor(workers, thread_name_prefix="lance-prepare")
    if pool == "ray":  # Ray tasks: imported only here
        return _RayExecutor(local=local)
    # Lance is not fork-safe: spawned processes only
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(os.getpid(),),
    )


def _init_worker(parent: int) -> None:
    """A spawned worker ignores Ctrl-C (the calling process stops the prepare) and exits once
    ``parent`` is gone (a SIGKILLed prepare), whose call queue would block it forever. ``parent``
    comes from the parent: one whose prepare died while it started has another parent already."""
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="lance-prepare-parent-watch", daemon=True).start()


class _RayExecutor(Executor):
    """Runs `DatasetWriter.write_unit` calls as Ray tasks (one CPU each) of the Ray instance the
    caller started or joined (``ray.init``; else Ray starts a local one). Arguments and results
    travel pickled, as to spawned processes: each task writes its unit's fragment files and returns
    the ``Overwrite`` operation listing them; the driver commits it. Tasks writing a local output
    are pinned to this machine (node); with an object-store output they run on any node."""

    def __init__(self, *, local: bool) -> None:
        try:
            import ray
        except ImportError as error:
            raise ConfigError(
                "prepare.pool",
                "ray",
                f"needs Ray, which the `ray` extra installs ({type(error).__name__}: {error})",
                "uv sync --extra ray (or pip install 'lance-lightning[ray]'), or use pool threads or processes",
            ) from None
        self._ray = ray
        options: dict[str, Any] = {"num_cpus": 1}
        if local:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if not ray.is_initialized():
                ray.init()
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        self._task = ray.remote(_call).options(**options)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return _RayFuture(self._ray, self._task.remote(fn, *args, **kwargs))


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class _RayFuture(Future):
    """A Ray task's result as the write loop reads it: ``result()`` raises the task's own exception
    (a `ConfigError` naming a bad file), ``cancel()`` cancels the task."""

    def __init__(self, ray: Any, ref: Any) -> None:
        super().__init__()
        self._ray, self._ref = ray, ref

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._ray.get(self._ref, timeout=timeout)
        except self._ray.exceptions.RayTaskError as error:
            cause = error.cause
            raise (cause if isinstance(cause, Exception) else error) from None

    def cancel(self) -> bool:
        self._ray.cancel(self._ref)
        return True
