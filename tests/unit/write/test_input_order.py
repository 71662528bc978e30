"""Issue #52: a store's listing is put in the order a local folder is walked (`walk_order`), so a
remote input's rows get the ids the same files get locally. Oracle: ``os.walk`` itself (folders
sorted, a folder's files before its sub-folders'), on real files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning.write.input_fs import open_input, shown_uri, uri_secrets, walk_order

_NAMES = st.text(alphabet="aAbB0_-.~é", min_size=1, max_size=3).filter(lambda n: n not in (".", ".."))
_PATHS = st.lists(st.lists(_NAMES, min_size=1, max_size=4), min_size=1, max_size=25)


def _os_walk_order(root: Path) -> list[str]:
    """Files under ``root`` as ``os.walk`` visits them, sorted as prepare walks (hidden left out)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [(Path(folder) / f).relative_to(root).as_posix() for f in sorted(files) if not f.startswith(".")]
    return found


@settings(max_examples=60, deadline=None)
@given(_PATHS)
def test_the_store_order_is_the_local_walk_order(paths: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        made = []
        for parts in paths:
            target = root.joinpath(*parts)
            try:  # a name already used as a file (or a folder) where the other is needed: left out
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists():
                    continue
                target.write_bytes(b"x")
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                continue
            made.append("/".join(parts))
        local = [entry.path for entry in open_input(str(root), None, file_ok=False).files([], "error")]
        assert local == _os_walk_order(root)
        visible = [p for p in made if not any(part.startswith(".") for part in p.split("/"))]
        assert sorted(visible, key=walk_order) == local  # how a store's flat listing is ordered


def test_a_uri_is_shown_without_its_credentials() -> None:
    assert shown_uri("s3://KEY:se%2Fcret@bucket/raw?endpoint_override=h:1") == "s3://bucket/raw"
    assert shown_uri("s3://KEY:se/cret@bucket/raw") == "s3://bucket/raw"  # an unescaped "/" in the secret
    assert shown_uri("abfs://container@account.dfs.core.windows.net/raw") == (
        "abfs://container@account.dfs.core.windows.net/raw"  # no ":": a container, not credentials
    )
    assert shown_uri("data/raw") == "data/raw"
    assert {"KEY", "se/cret", "se%2Fcret"} <= uri_secrets("s3://KEY:se%2Fcret@bucket/raw")
