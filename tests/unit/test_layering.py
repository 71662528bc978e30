"""The package's imports follow the data's path: no module imports a later stage, and nothing imports
itself back through a cycle.

Every import is read from the source (function-local ones and those under ``TYPE_CHECKING`` too),
so an upward import cannot hide behind a deferred ``from ... import``. A new module joins a stage
by its folder (or its name at the top level); a new top-level module or folder must be placed in
`STAGES` before this test passes, which is the point: its place is a decision.

Classes own their state: no package class inherits from a package class that reads ``self``
attributes it never sets (a mixin reading its host's state; `LanceDataModule`'s bases are
Lightning's only), and no code reads or writes a private member that is not its own (``self._x``
its class never sets, or ``x._y`` where ``_y`` is private to a class of another module). Both
are read from the source, like the imports.
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
    ("checks", "vocabulary", "lifetime", "preflight", "launch"),
    ("metrics",),
    # Opening a source: which version it names, where a catalog puts it, what failed and how to fix it.
    ("version_ref", "catalog", "open_errors"),
    ("source",),
    ("media",),  # what a clip is (samplers) and how it decodes (PyAV): plan counts clips, read decodes them
    ("plan",),
    ("read",),
    ("produce", "materialize"),
    ("write",),  # Lance datasets written: from raw files (prepare), from predictions
    ("transforms",),
    ("device",),
    ("cursor",),  # the loader advances the cursor; the data module restores it
    ("load",),
    ("hold", "arguments", "hparams"),
    ("split_plans", "split_loaders"),  # the data module's splits: each one's plan, each one's loader
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
    "lance_lightning.read.clips",
    "lance_lightning.read.mixture_reader",
    "lance_lightning.materialize.cache",  # caches one source's ReadPlan
)


def _owner_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _checks_plan_kind(test: ast.AST) -> bool:
    """Whether ``test`` is ``isinstance(plan, ...)`` (alone or in an ``and``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_checks_plan_kind(value) for value in test.values)
    return (
        isinstance(test, ast.Call)
        and _owner_name(test.func) == "isinstance"
        and bool(test.args)
        and _owner_name(test.args[0]) == "plan"
    )


def _plan_attributes(path: Path) -> set[str]:
    """Attributes read from anything named ``plan`` (``plan.x``, ``self.plan.x``, ``reader.plan.x``),
    except where an ``if``/conditional expression has checked its kind (``isinstance(plan, MixturePlan)``)."""
    tree = ast.parse(path.read_text(), str(path))
    checked = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)) and _checks_plan_kind(node.test):
            for part in node.body if isinstance(node.body, list) else [node.body]:
                checked.update(id(inner) for inner in ast.walk(part))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in checked:
            if _owner_name(node.value) == "plan":
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
        assert len(plan.sources) == (2 if isinstance(source, LanceMixture) else 1)


# -- classes: no mixins, no reaching into another class's private members --------------------------
#: Bases that give a class no attributes of their own to read.
_BARE_BASES = {"object", "ABC", "Protocol", "Generic", "NamedTuple"}
#: Mixins kept on purpose, with why. `OneScreenParser` overrides methods of the jsonargparse parsers
#: that LightningCLI builds from a ``parser_class`` (no object can stand in for the parser there); it
#: reads only ``argparse.ArgumentParser``'s public ``prog`` and ``exit_on_error``.
_ALLOWED_MIXINS = {"OneScreenParser"}


def _base_name(node: ast.expr) -> str:
    node = node.value if isinstance(node, ast.Subscript) else node  # Generic[T]
    return _owner_name(node)


def _classes(modules: dict[str, Path]) -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Class name -> (module, definition) of each class the package defines."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = defaultdict(list)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append((module, node))
    return found


def _members(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: in its body (methods, class attributes, fields) or by assigning
    ``self.name``/``cls.name`` in its methods."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)
    return names


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _inherited(cls: ast.ClassDef, classes: dict[str, list[tuple[str, ast.ClassDef]]]) -> set[str] | None:
    """Every name ``cls`` and its package ancestors define; None when a base from outside the
    package (Lightning's, torch's, the standard library's) may define any name."""
    names = _members(cls)
    for base in cls.bases:
        name = _base_name(base)
        if name in _BARE_BASES:
            continue
        if name not in classes:
            return None
        for _, definition in classes[name]:
            inherited = _inherited(definition, classes)
            if inherited is None:
                return None
            names |= inherited
    return names


def _self_reads(cls: ast.ClassDef) -> set[str]:
    """The names ``cls`` reads as ``self.name`` (dunders aside: every object has them)."""
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and _is_self(node.value)
        and not node.attr.startswith("__")
    }


