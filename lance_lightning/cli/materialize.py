"""``lance-lightning materialize``: copy a (remote) source to a local view from the command line.

Guarantees:
- `materialize_main` returns the exit status and never raises for bad input: 0 when the view
  exists (made, resumed or reused), 1 when it could not be made (the error, which names the
  parameter or the source and says what to do, is printed to stderr after
  ``lance-lightning materialize: error:``), 2 for a usage error (argparse's message).
- With ``--quiet`` stdout holds only the view's path (for ``$(...)`` in scripts); otherwise a
  summary goes to stdout and one progress line per committed chunk to stderr.
- Storage options given with ``--storage-option`` are used to read and are never printed; errors
  and the summary show URIs with their userinfo redacted (`lance_lightning.redaction`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lance_lightning.cli.parser import add_storage_options, storage_options
from lance_lightning.errors import ConfigError
from lance_lightning.materialize.view import DEFAULT_CHUNK_ROWS, MaterializeError, materialize_view
from lance_lightning.redaction import redact_text, secret_values
from lance_lightning.source import LanceSource


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lance-lightning materialize",
        description=(
            "Copy a (remote) Lance dataset to a local materialized view, once: only the rows of "
            "--filter, only --columns, optionally pre-shuffled. Prints the view's path; train from it "
            "with data.train.uri, or set data.materialize.cache_dir to do this automatically. "
            "Credentials: prefer environment variables (AWS_ACCESS_KEY_ID, ...); they are never "
            "written into the view or its manifest."
        ),
    )
    parser.add_argument("--uri", required=True, help="source dataset URI (local path or s3://...)")
    parser.add_argument("--out-dir", required=True, help="local cache directory for views")
    parser.add_argument("--columns", nargs="+", default=None, help="columns to keep (default: all)")
    parser.add_argument("--filter", default=None, help="SQL predicate selecting the rows to keep")
    parser.add_argument("--version", type=int, default=None, help="source version (default: the latest)")
    parser.add_argument("--shuffle-seed", type=int, default=None, help="pre-shuffle the view with this seed")
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=DEFAULT_CHUNK_ROWS,
        help="rows per commit (an interrupted copy resumes after the last one)",
    )
    add_storage_options(parser)
    parser.add_argument("--quiet", action="store_true", help="print only the view's path")
    return parser


def materialize_main(argv: list[str] | None = None) -> int:
    """``lance-lightning materialize ...``: returns the exit status (0 ok, 1 failed, 2 usage)."""
    try:
        args = _parser().parse_args(argv)
        options = storage_options("materialize", args.storage_option)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    source = LanceSource(
        uri=args.uri, columns=args.columns, filter=args.filter, version=args.version, storage_options=options or None
    )

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"  {done:,} / {total:,} rows", file=sys.stderr, flush=True)

    try:
        result = materialize_view(
            source, args.out_dir, shuffle_seed=args.shuffle_seed, chunk_rows=args.chunk_rows, on_chunk=progress
        )
    except (ConfigError, MaterializeError, RuntimeError, OSError, ValueError) as error:
        shown = redact_text(str(error), secret_values({"storage_options": options}))
        print(f"lance-lightning materialize: error: {shown}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.uri)
        return 0
    m = result.manifest
    how = (
        "reused (source version unchanged)"
        if result.reused
        else (
            f"created in {result.seconds:.1f} s"
            + (f", resumed after {result.resumed_rows:,} rows" if result.resumed_rows else "")
        )
    )
    print(
        f"view: {result.uri}\n  {how}\n  source: {m['source']['uri']} @ version {m['source']['version']}\n"
        f"  rows: {m['rows']:,}  columns: {m['columns']}  filter: {m['filter']!r}  shuffle_seed: "
        f"{m['shuffle_seed']}\n  manifest: {Path(result.uri).with_suffix('.json')}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(materialize_main())
