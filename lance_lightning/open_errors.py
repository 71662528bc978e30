"""What went wrong opening a source's dataset or planning its filter, as a `ConfigError` with the fix.

Guarantees:
- `open_error` turns what Lance raised when opening a URI into one `ConfigError` naming
  ``<split>.uri``: a file rather than a dataset, a missing bucket, refused credentials, a local
  permission, a missing path (relative paths say where they resolve from), else the first line of
  Lance's message with the endpoint fix. The text given is already redacted by the caller.
- `filter_error` turns what Lance raised planning or evaluating a filter into one `ConfigError`
  naming ``<split>.filter`` and the columns a predicate may use.
"""

from __future__ import annotations

import os

from lance_lightning.errors import ConfigError

#: Object-store answers that mean the credentials were refused or lack a permission.
_DENIED = (
    "403 forbidden",
    "accessdenied",
    "signaturedoesnotmatch",
    "invalidaccesskeyid",
    "expiredtoken",
    "invalidtoken",
    "authorizationpermissionmismatch",
    "authenticationfailed",
    "401 unauthorized",
)


def open_error(uri: str, param: str, text: str) -> ConfigError:
    """The `ConfigError` for a source that Lance could not open, with the fix for its cause."""
    lower, remote = text.lower(), "://" in uri and not uri.startswith("file://")
    where, reason = f"{param}.uri", _first_line(text)
    if (not remote and os.path.isfile(uri)) or "not a directory" in lower:
        return ConfigError(
            where,
            uri,
            "this is a file, not a Lance dataset (a directory with _versions/ inside)",
            "convert it once, e.g. for Parquet: lance.write_dataset(pyarrow.parquet.read_table(path), "
            "'data/name.lance'), and give that directory as the uri",
        )
    if "nosuchbucket" in lower:
        bucket = uri.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]  # the host, without userinfo
        return ConfigError(
            where,
            uri,
            f"the bucket {bucket!r} does not exist on this endpoint",
            "check the bucket name in the uri and the endpoint in the environment or "
            f"`{param}.storage_options` (aws_endpoint / AWS_ENDPOINT)",
        )
    if any(code in lower for code in _DENIED):
        return ConfigError(
            where,
            uri,
            f"the store refused access ({reason})",
            "check the credentials (environment variables such as AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY, a profile, or storage_options) and that they may read this path",
        )
    if "permission denied" in lower or "os error 13" in lower:
        return ConfigError(
            where,
            uri,
            "permission denied reading the dataset",
            "give this user read access to the dataset directory (e.g. chmod -R u+rX, or run as its owner)",
        )
    if "not found" in lower or "no such file" in lower:
        if remote:
            return ConfigError(
                where,
                uri,
                "no Lance dataset exists at that path in the bucket",
                "check the key after the bucket name (list it with your store's tools), or write the dataset first",
            )
        hint = "" if os.path.isabs(uri) else f"; relative paths resolve from the working directory {os.getcwd()}"
        return ConfigError(
            where, uri, "no Lance dataset exists there", f"check the path{hint}, or write the dataset first"
        )
    return ConfigError(
        where,
        uri,
        f"the dataset could not be opened ({reason})",
        f"check the endpoint and region (environment or `{param}.storage_options`) and that the store is reachable",
    )


def filter_error(param: str, filter: str, error: BaseException, columns: list[str]) -> ConfigError:
    """The `ConfigError` for a filter Lance cannot run (``error``: what Lance raised)."""
    return ConfigError(
        param,
        filter,
        f"Lance cannot run this filter ({_first_line(str(error))})",
        f'write a SQL predicate over the columns {columns}, e.g. "label = 3"',
    )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].split(", /")[0] if text.strip() else text
