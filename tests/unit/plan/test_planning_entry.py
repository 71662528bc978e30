"""Every plan in the package is built through one function, `lance_lightning.plan.split.plan_split`.

Read from the source, like ``tests/unit/test_layering.py``: a module other than the planning entry
that calls (or imports, so an alias cannot hide the call) a planning step, or constructs a plan
class, fails here, naming the module, the line and the name. The plan classes themselves may be
imported anywhere (for ``isinstance`` and annotations): only their construction is the entry's.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "lance_lightning"
ENTRY = "lance_lightning.plan.split"

#: Planning steps only the entry calls (``build_plan`` was the survey-and-plan step the remote cache called).
STEPS = ("build_plan", "plan_reads", "plan_mixture")
#: Plan classes -> the one module that constructs them, inside the step `plan_split` calls.
CONSTRUCTORS = {
    "ReadPlan": "lance_lightning.plan.planner",
    "MixturePlan": "lance_lightning.plan.mixture",
}


def _called_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def direct_builds(package: Path) -> list[str]:
    """``module:line name`` for each place under ``package`` that builds a plan other than through the entry."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = ("lance_lightning", *path.relative_to(package).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names if alias.name in STEPS]
            elif isinstance(node, ast.Call):
                name = _called_name(node)
                names = [name] if name in STEPS or name in CONSTRUCTORS else []
            else:
                continue
            for name in names:
                if module != ENTRY and CONSTRUCTORS.get(name) != module:
                    found.append(f"{module}:{node.lineno} {name}")
    return found


def test_every_plan_is_built_through_plan_split() -> None:
    found = direct_builds(PACKAGE)
    assert not found, "plans built outside `plan_split` (lance_lightning/plan/split.py):\n" + "\n".join(found)


def test_the_check_sees_direct_builds_and_aliases(tmp_path: Path) -> None:
    package = tmp_path / "lance_lightning"
    (package / "plan").mkdir(parents=True)
    (package / "plan" / "split.py").write_text("from x import plan_reads\nplan_reads()\n")
    (package / "plan" / "planner.py").write_text("ReadPlan()\n")
    (package / "cache.py").write_text(
        "from lance_lightning.plan.survey import build_plan as b\n"
        "import lance_lightning.plan.mixture as m\n"
        "b()\nm.plan_mixture()\nm.MixturePlan()\n"
    )
    assert direct_builds(package) == [
        "lance_lightning.cache:1 build_plan",
        "lance_lightning.cache:4 plan_mixture",
        "lance_lightning.cache:5 MixturePlan",
    ]
