"""Workers run the code the training process runs now, or the loader refuses to start them.

Guarantees:
- Workers unpickle a transform's classes and functions by name from the modules they hold. A
  forked server's workers hold this process's modules as they were when it forked (``__main__``
  included: `lance_lightning.load.forked_server`); the stock server's and ``spawn``'s import them
  from their files. So where a forked server runs, a class or function of the user's code (the
  main module, and modules outside the Python installation: `user_modules`) that was defined,
  redefined or reloaded after it forked would reach its workers as the old definition, or not at
  all: a notebook cell run again with a changed transform trained with the first version,
  silently. `stale` names those the payload refers to (`references`: what pickling it saves by
  name), and `check_workers_code` refuses them with a `ConfigError` in this process, before a
  worker starts.
- An interactive main module (a notebook, ``python -``, ``python -c``: no file a worker can
  import) reaches workers only through a forked server. With the stock server or ``spawn`` a
  transform defined there is refused the same way, instead of every worker dying as it starts.
- `unrunnable_main_path` names a main module read from a path that is no file (``python -``:
  ``<stdin>``), which ``multiprocessing``'s own launch tells every child to run again: the caller
  refuses such a launch before a worker starts (`lance_lightning.load.lean_start.check_worker_launch`).
"""

from __future__ import annotations

import io
import os
import sys
import sysconfig
import types
from multiprocessing import process
from multiprocessing.reduction import ForkingPickler
from typing import Any

from lance_lightning.errors import ConfigError

#: A name's module and qualified name, as pickle saves a class or function.
Reference = tuple[str, str]
#: The main module's names in a pickle (the parent's, and a stock worker's re-import of it).
MAIN_MODULES = ("__main__", "__mp_main__")
_MISSING = object()


def _installation_roots() -> tuple[str, ...]:
    """The folders of the Python installation, as given and with links resolved."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.join(path, "") for root in roots for path in {root, os.path.realpath(root)})


def user_modules() -> dict[str, dict[str, Any]]:
    """This process's main module and the modules loaded from outside the Python installation,
    each name to its namespace as it is now (a shallow copy: the objects themselves). A path is
    resolved only where it is not under the installation as given (thousands of modules: one
    ``realpath`` each took 0.12 s)."""
    roots = _installation_roots()
    held = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        outside = isinstance(path, str) and not path.startswith(roots) and not os.path.realpath(path).startswith(roots)
        if name == "__main__" or outside:
            held[name] = dict(vars(module))
    return held


class _RecordingPickler(ForkingPickler):
    """``multiprocessing``'s pickler, recording every class and function it saves by name."""

    def __init__(self, file: Any, protocol: int | None = None) -> None:
        super().__init__(file, protocol)
        self.references: set[Reference] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if isinstance(module, str) and isinstance(name, str):
                self.references.add((module, name))
        return NotImplemented


def dump_recording(obj: Any, file: Any) -> set[Reference]:
    """Pickle ``obj`` into ``file`` as ``multiprocessing`` does; the classes and functions it saved by name."""
    pickler = _RecordingPickler(file)
    pickler.dump(obj)
    return pickler.references


def references(obj: Any) -> set[Reference]:
    """The classes and functions pickling ``obj`` saves by name."""
    return dump_recording(obj, io.BytesIO())


def stale(refs: set[Reference], held: dict[str, dict[str, Any]]) -> list[str]:
    """Those of ``refs`` whose top-level name in a module of ``held`` is no longer the object
    ``held`` records: defined, redefined or reloaded since."""
    found = []
    for module, name in sorted(refs):
        namespace = held.get("__main__" if module in MAIN_MODULES else module)
        if namespace is None or "<locals>" in name:
            continue  # imported afresh by the workers, or not picklable by name anyway
        top = name.split(".", 1)[0]
        current = getattr(sys.modules["__main__" if module in MAIN_MODULES else module], top, _MISSING)
        if namespace.get(top, _MISSING) is not current:
            found.append(f"{module}.{name}")
    return found


def _main_file() -> tuple[str | None, bool]:
    """The main module's file as ``multiprocessing``'s own launch names it (None where it names
    none: ``python -m`` imports it by name; ``-c`` and a notebook have no file), and whether a
    file is there (joined with ``ORIGINAL_DIR`` as `multiprocessing.spawn.get_preparation_data`
    joins it)."""
    main = sys.modules["__main__"]
    if getattr(getattr(main, "__spec__", None), "name", None):
        return None, True
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None, False
    return path, os.path.isfile(os.path.join(getattr(process, "ORIGINAL_DIR", None) or "", path))


def interactive_main() -> bool:
    """Whether the main module has no file a worker could import (a notebook, ``python -``, ``-c``)."""
    return not _main_file()[1]


def unrunnable_main_path() -> str | None:
    """The path ``multiprocessing``'s own launch tells each child to run the main module from, where
    no file is there (``python -``: ``<stdin>``); None where it names a file or none."""
    path, found = _main_file()
    return None if found else path


def check_workers_code(
    param: str, refs: set[Reference], forked: dict[str, dict[str, Any]] | None, value: Any = None
) -> None:
    """Refuse workers that would not run the code of ``refs`` as this process has it: ``forked``
    is what a forked server holds (`user_modules` when it forked), None for a server that imports.
    The error shows ``value`` as ``param``'s (by default the names refused)."""
    if forked is not None:
        changed = stale(refs, forked)
        if changed:
            raise ConfigError(
                param,
                changed if value is None else value,
                f"{', '.join(changed)} was defined, redefined or reloaded after this process's worker server "
                "forked (at the first `setup` with workers): its workers hold the earlier code and would run it",
                "restart the Python process or kernel before fitting with the changed code; or set num_workers=0; "
                "or set LANCE_LIGHTNING_FORKED_SERVER=off before the first fit, with the code in an importable module",
            )
        return
    if interactive_main():
        interactive = sorted(f"{module}.{name}" for module, name in refs if module in MAIN_MODULES)
        if interactive:
            raise ConfigError(
                param,
                interactive if value is None else value,
                f"{', '.join(interactive)} is defined in an interactive session (a notebook, `python -` or "
                "`python -c`), which worker processes that import their code cannot import",
                "move it into a .py module and import it from there; or set num_workers=0; or leave "
                "LANCE_LIGHTNING_FORKED_SERVER on with the forkserver context (its workers hold the session's code)",
            )
