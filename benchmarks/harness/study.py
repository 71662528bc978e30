"""Runs a study: a suite of record whose measurement is not one loader's rows/s (resume, memory over
epochs, metrics on/off, start-up, packing, ...), with its parameters as data in the registry.

Guarantees:
- `run` merges the study's parameters (`benchmarks.harness.registry.STUDIES`: its defaults, then
  its ``quick`` ones with ``--quick``, then ``--set key=value`` and ``--reps``), each value parsed
  as the type of its default (a list default takes a comma list); an unknown key or a value that
  does not parse is refused with the known keys (`SelectError`), before anything is measured.
- It calls the study module's ``measure(p)`` (``benchmarks/studies/<module>.py``) and writes what
  it returns under one header: title, the exact ``python -m benchmarks`` command, when, how long,
  full or quick run, machine and versions, load average. ``--record`` writes the study's result
  file under ``benchmarks/results/`` (a study with a ``section`` replaces only its part between its
  markers, keeping the rest of the file); any other run writes under the cache folder or ``--out``.
- `child` runs one measurement (a function of a study module) in a fresh interpreter of this
  environment (``python -m benchmarks.harness.study``) and returns its JSON result (packing,
  transforms, prepare; the planning study starts its processes at a gate of its own, prepare the
  peers in their environment).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.harness.registry import STUDIES, SelectError

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Params:
    """A study's parameters (attributes) and the run's context."""

    values: dict[str, Any]
    quick: bool
    cache: Path
    out: Path

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def kind(self) -> str:
        return "QUICK smoke run (small data; not the reference figures)" if self.quick else "full run"


def _parse(key: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        if isinstance(default, (list, tuple)):
            kind = type(default[0]) if default else str
            return [kind(float(v)) if kind is int else kind(v) for v in text.split(",") if v]
        if isinstance(default, int):
            return int(float(text))
        if isinstance(default, float):
            return float(text)
        return None if text.lower() == "none" else text
    except ValueError:
        raise SelectError(f"--set {key}={text}: not a value of its type ({type(default).__name__})") from None


def params(name: str, quick: bool, sets: list[str], reps: int | None) -> dict[str, Any]:
    """The study's parameters: defaults, quick ones, then ``--set`` and ``--reps``."""
    study = STUDIES[name]
    values = dict(study.params)
    if quick:
        values.update(study.quick)
    given = [s.split("=", 1) for s in sets] + ([["reps", str(reps)]] if reps is not None else [])
    for pair in given:
        if len(pair) != 2 or pair[0] not in values:
            raise SelectError(
                f"--set {'='.join(pair)}: {name}'s parameters are {', '.join(sorted(values))} (KEY=VALUE)"
            )
        values[pair[0]] = _parse(pair[0], pair[1], study.params[pair[0]])
    return values


def header(title: str, command: str, p: Params, seconds: float) -> str:
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`. {common.stamp()}, {p.kind}, {seconds:.0f} s.",
        "",
        f"Machine: {common.machine(lightning=True)}; load average {common.load_average()} at the end (shared).",
        "",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, name: str, text: str) -> None:
    """Replace the part of ``path`` between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` (put
    after the file's first line when missing), keeping the rest of the file."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.strip()}\n{end}"
    old = path.read_text() if path.exists() else "# Results\n"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end) :]
    else:
        head, _, rest = old.partition("\n")
        new = f"{head}\n\n{block}\n{rest}"
    common.write_result(path, new)


def quiet() -> None:
    """No Lightning banners or plan explanations between a study's lines."""
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lance_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run(name: str, args: Any, command: str) -> Path:
    """Measure study ``name`` and write its result file; return the file's path."""
    study = STUDIES[name]
    values = params(name, args.quick, args.set or [], args.reps)
    out = args.out or (common.RESULTS_DIR / study.record if args.record else args.cache_dir / "runs" / study.record)
    p = Params(values, args.quick, args.cache_dir, out)
    p.cache.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"command: {command}\n{name}: {values}", flush=True)
    quiet()
    began = time.perf_counter()
    body = importlib.import_module(f"benchmarks.studies.{study.module}").measure(p)
    text = header(study.title, command, p, time.perf_counter() - began) + body.strip() + "\n"
    if study.section:
        write_section(out, study.section, text.replace(f"# {study.title}", f"## {study.title}", 1))
    else:
        common.write_result(out, text)
    print("\n" + text + f"\nwrote {out}")
    return out


def child(function: str, timeout: float | None = None, **kwargs: Any) -> dict:
    """``module:function(**kwargs)`` (a module of ``benchmarks.studies``) in a fresh interpreter; its
    JSON result. A child that fails raises with the end of its stderr."""
    args = ["-m", "benchmarks.harness.study", function, json.dumps(kwargs)]
    return common.run_child(args, cwd=ROOT, timeout=timeout)


if __name__ == "__main__":  # a child: python -m benchmarks.harness.study MODULE:FUNCTION JSON
    module, function = sys.argv[1].split(":")
    quiet()
    result = getattr(importlib.import_module(f"benchmarks.studies.{module}"), function)(**json.loads(sys.argv[2]))
    print(json.dumps(result))
