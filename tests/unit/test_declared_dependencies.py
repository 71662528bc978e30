"""Every package the code imports is declared in pyproject.toml: the package's own imports among its
dependencies (Ray's integration among the ``ray`` extra's), the examples' among those or the dev group.
A module that reaches the code only through another package breaks when that package drops it.

Imports are read from the source (function-local and ``TYPE_CHECKING`` ones too); each top-level
module is mapped to the distribution that installs it (`importlib.metadata.packages_distributions`).
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported(folder: Path) -> dict[str, Path]:
    """Top-level module -> a file that imports it, for the third-party imports under ``folder``."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("lance_lightning", "tests", "examples"):
                    found.setdefault(top, path)
    return found


def _undeclared(folder: Path, declared: set[str]) -> list[str]:
    distributions = packages_distributions()
    missing = []
    for module, path in _imported(folder).items():
        names = {_name(d) for d in distributions.get(module, [])}
        if not names & declared:
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            missing.append(f"{module} (imported by {shown}; installed by {sorted(names) or '?'})")
    return missing


def test_the_package_declares_what_it_imports() -> None:
    declared = {_name(r) for r in PROJECT["project"]["dependencies"]}
    ray = declared | {_name(r) for r in PROJECT["project"]["optional-dependencies"]["ray"]}
    # Ray's extra brings `ray[data,train]`'s own requirements (pandas, for one) as part of what it declares.
    ray |= {_name(r) for r in requires("ray") or [] if "extra ==" not in r or "data" in r or "train" in r}
    assert _undeclared(ROOT / "lance_lightning" / "integrations", ray) == []
    outside = [m for m in _undeclared(ROOT / "lance_lightning", declared) if "integrations" not in m]
    assert outside == [], "declare these in [project].dependencies"


def test_the_examples_declare_what_they_import() -> None:
    declared = {_name(r) for r in PROJECT["project"]["dependencies"]}
    declared |= {_name(r) for r in PROJECT["dependency-groups"]["dev"]}
    declared |= {_name(r) for r in PROJECT["project"]["optional-dependencies"]["ray"]}
    assert _undeclared(ROOT / "examples", declared) == []


def test_a_name_that_no_declaration_covers_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f():\n    import yaml\n    from PIL import Image\n")
    assert [m.split()[0] for m in _undeclared(tmp_path, {"torch"})] == ["yaml", "PIL"]
