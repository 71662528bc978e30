"""A source named through a catalog: a Lance namespace and a table id, resolved to where the table lives.

Guarantees:
- `locate` gives the URI and storage options a source opens. With ``namespace`` (``{"impl": ...,
  "properties": {...}}``, as `lance_namespace.connect` takes them: ``dir``, ``rest`` or a class
  path) and ``table_id`` (``["db", "images"]``), they are the table's location and the options the
  namespace's ``describe_table`` returns, over the source's own ``storage_options`` (as
  ``lance.dataset(namespace_client=..., table_id=...)`` merges them). Without a namespace they are
  the source's ``uri`` and ``storage_options``, unchanged. Everything after that (pinning, checks,
  cursors, resume) treats the table as that URI: a table the catalog moves elsewhere is another
  source.
- A namespace is connected once per process per configuration; ``describe_table`` runs once per
  process per table (the main process pins; workers open the pinned location, never the catalog).
- Each mistake is a `ConfigError` naming the parameter (``<split>.namespace``, ``<split>.table_id``),
  the value (credentials redacted) and the fix: ``uri`` together with a namespace, a namespace
  without a table id or the reverse, a namespace that does not connect, a table it does not have
  (the message lists the tables at that level), a ``prepare`` spec on a catalog table.
"""

from __future__ import annotations

import json
from typing import Any

from lance_lightning.errors import ConfigError
from lance_lightning.redaction import redact_options

_LOCATED: dict[str, tuple[str, dict[str, str] | None]] = {}


def locate(
    uri: str,
    storage_options: dict[str, str] | None,
    namespace: dict[str, Any] | None,
    table_id: list[str] | None,
    param: str,
    *,
    prepares: bool = False,
) -> tuple[str, dict[str, str] | None]:
    """(URI, storage options) the source opens (see the module docstring)."""
    if namespace is None and table_id is None:
        return uri, storage_options
    check_catalog(uri, namespace, table_id, param, prepares)
    key = json.dumps([namespace, table_id, storage_options], sort_keys=True, default=str)
    if key not in _LOCATED:
        _LOCATED[key] = _describe(namespace or {}, list(table_id or []), storage_options, param)
    return _LOCATED[key]


def check_catalog(
    uri: str, namespace: dict[str, Any] | None, table_id: list[str] | None, param: str, prepares: bool
) -> None:
    """Refuse a catalog reference that cannot name one table (no I/O; see the module docstring)."""
    if namespace is None and table_id is None:
        return
    if uri:
        raise ConfigError(f"{param}.uri", uri, "given together with a namespace", "give either `uri` or both")
    if table_id is None:
        raise ConfigError(
            f"{param}.table_id", None, "a namespace needs the table's id", 'give `table_id`, e.g. ["images"]'
        )
    if namespace is None:
        raise ConfigError(
            f"{param}.namespace", None, "a table id needs a namespace", "give `namespace: {impl: dir, properties: ...}`"
        )
    if not isinstance(table_id, list | tuple) or not table_id or not all(isinstance(p, str) for p in table_id):
        raise ConfigError(f"{param}.table_id", table_id, "is not a list of names", 'give e.g. ["db", "images"]')
    if not isinstance(namespace, dict) or not isinstance(namespace.get("impl"), str):
        raise ConfigError(
            f"{param}.namespace",
            shown_namespace(namespace),
            "needs `impl` (dir, rest or a class path) and `properties`",
            "give e.g. {impl: dir, properties: {root: /data/catalog}}",
        )
    if prepares:
        raise ConfigError(
            f"{param}.prepare",
            table_id,
            "prepare writes to a URI, not to a catalog table",
            "prepare to a URI and register it in the catalog, or drop `prepare`",
        )


def _describe(
    namespace: dict[str, Any], table_id: list[str], storage_options: dict[str, str] | None, param: str
) -> tuple[str, dict[str, str] | None]:
    from lance_namespace import DescribeTableRequest, ListTablesRequest, connect
    from lance_namespace.errors import LanceNamespaceError, TableNotFoundError

    properties = {str(k): str(v) for k, v in (namespace.get("properties") or {}).items()}
    try:
        client = connect(namespace["impl"], properties)
    except (ValueError, OSError, ImportError, LanceNamespaceError) as error:
        raise ConfigError(
            f"{param}.namespace",
            shown_namespace(namespace),
            f"could not connect ({str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__})",
            "check `impl` and its properties (for `dir`: `root`, the catalog's folder or URI)",
        ) from None
    try:
        response = client.describe_table(DescribeTableRequest(id=table_id))
    except TableNotFoundError:
        try:
            tables = client.list_tables(ListTablesRequest(id=table_id[:-1])).tables
        except (LanceNamespaceError, ValueError, OSError):
            tables = []
        raise ConfigError(
            f"{param}.table_id",
            table_id,
            f"the namespace has no such table (tables there: {sorted(tables) or 'none'})",
            "give an existing table's id",
        ) from None
    if response.location is None:
        raise ConfigError(f"{param}.table_id", table_id, "the namespace gave no location", "check the catalog")
    options = dict(storage_options or {}) | dict(response.storage_options or {})
    return response.location, options or None


def shown_namespace(namespace: Any) -> Any:
    """``namespace`` with its properties' credentials redacted, for messages and ``repr``."""
    if isinstance(namespace, dict) and isinstance(namespace.get("properties"), dict):
        return {**namespace, "properties": redact_options(namespace["properties"])}
    return namespace
