"""The input of a prepare, local or remote: where its files are, which of them are read, and their bytes.

An input is a local path or a URI of any file system ``pyarrow.fs`` opens: ``s3://bucket/raw``
(S3 and S3-compatible stores), ``gs://``, ``az://``/``abfs://``, ``hdfs://``, ``file://``.

Guarantees:
- `open_input` checks the input before anything is written: a local path that is missing, a URI
  whose store cannot be reached or refuses the credentials, a prefix that holds nothing, or a file
  where a folder is needed, is a `ConfigError` naming ``input``, the URI (without credentials) and
  the fix. A remote store's errors are bounded (`CONNECT_TIMEOUT_S`, `RETRIES` attempts), never a hang.
- ``s3://`` inputs use the storage options Lance takes (``aws_access_key_id``,
  ``aws_secret_access_key``, ``aws_session_token``, ``aws_region``, ``aws_endpoint``,
  ``allow_http``), else pyarrow's defaults (its environment variables and credential chain), as
  other schemes always do. `filesystem` is the one place Lance's storage options become a
  ``pyarrow.fs`` file system (the prediction writer's run folder uses it too).
- `Input.files` lists the input's files in one order, local or remote: a folder's files (sorted by
  name) before its sub-folders' (sorted), hidden names (``.DS_Store``, ``.git/``) left out; each
  with its size and modification time. Locally an entry that is not a regular file (FIFO, socket,
  device, dangling link, link loop) or whose name is not UTF-8 is never opened: it is listed as
  skipped, or refused by ``on_bad_file="error"``. A store's entries that are not objects (folder
  markers) are left out.
- An `Input` carries its storage options, never an open file system, when pickled to a spawned
  process or a Ray task: each process opens its own.
- `Input.shown` is the input as reports, the completion record, logs and errors show it: a local
  path as given, a URI without its userinfo (``user:secret@``) and query; storage options never appear.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs

from lance_lightning.errors import ConfigError
from lance_lightning.redaction import redact_text, secret_values

#: Seconds to wait for a store's connection, and attempts per request, before an input check fails.
CONNECT_TIMEOUT_S = 10.0
RETRIES = 3
#: Bytes read ahead from a remote file (tar shards are read in 512-byte headers).
READ_AHEAD = 4 << 20
#: Characters of a store's error message kept in a `ConfigError`.
_ERROR_CHARS = 300


@dataclass(frozen=True)
class Skipped:
    """An input file left out, and why (shown in the closing report)."""

    path: str
    reason: str


@dataclass(frozen=True)
class Entry:
    """One input file: its ``path`` relative to the input (``/``-separated; the file's name when the
    input is one file), its ``size`` in bytes and modification time (ns since the epoch)."""

    path: str
    size: int
    mtime_ns: int


def filesystem(uri: str, storage_options: dict[str, str] | None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path of ``uri``: an ``s3://`` URI with ``storage_options`` gets
    them (keys, token, region, endpoint, ``allow_http``), anything else pyarrow's defaults."""
    if not uri.startswith(("s3://", "s3a://")) or not storage_options:
        return pafs.FileSystem.from_uri(uri)
    options = {key.lower(): str(value) for key, value in storage_options.items()}

    def first(*keys: str) -> str | None:
        return next((options[key] for key in keys if options.get(key)), None)

    endpoint = first("aws_endpoint", "endpoint", "aws_endpoint_url", "endpoint_url")
    scheme = None
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    s3 = pafs.S3FileSystem(
        access_key=first("aws_access_key_id", "access_key_id"),
        secret_key=first("aws_secret_access_key", "secret_access_key"),
        session_token=first("aws_session_token", "session_token", "token"),
        region=first("aws_region", "region") or "us-east-1",
        endpoint_override=endpoint,
        scheme=scheme or ("http" if first("allow_http", "aws_allow_http") == "true" else "https"),
        connect_timeout=CONNECT_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES),
    )
    return s3, uri.split("://", 1)[1].split("?", 1)[0].rstrip("/")


def is_remote(input_: str) -> bool:
    return "://" in input_


def shown_uri(uri: str) -> str:
    """``uri`` without its userinfo and query (where credentials can be written)."""
    if not is_remote(uri):
        return uri
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{_split_userinfo(rest.split('?', 1)[0])[1]}"


