"""Optional integrations with other frameworks, each behind its own extra.

Guarantees: nothing here is imported by ``lance_lightning`` or any other module of the package, so
the default install never needs these frameworks; import a submodule only with its extra
installed (`lance_lightning.integrations.ray`: ``uv sync --extra ray``). ``prepare``'s
``pool="ray"`` is not here: it imports Ray itself, only when used (a lower stage may not import this
package).
"""