def mixin_bases(modules: dict[str, Path]) -> list[str]:
    """``Class(Base)`` for each package class whose package base reads ``self`` attributes that the
    base (with its own ancestors) never sets: a mixin, reading its host's state."""
    classes = _classes(modules)
    found = []
    for name, definitions in sorted(classes.items()):
        for module, cls in definitions:
            for base in cls.bases:
                for _, definition in classes.get(_base_name(base), []):
                    if definition.name in _ALLOWED_MIXINS:
                        continue
                    inherited = _inherited(definition, classes)
                    unset = sorted(_self_reads(definition) - inherited) if inherited is not None else []
                    if unset:
                        found.append(f"{module}.{name}({definition.name}): {definition.name} reads self.{unset}")
    return found


def test_no_class_inherits_from_a_mixin() -> None:
    found = mixin_bases(_modules())
    assert not found, "make these an object the class owns and calls, with explicit arguments:\n" + "\n".join(found)


def test_the_data_module_inherits_only_from_lightning() -> None:
    from lance_lightning.datamodule import LanceDataModule

    bases = [f"{base.__module__}.{base.__qualname__}" for base in LanceDataModule.__bases__]
    assert all(base.startswith("lightning.") for base in bases), bases


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


#: Private names of other libraries a module reads on purpose, which also name members of the
#: package's own classes: listed in docs/internals.md and checked by tests/unit/test_internals.py.
_OTHER_LIBRARIES_INTERNALS = {"lance_lightning.load.forked_server": {"_forkserver", "_lock"}}


def private_reaches(modules: dict[str, Path]) -> list[str]:
    """``module:line x._name`` for each read or write of a private member that is not the code's own:
    ``self._name`` in a class that (with its package ancestors) never sets ``_name``, or ``x._name``
    (``x`` not ``self``/``cls``) where ``_name`` is a private member of a class of another module."""
    classes = _classes(modules)
    private_of: dict[str, set[str]] = defaultdict(set)  # module -> its classes' private members
    for definitions in classes.values():
        for module, cls in definitions:
            private_of[module] |= {name for name in _members(cls) if _private(name)}
    found = []
    for module, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            inherited = _inherited(cls, classes)
            if inherited is None:
                continue
            reads = {
                node.attr: node for node in ast.walk(cls) if isinstance(node, ast.Attribute) and _is_self(node.value)
            }
            for name in sorted(set(reads) - inherited):
                if _private(name):
                    found.append(f"{module}:{reads[name].lineno} self.{name} (not set by {cls.name})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
                owners = [other for other, names in private_of.items() if node.attr in names and other != module]
                if node.attr in _OTHER_LIBRARIES_INTERNALS.get(module, set()):
                    continue
                if owners and node.attr not in private_of[module]:
                    found.append(f"{module}:{node.lineno} {ast.unparse(node)} (private to {owners[0]})")
    return found


def test_no_reach_into_another_class_private_members() -> None:
    found = private_reaches(_modules())
    assert not found, "use a public method or pass the value explicitly:\n" + "\n".join(found)


def test_the_class_checks_see_a_mixin_and_a_reach(tmp_path: Path) -> None:
    (tmp_path / "host.py").write_text(
        "class Stage:\n    def hook(self):\n        return self._loaders[self.split]\n\n"
        "class Host(Stage):\n    def __init__(self):\n        self._loaders, self.split = {}, 'train'\n"
    )
    (tmp_path / "user.py").write_text("def peek(host):\n    return host._loaders\n")
    modules = {"lance_lightning.host": tmp_path / "host.py", "lance_lightning.user": tmp_path / "user.py"}
    assert mixin_bases(modules) == ["lance_lightning.host.Host(Stage): Stage reads self.['_loaders', 'split']"]
    assert private_reaches(modules) == [
        "lance_lightning.host:3 self._loaders (not set by Stage)",
        "lance_lightning.user:2 host._loaders (private to lance_lightning.host)",
    ]
