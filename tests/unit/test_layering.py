"""The package's imports follow the data's path: no module imports a later stage, and nothing imports
itself back through a cycle.

Every import is read from the source (function-local ones and those under ``TYPE_CHECKING`` too),
so an upward import cannot hide behind a deferred ``from ... import``. A new module joins a stage
by its folder (or its name at the top level); a new top-level module or folder must be placed in
`STAGES` before this test passes, which is the point: its place is a decision.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lance_lightning"

#: The stages from the bottom up: a module may import its own stage and the ones listed before it.
STAGES: list[tuple[str, ...]] = [
    ("redaction",),
    ("errors",),
    ("checks", "vocabulary", "lifetime", "preflight"),
    ("metrics",),
    ("source",),
    ("plan",),
    ("read",),
    ("produce", "materialize"),
    ("transforms",),
    ("device",),
    ("load",),
    ("hold", "restore"),
    ("datamodule",),
    ("callbacks",),
    ("cli",),
    ("integrations",),  # optional extras (Ray): nothing below imports them
]
_RANK = {unit: rank for rank, units in enumerate(STAGES) for unit in units}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("lance_lightning", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its source)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                graph[name].add(f"relative import in {name}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lance_lightning"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.startswith("lance_lightning"))
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_has_a_stage() -> None:
    units = {_unit(name) for name in _modules()} - {""}
    assert units <= set(_RANK), f"place these in STAGES: {sorted(units - set(_RANK))}"


def test_no_module_imports_a_later_stage() -> None:
    graph = _imports(_modules())
    upward = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            assert not target.startswith("relative import"), target
            if _unit(target) == "":  # `from lance_lightning import X`: the package re-exports every stage
                upward.append(f"{module} -> {target} (import from the defining module)")
            elif _RANK[_unit(target)] > _RANK[_unit(module)] or (
                _RANK[_unit(target)] == _RANK[_unit(module)] and _unit(target) != _unit(module)
            ):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the stage order:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _imports(_modules())
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_checker_sees_deferred_imports(tmp_path: Path) -> None:
    source = "def f():\n    from lance_lightning.datamodule import LanceDataModule\n"
    (tmp_path / "probe.py").write_text(source)
    (tmp_path / "empty.py").write_text("")
    found = _imports(
        {"lance_lightning.source": tmp_path / "probe.py", "lance_lightning.datamodule": tmp_path / "empty.py"}
    )
    assert found["lance_lightning.source"] == {"lance_lightning.datamodule"}


#: Modules that read one kind of plan by its concrete type: planning itself and each kind's reader.
_KIND_SPECIFIC = (
    "lance_lightning.plan.",
    "lance_lightning.read.reader",
    "lance_lightning.read.packed",
    "lance_lightning.read.mixture_reader",
    "lance_lightning.materialize.cache",  # caches one source's ReadPlan
)


def _plan_attributes(path: Path) -> set[str]:
    """Attributes read from anything named ``plan`` (``plan.x``, ``self.plan.x``, ``reader.plan.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name == "plan":
                found.add(node.attr)
    return found


def test_stages_ask_a_plan_only_what_the_contract_names() -> None:
    from lance_lightning.plan.contract import Plan

    members = {name for name in dir(Plan) if not name.startswith("_")}
    outside = []
    for module, path in sorted(_modules().items()):
        if module.startswith(_KIND_SPECIFIC):
            continue
        outside += [f"{module}: plan.{attr}" for attr in sorted(_plan_attributes(path) - members)]
    assert not outside, "not in the Plan contract (lance_lightning/plan/contract.py):\n" + "\n".join(outside)


def test_both_kinds_of_plan_keep_the_contract(tmp_path: Path) -> None:
    from lance_lightning.plan.contract import Plan, SplitSettings
    from lance_lightning.plan.mixture import LanceMixture
    from lance_lightning.plan.split import plan_split
    from lance_lightning.plan.strategies import FilterRead, RowShuffle
    from lance_lightning.source import LanceSource
    from tests.helpers import write_dataset

    uris = [write_dataset(tmp_path / f"{name}.lance", 64) for name in "ab"]
    settings = SplitSettings(RowShuffle(seed=1), FilterRead(), 8, False)
    members = {name for name in dir(Plan) if not name.startswith("_")}
    for source in (LanceSource(uris[0]), LanceMixture([LanceSource(uri) for uri in uris], [1, 1], block=8)):
        plan = plan_split("train", source, settings)
        assert isinstance(plan, Plan)
        assert not [name for name in members if not hasattr(plan, name)]
        assert plan.layout(2).steps == -(-plan.matched_rows // 16)
        assert len(plan.sources) == len(plan.source_names)
