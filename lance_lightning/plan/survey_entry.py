"""One survey cache entry: what identifies it, and its file, written atomically and never trusted
unless it verifies.

Guarantees:
- `survey_identity` is everything a survey's result depends on, without credentials: the URI (a
  local path made absolute; userinfo redacted) and the store endpoint, the pinned version, the
  filter, the read columns, the row count, and `manifest_fingerprint`: a SHA-256 of the pinned
  version's timestamp and each fragment's id, data file paths and deletion file, read from the
  manifest Lance holds in memory (no I/O; about 18 us per fragment). Data and deletion files get
  new names on every write, so a dataset deleted and written again at the same URI and version
  number has another identity.
- `write_entry` writes a filter's matches (the `RowSet`'s arrays), their count, the row bytes and
  the survey's identity as one file: to a temporary file beside it (named after the host and the
  process), flushed with ``fsync``, then renamed over the entry. A reader sees the whole old file,
  the whole new one or none; a writer killed before the rename leaves only its temporary file
  (`lance_lightning.plan.survey_cache` deletes those of writers that hold no lock).
- The file leads with a SHA-256 of everything after it. `load_entry` reads the file once,
  re-hashes it, and returns its content only when the digest matches, the identity it records is
  the one asked for, its arrays parse and rebuild a `RowSet` of the recorded number of matches;
  otherwise it says which check failed, in one phrase, and returns nothing to use: a damaged,
  truncated or foreign file is never trusted (this project once had a cache that trusted a
  damaged copy).
- The arrays are stored as one zstd frame (level 1): Elias-Fano codes of a 10% filter of 10^7
  rows take 0.62 MB instead of 0.69 (one measurement), so every rank that loads the entry reads
  less; decompressing them takes about 1 ms. They come back as views of one writable buffer (the
  decompressed frame), each 8-byte aligned, and pickle like the scan's own (DataLoader workers,
  shared memory).
- An entry larger than the cache's bound is not written (`write_entry` returns False).

Layout (for tools and tests that inspect or damage entries): `MAGIC`, 32 bytes of SHA-256, then
the hashed part: the header's length (8 bytes, little-endian), the header (JSON: ``identity``,
``matched``, ``row_bytes``, ``arrays`` with each array's name, dtype, shape and offset in the
decompressed frame, ``raw_bytes``: the frame's decompressed size, ``by``: the host and process that
computed it; padded with spaces), then the zstd frame of the arrays' bytes, each padded with zeros
to a multiple of 8.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lance_lightning.plan.rowset import RowSet, rowset_from_arrays
from lance_lightning.redaction import redact_userinfo
from lance_lightning.source import PinnedSource

#: The identity's and the file's format: an entry of another format is another key.
FORMAT = 2
MAGIC = b"lance-lightning survey\n"
_DIGEST = 32
_LENGTH = 8
_CODEC = pa.Codec("zstd", compression_level=1)


@dataclass(frozen=True)
class Entry:
    """A verified entry: the matches, the row bytes (None: not measured) and its header."""

    matches: RowSet
    row_bytes: int | None
    header: dict[str, Any]


def survey_identity(source: PinnedSource) -> dict:
    """What determines a survey's result (module docstring); no credentials."""
    dataset = source.open()
    options = source.storage_options or {}
    endpoint = next((str(v) for k, v in sorted(options.items()) if "endpoint" in k.lower()), None)
    if endpoint is None and "://" in source.uri:
        endpoint = os.environ.get("AWS_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    endpoint = None if endpoint is None else redact_userinfo(endpoint)
    return {
        "format": FORMAT,
        "uri": source.uri if "://" in source.uri else os.path.abspath(source.uri),
        "endpoint": endpoint,
        "version": source.version,
        "filter": source.filter,
        "columns": list(source.columns),
        "rows": source.total_rows,
        "manifest": manifest_fingerprint(dataset),
    }


def manifest_fingerprint(dataset: lance.LanceDataset) -> str:
    """SHA-256 of the pinned version's timestamp and its fragments' ids, data files and deletion
    files, from the manifest Lance holds in memory (about 18 us per fragment)."""
    digest = hashlib.sha256(str(dataset.get_version()["timestamp"]).encode())
    for fragment in dataset.get_fragments():
        files = ",".join(str(data_file.path) for data_file in fragment.data_files())
        digest.update(f"{fragment.fragment_id}|{files}|{fragment.deletion_file() or ''}\n".encode())
    return digest.hexdigest()


def load_entry(path: Path, identity: dict[str, Any]) -> tuple[Entry | None, str | None]:
    """``(entry, None)`` when ``path`` verifies as a survey of ``identity``; ``(None, None)`` when
    there is no file; ``(None, problem)`` when it does not verify (see the module docstring)."""
    try:
        with open(path, "rb") as file:
            data = bytearray(os.fstat(file.fileno()).st_size)  # writable: the arrays are views of it
            read = file.readinto(data)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, f"unreadable ({error})"
    start = len(MAGIC) + _DIGEST
    if read != len(data) or len(data) < start + _LENGTH or data[: len(MAGIC)] != MAGIC:
        return None, "not a survey entry, or truncated"
    if hashlib.sha256(memoryview(data)[start:]).digest() != data[len(MAGIC) : start]:
        return None, "its SHA-256 does not match its content"
    size = int.from_bytes(data[start : start + _LENGTH], "little")
    body = start + _LENGTH + size
    try:
        header = json.loads(bytes(data[start + _LENGTH : body]))
        if header.get("identity") != identity:
            return None, "it records another survey"
        frame = _CODEC.decompress(memoryview(data)[body:], decompressed_size=header["raw_bytes"])
        arrays = {}
        for spec in header["arrays"]:
            count = int(np.prod(spec["shape"]))
            values = np.frombuffer(frame, np.dtype(spec["dtype"]), count, spec["offset"])
            arrays[spec["name"]] = values.reshape(spec["shape"])
        matches = rowset_from_arrays(arrays)
    except (ValueError, KeyError, TypeError, OSError, pa.ArrowException) as error:  # zstd: OSError
        return None, f"its content does not parse ({error})"
    if matches.rows != header["matched"]:
        return None, f"its arrays hold {matches.rows} matches, not the {header['matched']} recorded"
    return Entry(matches, header["row_bytes"], header), None


def write_entry(path: Path, identity: dict[str, Any], matches: RowSet, row_bytes: int | None, limit: int) -> bool:
    """Write ``path`` atomically (module docstring); False, writing nothing, when the entry would
    take more than ``limit`` bytes."""
    arrays = {name: np.require(values, requirements="C") for name, values in matches.arrays().items()}  # 0-d stays
    specs, offset = [], 0
    for name, values in arrays.items():
        specs.append({"name": name, "dtype": values.dtype.str, "shape": list(values.shape), "offset": offset})
        offset += -(-values.nbytes // 8) * 8
    raw = bytearray(offset)
    for spec, values in zip(specs, arrays.values()):  # each array's bytes, then zeros to a multiple of 8
        raw[spec["offset"] : spec["offset"] + values.nbytes] = values.reshape(-1).data.cast("B")
    frame = _CODEC.compress(raw, asbytes=True)
    by = f"{socket.gethostname()}:{os.getpid()}"
    header = {
        "identity": identity,
        "matched": matches.rows,
        "row_bytes": row_bytes,
        "arrays": specs,
        "raw_bytes": offset,
        "by": by,
    }
    text = json.dumps(header).encode()
    lead = len(MAGIC) + _DIGEST + _LENGTH
    if lead + len(text) + len(frame) > limit:
        return False
    chunks = [len(text).to_bytes(_LENGTH, "little"), text, frame]
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    temporary = path.with_name(f"{path.name}.tmp-{by.replace(':', '-')}")
    try:
        with open(temporary, "wb") as file:
            file.write(MAGIC + digest.digest())
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        now = time.time_ns()  # finer than the filesystem's clock: the eviction order is exact
        os.utime(path, ns=(now, now))
    finally:
        temporary.unlink(missing_ok=True)
    return True
