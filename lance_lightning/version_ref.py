"""Which dataset version a source names: a number, a Lance tag, or a moment (``asof``), as Lance takes them.

Guarantees:
- `resolve_version` turns a source's ``version`` (an int, a digit string, or a tag name) or its
  ``asof`` (an ISO 8601 time, local time without an offset as in Lance: the latest version
  written at or before it) into the version
  number to pin, and a label saying how it was named (``"tag release-1"``, ``"as of
  2026-11-01T00:00:00+00:00"``; ``""`` for a number). Runs read, cursors hold and resumes compare
  the number; the label is only shown (``explain()``, the resume line).
- A name that is not a tag, a version that does not exist (or was cleaned up), a timestamp that
  does not parse or lies before the first version, and ``version`` given with ``asof`` are each a
  `ConfigError` naming ``<split>.version`` or ``<split>.asof``, the value and the fix (the
  existing tags and versions).
- `names_a_number` tells a version given as a number (a resume keeps it, and refuses a cursor read
  at another) from one given by a tag or a moment (a resume follows the number the cursor holds:
  the tag may have moved since).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

import lance

from lance_lightning.errors import ConfigError


def names_a_number(version: Any) -> bool:
    """True for a version given as a number (``3`` or ``"3"``)."""
    return isinstance(version, int) or (isinstance(version, str) and version.isdigit())


def resolve_version(
    dataset: lance.LanceDataset, version: int | str | None, asof: str | None, param: str, uri: str
) -> tuple[int, str]:
    """The version number ``version`` or ``asof`` names in ``dataset`` and how it was named."""
    if version is not None and asof is not None:
        raise ConfigError(
            f"{param}.asof", asof, f"given together with {param}.version={version!r}", "give one of the two"
        )
    if asof is not None:
        return _as_of(dataset, asof, param, uri)
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise ConfigError(f"{param}.version", version, "is not a version", "give a version number or a tag name")
    if names_a_number(version):
        return _number(dataset, int(version), param, uri), ""
    tags = dataset.tags.list()
    if version not in tags:
        known = sorted(tags) or "none"
        raise ConfigError(
            f"{param}.version",
            version,
            f"no tag of that name at {uri} (tags: {known})",
            "give an existing tag or a version number; `lance-lightning holds` and Lance's tags.list() show tags",
        )
    return _number(dataset, int(tags[version]["version"]), param, uri), f"tag {version}"


def _number(dataset: lance.LanceDataset, version: int, param: str, uri: str) -> int:
    available = [v["version"] for v in dataset.versions()]
    if version not in available:
        raise ConfigError(
            f"{param}.version",
            version,
            f"that version does not exist (or was cleaned up) at {uri}",
            f"pick an existing version {_shown(available)}, or omit `version` to pin the latest",
        )
    return version


def _as_of(dataset: lance.LanceDataset, asof: str, param: str, uri: str) -> tuple[int, str]:
    moment = _moment(asof, param)
    # `versions()` gives each timestamp as a datetime (its TypedDict also admits Lance's raw nanoseconds).
    versions = [(_utc(cast(datetime, v["timestamp"])), v["version"]) for v in dataset.versions()]
    before = [number for written, number in versions if written <= moment]
    if not before:
        first = min(versions)[0].isoformat() if versions else "never"
        raise ConfigError(
            f"{param}.asof",
            asof,
            f"no version of {uri} was written at or before it (the first: {first})",
            "give a later time, or a version number",
        )
    return max(before), f"as of {moment.isoformat()}"


def _moment(asof: str, param: str) -> datetime:
    try:
        moment = datetime.fromisoformat(str(asof).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{param}.asof", asof, "is not an ISO 8601 time", "write it like 2026-11-01T12:00:00+00:00"
        ) from None
    return _utc(moment)


def _utc(moment: datetime) -> datetime:
    """In UTC; a naive time is local time, as in Lance's version timestamps and its own ``asof``."""
    return moment.astimezone(timezone.utc)


def _shown(available: list[int]) -> list[Any]:
    return available if len(available) <= 20 else available[:5] + ["..."] + available[-5:]
