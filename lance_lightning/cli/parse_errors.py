"""Parser errors made short: a union type's error names the member the value was meant for.

Guarantees:
- `shorten` rewrites jsonargparse's "Does not validate against any of the Union subtypes" blocks,
  nested ones too, into one line each: the error of the member the value was meant for (a mapping
  with ``uri`` is a `LanceSource`, one with ``class_path: ...LanceMixture`` a mixture) named
  ``as <class path>:``, or for a plain typed field (``list[str] | None``) what was expected and what
  was given. Members that only say they do not apply ("Expected a <class 'NoneType'>", "Option 'uri'
  is not accepted", "Subclasses are disabled ...") are dropped; the dump of the given value is dropped.
  When several members remain and exactly one of them failed on a ``class_path`` the value names
  (the class could not be imported or built: an optional extra not installed, a typo in its
  arguments), that member's error is the one shown, whole: it is what the user wrote, and it may
  say what to install (``RayCheckpointReport`` in ``trainer.callbacks`` without the ``ray`` extra).
- Text without such a block is returned unchanged; a block it cannot read is kept as it is.
"""

from __future__ import annotations

import re

_UNION = "Does not validate against any of the Union subtypes"
#: Member errors that only say the member does not apply to the value.
_NOT_THIS_MEMBER = (
    re.compile(r"^Expected a <class 'NoneType'>"),
    re.compile(r"^Problem with given class_path '[^']*':\s*Option '[^']*' is not accepted", re.S),
    re.compile(r"^Subclasses are disabled for"),
    re.compile(r"is not a subclass of"),
)
_CLASS_PATH = re.compile(r"^Problem with given class_path '([\w.]+)':\s*", re.S)


def shorten(text: str) -> str:
    """``text`` with every union block shortened (see the module docstring)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == _UNION:
            indent = len(line) - len(line.lstrip())
            end = _block_end(lines, index, indent)
            short = _shorten_block(lines[index:end], indent)
            if short is None:
                return text
            rest = "\n".join(lines[end:])
            head = "\n".join(lines[:index])
            return "\n".join(part for part in (head, " " * indent + short, shorten(rest)) if part)
    return text


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """The line after a union block: after its ``Given value:`` line at the block's indent."""
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line.startswith(" " * indent + "Given value:") and len(line) - len(line.lstrip()) == indent:
            return index + 1
    return len(lines)


def _shorten_block(block: list[str], indent: int) -> str | None:
    subtypes = _field(block, indent, "Subtypes:")
    given_type = _field(block, indent, "Given value type:")
    given = _field(block, indent, "Given value:")
    errors = _bullets(block, indent)
    if subtypes is None or errors is None:
        return None
    kept = [error for error in errors if not any(pattern.search(error.strip()) for pattern in _NOT_THIS_MEMBER)]
    named = [error for error in kept if _CLASS_PATH.match(error.strip())]
    if len(kept) > 1 and len(named) == 1:
        kept = named
    if len(kept) == 1:
        member = _CLASS_PATH.match(kept[0].strip())
        inner = shorten(_dedent(kept[0]))
        if member is not None:
            return f"as {member.group(1)}: {_one_line(_CLASS_PATH.sub('', inner.strip(), count=1))}"
        if inner.strip().startswith("Expected a"):
            shown = _short_types(subtypes)
            return f"expected {shown}, got {given!r} ({_short_types(given_type or '')})"
        return _one_line(inner)
    shown = _short_types(subtypes)
    return f"expected {shown}, got {given!r} ({_short_types(given_type or '')})"


def _field(block: list[str], indent: int, name: str) -> str | None:
    prefix = " " * indent + name
    for line in block:
        if line.startswith(prefix) and len(line) - len(line.lstrip()) == indent:
            return line[len(prefix) :].strip()
    return None


def _bullets(block: list[str], indent: int) -> list[str] | None:
    """The member errors under ``Errors:`` (each bullet with its continuation lines)."""
    start = next((i for i, line in enumerate(block) if line.strip() == "Errors:"), None)
    if start is None:
        return None
    bullet_indent = indent + 2
    items: list[list[str]] = []
    for line in block[start + 1 :]:
        stripped_indent = len(line) - len(line.lstrip())
        if stripped_indent <= indent and line.strip():
            break
        if stripped_indent == bullet_indent and line.lstrip().startswith("- "):
            items.append([" " * bullet_indent + "  " + line.lstrip()[2:]])
        elif items:
            items[-1].append(line)
    return ["\n".join(item) for item in items]


def _dedent(text: str) -> str:
    lines = text.splitlines()
    width = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[width:] for line in lines)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _short_types(text: str) -> str:
    """``[list[str], <class 'NoneType'>]`` as ``list[str] or None`` (commas inside brackets kept)."""
    names = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text).strip()
    if names.startswith("[") and names.endswith("]"):
        names = names[1:-1]
    parts, depth, current = [], 0, ""
    for char in names:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return " or ".join(part for part in parts if part).replace("NoneType", "None")
