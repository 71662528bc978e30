"""Generate ``docs/api.md`` from the package's docstrings and signatures.

Guarantees: the output depends only on the source tree (no addresses, times or paths), so
``tests/scenarios/test_docs.py`` can fail whenever ``docs/api.md`` differs from what this script writes. Every
public name of ``lance_lightning`` and ``lance_lightning.transforms`` (their ``__all__``), the
bad-row policies and the command-line modules are documented, grouped by the module that defines
them, in the order data flows through the package.

Usage::

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
API_MD = REPO_ROOT / "docs" / "api.md"

#: Modules in the order data flows through them; others follow alphabetically.
MODULE_ORDER = (
    "lance_lightning.datamodule",
    "lance_lightning.source",
    "lance_lightning.plan.strategies",
    "lance_lightning.plan.packing",
    "lance_lightning.transforms.image",
    "lance_lightning.transforms.tokens",
    "lance_lightning.transforms.augment",
    "lance_lightning.transforms.compose",
    "lance_lightning.produce.badrows",
    "lance_lightning.callbacks.finished_steps",
    "lance_lightning.callbacks.monitor",
    "lance_lightning.materialize.view",
    "lance_lightning.read.retry",
    "lance_lightning.load.loader",
    "lance_lightning.load.dataset",
    "lance_lightning.produce.convert",
    "lance_lightning.errors",
    "lance_lightning.load.workers",
)
#: Public names that live outside the two ``__all__`` lists but are set from YAML.
EXTRA_NAMES = {
    "lance_lightning.produce.badrows": ("BadRowPolicy", "RaiseOnBadRow", "ReplaceBadRow"),
    "lance_lightning.produce.convert": ("Ragged",),
}
#: Modules documented by their docstring alone: the command-line tools.
COMMAND_MODULES = (
    "lance_lightning.cli",
    "lance_lightning.cli.lightning",
    "lance_lightning.cli.profile",
    "lance_lightning.cli.materialize",
    "lance_lightning.cli.holds",
)
_SECTION = re.compile(r"^(Args|Arguments|Attributes|Returns|Raises|Yields|Example|Examples):\s*$")
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc):(`[^`]+`)")
_ITEM_NAME = re.compile(r"^([\w.*, ]+?):\s+(.*)$")


def public_objects() -> dict[str, list[tuple[str, Any]]]:
    """Defining module -> [(name, object)] for every documented public name, sorted by name."""
    import lance_lightning
    import lance_lightning.transforms

    found: dict[str, Any] = {}
    for package in (lance_lightning, lance_lightning.transforms):
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.ismodule(obj):  # a function shadowed by its own submodule's name
                obj = getattr(obj, name)
            found[name] = obj
    for module, names in EXTRA_NAMES.items():
        for name in names:
            found[name] = getattr(importlib.import_module(module), name)
    grouped: dict[str, list[tuple[str, Any]]] = {}
    for name, obj in sorted(found.items()):
        grouped.setdefault(obj.__module__, []).append((name, obj))
    return grouped


def _module_rank(module: str) -> tuple[int, str]:
    return (MODULE_ORDER.index(module), "") if module in MODULE_ORDER else (len(MODULE_ORDER), module)


def format_default(value: Any) -> str:
    """A default value as source text; lazily built instances show as ``Class()``."""
    cls = type(value)
    lazy_bases = [c for c in cls.__mro__ if c.__module__.startswith("jsonargparse")]
    if lazy_bases:  # lazy_instance(Class): a jsonargparse subclass of Class, built on first use
        base = next(c for c in cls.__mro__[1:] if not c.__module__.startswith("jsonargparse"))
        return f"{base.__name__}()"
    text = repr(value)
    return f"<{cls.__name__}>" if " at 0x" in text else text


def format_signature(name: str, obj: Any) -> str:
    """``name(param: annotation = default, ...) -> return``, one parameter per line when long."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = []
    star_done = False
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        prefix = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "")
        star_done = star_done or param.kind is param.VAR_POSITIONAL
        text = prefix + param.name
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:
            text += f" = {format_default(param.default)}"
        params.append(text)
    returns = ""
    if signature.return_annotation is not signature.empty and not inspect.isclass(obj):
        returns = f" -> {_annotation(signature.return_annotation)}"
    one_line = f"{name}({', '.join(params)}){returns}"
    if len(one_line) <= 100:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def docstring_markdown(doc: str | None) -> str:
    """A Google-style docstring as Markdown: sections become bullet lists, ``::`` blocks fences."""
    if not doc:
        return ""
    lines = doc.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        section = _SECTION.match(line)
        if section:
            out += [f"**{section.group(1)}:**", ""]
            i, items = _section_items(lines, i + 1)
            out += [_item_markdown(item) for item in items] + [""]
            continue
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1])
            i, block = _literal_block(lines, i + 1, len(line) - len(line.lstrip()))
            out += ["", "```text", *block, "```", ""]
            continue
        out.append(line)
        i += 1
    text = _ROLE.sub(r"\1", "\n".join(out))  # reST roles (:class:`X`) as plain code spans
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _section_items(lines: list[str], i: int) -> tuple[int, list[str]]:
    """The items of an indented docstring section starting at ``lines[i]``, continuations joined."""
    items: list[str] = []
    base: int | None = None
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
        line = lines[i]
        if line.strip():
            indent = len(line) - len(line.lstrip())
            base = indent if base is None else base
            if indent <= base or not items:
                items.append(line.strip())
            else:
                items[-1] += " " + line.strip()
        i += 1
    return i, items


