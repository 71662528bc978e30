"""How ``lance-lightning`` was started here, so that a printed command runs as printed.

Guarantees:
- `launched_with` gives the words that started this command (``uv run [its options] <program>``
  when ``uv run`` started it, from the parent process's command line on Linux or the ``UV``
  variable elsewhere; else the program: ``lance-lightning``, the script's path, or ``python -m
  lance_lightning.cli``), for the resume hint.
- `tool_command` gives a ``lance-lightning`` subcommand as it runs from here: behind ``uv run``
  (with the options that ``uv run`` was given before its program) when this process, a training
  script or one of its child processes included, runs under ``uv run`` (the nearest ``uv run``
  among its ancestors); else the program as above. Every hint the package
  prints (``holds --release``) is made with it.
- `shown_path` shows a path relative to the current directory when it lies inside it.
- Imports no Lightning (the data module's hold hints use it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

#: ``uv run`` options that take a value (the next word), so the program is the first other word.
_UV_VALUE_OPTIONS = frozenset(
    {
        "--project",
        "--directory",
        "--extra",
        "--with",
        "--with-editable",
        "--with-requirements",
        "--python",
        "-p",
        "--group",
        "--only-group",
        "--package",
        "--env-file",
        "--index",
        "--default-index",
        "--find-links",
        "-f",
        "--config-file",
        "--cache-dir",
        "--script",
        "--module",
        "--color",
        "--index-strategy",
        "--resolution",
        "--prerelease",
        "--link-mode",
        "--no-extra",
        "--no-group",
        "--exclude-newer",
    }
)


def tool_command(words: list[str]) -> str:
    """``lance-lightning WORDS`` as it runs from here (see the module docstring)."""
    prefix = _uv_prefix()
    return shlex.join([*prefix, "lance-lightning", *words] if prefix else [*program(), *words])


def _uv_prefix() -> list[str]:
    """``uv run [options]`` of the nearest ``uv run`` among this process's ancestors, else nothing."""
    for command in _ancestors():
        if command and Path(command[0]).name in ("uv", "uv.exe") and "run" in command[1:]:
            uv = shutil.which("uv")
            named = uv is not None and os.path.exists(command[0]) and os.path.samefile(uv, command[0])
            prefix = ["uv" if named else command[0], *command[1 : command.index("run") + 1]]
            rest = command[command.index("run") + 1 :]
            index = 0
            while index < len(rest) and rest[index].startswith("-"):
                takes_value = rest[index] in _UV_VALUE_OPTIONS and "=" not in rest[index]
                prefix.extend(rest[index : index + 1 + takes_value])
                index += 1 + takes_value
            return prefix
    return ["uv", "run"] if os.environ.get("UV") and os.environ.get("UV_RUN_RECURSION_DEPTH") else []


def _ancestors(limit: int = 16) -> Iterator[list[str]]:
    """The command lines of this process's ancestors, the parent first (Linux ``/proc``; none elsewhere)."""
    pid = os.getppid()
    for _ in range(limit):
        if pid <= 1:
            return
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        yield [word.decode(errors="replace") for word in raw.split(b"\0")[:-1]]
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])


def launched_with(arguments: list[str] | None) -> list[str]:
    """The words before the arguments that started this command, to run it again from the same
    directory: ``uv run [its options] <program>`` when ``uv run`` started this process with
    ``arguments`` (the parent's command line, on Linux; elsewhere the ``UV`` variable that ``uv run``
    sets), else the program."""
    parent = parent_command()
    if arguments and parent and Path(parent[0]).name in ("uv", "uv.exe") and "run" in parent[1:]:
        if len(parent) > len(arguments) and parent[-len(arguments) :] == arguments:
            prefix = parent[: len(parent) - len(arguments)]
            uv = shutil.which("uv")
            if uv and os.path.exists(prefix[0]) and os.path.samefile(uv, prefix[0]):
                prefix[0] = "uv"
            return prefix
    if parent is None and arguments and os.environ.get("UV") and os.environ.get("UV_RUN_RECURSION_DEPTH"):
        return ["uv", "run", *program()]
    return program()


def parent_command() -> list[str] | None:
    """The parent process's command line (Linux ``/proc``), or None where it cannot be read."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return [word.decode(errors="replace") for word in raw.split(b"\0")[:-1]]


def program() -> list[str]:
    """How to start ``lance-lightning`` from here: its name when ``PATH`` finds this installation's
    script, else the script's path, or ``python -m lance_lightning.cli``."""
    found = shutil.which("lance-lightning")
    started = sys.argv[0] if sys.argv else ""
    if Path(started).name == "lance-lightning":
        if os.sep not in started or (found and os.path.exists(started) and os.path.samefile(found, started)):
            return ["lance-lightning"]
        return [shown_path(started)]
    if found and os.path.samefile(Path(found).parent, Path(sys.executable).parent):
        return ["lance-lightning"]
    python = shutil.which("python")  # the same path, not only the same binary: a venv's python is a link
    same = python is not None and os.path.abspath(python) == os.path.abspath(sys.executable)
    return ["python" if same else sys.executable, "-m", "lance_lightning.cli"]


def shown_path(path: str) -> str:
    """``path`` relative to the current directory when it lies inside it, else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.getcwd())
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative
