"""``lance-lightning holds URI``: list, or release, the tags with which fits hold dataset versions.

Guarantees:
- `holds_main` returns the exit status and never raises for bad input: 0 when it listed or
  released, 1 when the dataset could not be opened or a tag named with ``--release`` is not one of
  this package's (the error names it and says what to do), 2 for a usage error.
- It only lists and deletes tags whose name starts with `lance_lightning.hold.TAG_PREFIX`; other
  tags of the dataset are never touched.
- Storage options given with ``--storage-option`` are used and never printed; errors show URIs
  with their userinfo redacted.
"""

from __future__ import annotations

import argparse
import sys

from lance_lightning.cli.parser import add_storage_options, storage_options
from lance_lightning.errors import ConfigError
from lance_lightning.hold import list_holds, release_holds
from lance_lightning.redaction import redact_text, redact_userinfo, secret_values
from lance_lightning.source import LanceSource, pin_source


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lance-lightning holds",
        description=(
            "List the Lance tags with which lance-lightning fits hold the dataset versions they train on "
            "(a fit removes its tags when it ends normally; a stopped fit keeps them so that its checkpoints "
            "can resume), or remove them with --release so that cleanup_old_versions may delete those versions."
        ),
    )
    parser.add_argument("uri", help="dataset URI (local path or s3://...)")
    parser.add_argument(
        "--release",
        nargs="*",
        default=None,
        metavar="TAG",
        help="remove these tags (all of lance-lightning's tags on the dataset when no TAG is given)",
    )
    add_storage_options(parser)
    return parser


def holds_main(argv: list[str] | None = None) -> int:
    """``lance-lightning holds URI [--release [TAG ...]]``: the exit status (0 ok, 1 failed, 2 usage)."""
    try:
        args = _parser().parse_args(argv)
        options = storage_options("holds", args.storage_option)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        dataset = pin_source(LanceSource(uri=args.uri, storage_options=options or None), "dataset").open()
        if args.release is None:
            held = list_holds(dataset)
            for name, version in held.items():
                print(f"{name}  version {version}")
            if not held:
                print(f"no version of {redact_userinfo(args.uri)} is held by lance-lightning")
            return 0
        for name in release_holds(dataset, args.release or None):
            print(f"released {name}")
    except (ConfigError, OSError, ValueError, RuntimeError) as error:
        shown = redact_text(str(error), secret_values({"storage_options": options}))
        print(f"lance-lightning holds: error: {shown}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(holds_main())