def _item_markdown(item: str) -> str:
    match = _ITEM_NAME.match(item)
    if match:
        return f"- `{match.group(1)}`: {match.group(2)}"
    return f"- {item}"


def _literal_block(lines: list[str], i: int, indent: int) -> tuple[int, list[str]]:
    """The indented block after a ``::`` line whose indent is ``indent``, dedented."""
    block: list[str] = []
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        block.append(lines[i])
        i += 1
    while block and not block[-1].strip():
        block.pop()
        i -= 1
    while block and not block[0].strip():
        block.pop(0)
    margin = min(len(b) - len(b.lstrip()) for b in block if b.strip()) if block else 0
    return i, [b[margin:] for b in block]


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties the class itself defines (not inherited ones)."""
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            members.append((name, value))
    return sorted(members)


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower().replace(" ", "-"))


def render_object(name: str, obj: Any) -> list[str]:
    kind = "class" if inspect.isclass(obj) else "function"
    out = [f"### `{name}`", "", f"*{kind}*", "", "```text", format_signature(name, obj), "```", ""]
    doc = docstring_markdown(_own_doc(obj))
    if doc:
        out += [doc, ""]
    if inspect.isclass(obj):
        for member, value in _members(obj):
            if isinstance(value, property):
                head = f"- **`{member}`** *(property)*"
            else:
                signature = re.sub(r",\s*\)", ")", " ".join(format_signature(member, value).split()).replace("( ", "("))
                head = f"- **`{signature.replace('(self, ', '(').replace('(self)', '()')}`**"
            doc = _own_doc(value)
            out.append(head + (f": {_first_paragraph(doc)}" if doc else ""))
        if _members(obj):
            out.append("")
    return out


def _own_doc(obj: Any) -> str | None:
    """The object's own docstring, cleaned (never one inherited from a base class)."""
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if doc else None


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def figures_table() -> list[str]:
    from lance_lightning.metrics.figures import FIGURES

    out = [
        "#### Figures logged by `DataLoadingMonitor`",
        "",
        "Logged as `data/<name>` every `log_every_n_steps` steps and `data/epoch/<name>` at each epoch end "
        "(from `lance_lightning.metrics.figures.FIGURES`).",
        "",
        "| name | meaning |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {meaning} |" for name, meaning in FIGURES.items()]
    return out + [""]


def render() -> str:
    grouped = public_objects()
    modules = sorted(grouped, key=_module_rank)
    out = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; `tests/scenarios/test_docs.py` fails when this "
        "file is out of date. The [guide](guide.md) explains how the pieces fit together.",
        "",
        "## Contents",
        "",
    ]
    for module in modules:
        names = ", ".join(f"[`{n}`](#{_anchor(n)})" for n, _ in grouped[module])
        out.append(f"- `{module}`: {names}")
    commands = [m for m in COMMAND_MODULES if importlib.util.find_spec(m) is not None]
    out.append("- Commands: " + ", ".join(f"`{m}`" for m in commands))
    out.append("")
    for module in modules:
        out += [f"## `{module}`", ""]
        doc = docstring_markdown(_own_doc(importlib.import_module(module)))
        if doc:
            out += [doc, ""]
        for name, obj in grouped[module]:
            out += render_object(name, obj)
        if module == "lance_lightning.callbacks.monitor":
            out += figures_table()
    out += ["## Commands", ""]
    for module in commands:
        out += [f"### `{module}`", "", docstring_markdown(_own_doc(importlib.import_module(module))), ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def main(argv: list[str]) -> int:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    text = render()
    if argv == ["--check"]:
        current = API_MD.read_text() if API_MD.exists() else ""
        if current != text:
            print(f"{API_MD} is out of date with the docstrings: run `python docs/gen_api.py`", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python docs/gen_api.py [--check]", file=sys.stderr)
        return 2
    API_MD.write_text(text)
    print(f"wrote {API_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