def _split_userinfo(rest: str) -> tuple[str, str]:
    """(``user:secret``, the rest) of a URI after its ``scheme://``; ``""`` when it has none. The
    userinfo runs to the last ``@`` with a ``:`` before it (a secret may hold an unescaped ``/``);
    ``container@account`` (Azure) has no ``:`` and is kept."""
    at = rest.rfind("@")
    return (rest[:at], rest[at + 1 :]) if at > 0 and ":" in rest[:at] else ("", rest)


def uri_secrets(uri: str) -> set[str]:
    """The credentials written in ``uri``'s userinfo (and query), as written and unescaped."""
    from urllib.parse import parse_qsl, unquote

    if not is_remote(uri):
        return set()
    rest = uri.split("://", 1)[1]
    userinfo = _split_userinfo(rest.split("?", 1)[0])[0]
    found = {userinfo, *userinfo.split(":", 1)} if userinfo else set()
    query = rest.split("?", 1)[1] if "?" in rest else ""
    found |= {value for key, value in parse_qsl(query) if any(w in key.lower() for w in ("key", "token", "secret"))}
    return {value for part in found if part for value in (part, unquote(part))}


@dataclass
class Input:
    """A checked input (`open_input`); see the module docstring."""

    #: As given (a URI may hold credentials: never shown; `shown` is).
    given: str
    storage_options: dict[str, str] | None = field(default=None, repr=False)
    #: Whether the input is one file (else a folder or prefix).
    is_file: bool = False
    _fs: Any = field(default=None, repr=False, compare=False)

    @property
    def remote(self) -> bool:
        return is_remote(self.given)

    @property
    def shown(self) -> str:
        return shown_uri(self.given) if self.remote else str(self.local_root)

    @property
    def local_root(self) -> Path:
        """The local path (``Path(given)`` expanded; meaningless for a remote input)."""
        return Path(self.given).expanduser()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}  # a process opens its own file system

    def _store(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            self._fs = filesystem(self.given, self.storage_options)
        return self._fs

    # -- listing --------------------------------------------------------------------------------
    def files(self, skipped: list[Skipped], on_bad_file: str) -> Iterator[Entry]:
        """The input's files (the input itself when it is one file), in order (module docstring)."""
        if self.remote:
            yield from self._remote_files()
        elif self.is_file:
            info = self.local_root.stat()
            yield Entry(self.local_root.name, info.st_size, info.st_mtime_ns)
        else:
            yield from _local_files(self.local_root, skipped, on_bad_file)

    def _remote_files(self) -> Iterator[Entry]:
        store, root = self._store()
        if self.is_file:
            info = store.get_file_info(root)
            yield Entry(root.rsplit("/", 1)[-1], info.size or 0, info.mtime_ns or 0)
            return
        listed = self._checked(lambda: store.get_file_info(pafs.FileSelector(root, recursive=True)))
        entries = []
        for info in listed:
            relative = info.path[len(root) :].lstrip("/")
            parts = relative.split("/")
            if info.type == pafs.FileType.File and relative and not any(p.startswith(".") for p in parts):
                entries.append(Entry(relative, info.size or 0, info.mtime_ns or 0))
        yield from sorted(entries, key=lambda entry: walk_order(entry.path))

    # -- reading --------------------------------------------------------------------------------
    def location(self, path: str) -> str:
        """Where the file ``path`` (relative, as `files` gives it) is: a local path or a store path."""
        if self.remote:
            root = self._store()[1]
            return root if self.is_file else f"{root}/{path}"
        return str(self.local_root if self.is_file else self.local_root / path)

    def open(self, path: str) -> IO[bytes]:
        """The file ``path`` opened for reading (seekable; a remote one read ahead `READ_AHEAD` bytes)."""
        if not self.remote:
            return open(self.location(path), "rb")  # noqa: SIM115 - the caller closes it
        raw = self._store()[0].open_input_file(self.location(path))
        return io.BufferedReader(raw, READ_AHEAD)  # a NativeFile is a raw stream (readinto, seek)

    def read_bytes(self, path: str) -> bytes:
        with self.open(path) as handle:
            return handle.read()

    def arrow_file(self, path: str) -> Any:
        """The file ``path`` as pyarrow reads it (a local path, or a store's random-access file)."""
        if not self.remote:
            return self.location(path)
        return self._store()[0].open_input_file(self.location(path))

    def entry(self, path: str) -> Entry | None:
        """The file ``path`` (relative to the input folder), or None when there is no such file."""
        if not self.remote:
            local = self.local_root / path
            if not local.is_file():
                return None
            info = local.stat()
            return Entry(path, info.st_size, info.st_mtime_ns)
        store, root = self._store()
        found = self._checked(lambda: store.get_file_info(f"{root}/{path}"))
        return Entry(path, found.size or 0, found.mtime_ns or 0) if found.type == pafs.FileType.File else None

    def contains(self, output: str) -> bool:
        """Whether ``output`` (a dataset URI or path) lies inside this input folder."""
        if self.remote != is_remote(output):
            return False
        if not self.remote:
            return Path(output).resolve().is_relative_to(self.local_root.resolve())
        mine, theirs = shown_uri(self.given).rstrip("/"), shown_uri(output).rstrip("/")
        return theirs == mine or theirs.startswith(mine + "/")

    def _checked(self, call: Any) -> Any:
        """``call()``, a store's failure raised as the `ConfigError` of an unreachable input."""
        try:
            return call()
        except (OSError, pa.ArrowException, ValueError) as error:
            raise unreachable(self, error) from None


def open_input(input_: str | os.PathLike[str], storage_options: dict[str, str] | None, *, file_ok: bool) -> Input:
    """The input, checked (module docstring): `ConfigError` naming it when it cannot be read."""
    given = os.fspath(input_)
    found = Input(given, storage_options)
    if found.remote:
        store, path = found._checked(lambda: filesystem(given, storage_options))
        found._fs = (store, path)
        info = found._checked(lambda: store.get_file_info(path))
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(
                "input",
                found.shown,
                "does not exist (no object or prefix at that URI)",
                "check the bucket and the prefix: give the folder (or file) holding the raw data",
            )
        found.is_file = info.type == pafs.FileType.File
    else:
        if not found.local_root.exists():
            raise ConfigError("input", given, "does not exist", "give the folder (or file) holding the raw data")
        found.is_file = found.local_root.is_file()
    if found.is_file and not file_ok:
        raise ConfigError("input", found.shown, "is a file; this format reads a folder", "give its folder")
    return found


def unreachable(found: Input, error: BaseException) -> ConfigError:
    """The error of an input whose store could not be read (credentials redacted from its message)."""
    message = " ".join(str(error).split()).replace(found.given, found.shown)[:_ERROR_CHARS]
    known = secret_values({"storage_options": found.storage_options}) | uri_secrets(found.given)
    message = redact_text(message, known)
    return ConfigError(
        "input",
        found.shown,
        f"cannot be read from its store ({type(error).__name__}: {message})",
        "check the URI, the network and the storage options (--storage-option KEY=VALUE: aws_endpoint, "
        "aws_region, aws_access_key_id, aws_secret_access_key)",
    )


def walk_order(path: str) -> list[tuple[int, str]]:
    """The sort key of a relative file path in walk order: a folder's files before its sub-folders."""
    parts = path.split("/")
    return [(1, part) for part in parts[:-1]] + [(0, parts[-1])]


def _local_files(root: Path, skipped: list[Skipped], on_bad_file: str) -> Iterator[Entry]:
    """Every regular file under the local folder ``root`` in walk order; other entries never opened."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(folder) / name
            problem, info = _not_a_file(path)
            if info is not None:
                yield Entry(path.relative_to(root).as_posix(), info.st_size, info.st_mtime_ns)
                continue
            shown = os.fsencode(path.relative_to(root).as_posix()).decode("utf-8", "backslashreplace")
            if on_bad_file == "error":
                raise ConfigError(
                    "input", shown, problem, "remove it from the input, or pass --on-bad-file skip to leave it out"
                )
            skipped.append(Skipped(shown, problem))


def _not_a_file(path: Path) -> tuple[str, os.stat_result | None]:
    """Its stat when ``path`` is a regular file with a UTF-8 name that prepare may open, else why not."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return "has a file name that is not UTF-8 (rename it)", None
    try:
        info = path.stat()  # follows a symbolic link; never opens the file
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link loop", None
        if path.is_symlink():
            return f"is a dangling symbolic link (to {os.readlink(path)})", None
        return f"cannot be read ({error.strerror or error})", None
    if stat.S_ISREG(info.st_mode):
        return "", info
    kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else "a device"
    return f"is not a regular file ({kind}): never opened", None
