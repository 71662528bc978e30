"""``lance-lightning prepare``: raw files to a Lance dataset from the command line (`lance_lightning.write`).

Guarantees:
- `prepare_main` returns 0 when the output is complete (prepared now, resumed, or already complete:
  then it writes nothing and says so), 2 for a usage error (argparse's message). Bad input raises
  `ConfigError` naming the file or the flag, which `lance_lightning.cli.main` prints in a few lines
  with exit status 1, before anything is written where a survey of the input can find it.
- The progress bar goes to stderr and the closing report (rows, bytes in and out, rows/s, skipped
  files and why) to stdout; ``--quiet`` prints only the report's first line.
- Rerunning the same command after an interruption (Ctrl-C, SIGKILL, a full disk) continues from
  the last committed unit; the result equals an uninterrupted run's, row for row.
- Ctrl-C (exit status 130), a full disk or a file-size limit (``ENOSPC``, ``EFBIG``) and a dead
  ``--pool processes`` worker (``BrokenProcessPool``) end the command with a few lines on stderr
  (what happened, that the output is intact and resumable, the command to rerun), never a traceback.
- Storage options given with ``--storage-option`` are used to read an ``s3://`` input and to write,
  and are never printed (`lance_lightning.write.input_fs`).
- Imports neither Lightning nor torch; ``--help`` and a usage error import not even Lance (the
  parser needs only the standard library).
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from lance_lightning.cli.parser import add_storage_options, storage_options
from lance_lightning.errors import ConfigError
from lance_lightning.redaction import redact_text, secret_values
from lance_lightning.vocabulary import PREPARE_FORMATS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lance-lightning prepare",
        description=(
            "Convert raw files to a Lance dataset: parallel, resumable (rerun the same command after an "
            "interruption) and atomic (the output appears only complete). Every row gets a stable integer `id`. "
            "See docs/getting-data-in.md."
        ),
    )
    parser.add_argument("--format", required=True, choices=PREPARE_FORMATS, help="the input's format")
    parser.add_argument(
        "--input",
        required=True,
        help="the raw files: a folder (or one .parquet/.tar file), local or a URI (s3://bucket/raw, gs://...)",
    )
    parser.add_argument("--output", required=True, help="the Lance dataset to write (local path or s3://...)")
    parser.add_argument("--workers", type=int, default=None, help="threads or processes (default: min(4, CPUs))")
    parser.add_argument(
        "--pool",
        choices=("threads", "processes", "ray"),
        default="threads",
        help=(
            "write units on threads (default), spawned processes (for CPU-bound checks of many images) "
            "or Ray tasks (the ray extra; across a Ray cluster's machines for an object-store output)"
        ),
    )
    parser.add_argument(
        "--on-bad-file",
        choices=("skip", "error"),
        default="skip",
        help="an unreadable or corrupt file: skip it and list it in the report (default), or stop naming it",
    )
    parser.add_argument(
        "--no-probe-media",
        dest="probe_media",
        action="store_false",
        help="videofolder/audiofolder: store the files' bytes without opening them (no stream-fact columns)",
    )
    parser.add_argument("--unit-files", type=int, default=2048, help="input files per work unit (one commit)")
    parser.add_argument("--unit-bytes", type=int, default=256 << 20, help="input bytes per work unit (one commit)")
    parser.add_argument(
        "--index",
        default=None,
        help="columns to build scalar indexes on, comma-separated (e.g. label,split): BITMAP up to 1,000 "
        "distinct values, else BTREE; built before the dataset is marked complete",
    )
    add_storage_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar; print only the outcome's line")
    return parser


def prepare_main(argv: list[str] | None = None) -> int:
    """``lance-lightning prepare ...``: returns the exit status (0 complete, 2 usage); bad input raises."""
    try:
        args = _parser().parse_args(argv)
        options = storage_options("prepare", args.storage_option)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    from lance_lightning.source import Prepare  # Lance: only once the arguments parse
    from lance_lightning.write.prepare import prepare

    try:
        spec = Prepare(
            format=args.format,
            input=args.input,
            workers=args.workers,
            pool=args.pool,
            on_bad_file=args.on_bad_file,
            unit_files=args.unit_files,
            unit_bytes=args.unit_bytes,
            probe_media=args.probe_media,
            index=[c.strip() for c in args.index.split(",")] if args.index is not None else None,
        )
        report = prepare(spec, args.output, storage_options=options or None, progress=not args.quiet)
    except ConfigError as error:  # the flag, not the spec's field, names what to change
        flag = "--" + error.param.rsplit(".", 1)[-1].replace("_", "-")
        raise ConfigError(flag, error.value, error.problem, error.fix) from None
    except KeyboardInterrupt:
        return _stopped(argv, options, "interrupted (Ctrl-C)", 130)
    except BrokenProcessPool:
        return _stopped(argv, options, "a worker process of --pool processes died (killed, or out of memory?)", 1)
    except OSError as error:
        full = _disk_full(error, args.output)
        if full is None:
            raise
        return _stopped(argv, options, full, 1)
    print(report.line() if args.quiet else report.text(), flush=True)
    return 0


#: Free bytes below which the file system of a local output that failed a write counts as full.
FULL_BYTES = 1 << 20


def _disk_full(error: BaseException, output: str) -> str | None:
    """What a full disk or a file-size limit says (``ENOSPC``, ``EFBIG``, also as Lance words it), or
    None. A local output's file system left with less than `FULL_BYTES` free counts as full whatever
    the error says (Lance reports a blob file cut short by a full disk as a bad blob range)."""
    if "://" not in output:
        folder = Path(output).absolute().parent
        while not folder.exists():
            folder = folder.parent
        fs = os.statvfs(folder)
        if fs.f_bavail * fs.f_frsize < FULL_BYTES:
            return f"the output's disk is full ({fs.f_bavail * fs.f_frsize:,} bytes free)"
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen)
        if getattr(seen, "errno", None) == errno.ENOSPC or "No space left on device" in text:
            return "the output's disk is full (No space left on device)"
        if getattr(seen, "errno", None) == errno.EFBIG or "File too large" in text:
            return "a file of the output reached the size limit (File too large)"
        seen = seen.__cause__ or seen.__context__
    return None


def _stopped(argv: list[str] | None, options: dict[str, str], what: str, code: int) -> int:
    """A prepare stopped by something outside it: a few lines on stderr (the credentials in
    ``options`` redacted), no traceback; the exit status."""
    args = sys.argv[2:] if argv is None else argv
    shown = redact_text(shlex.join(["lance-lightning", "prepare", *args]), secret_values({"storage_options": options}))
    print(
        f"lance-lightning prepare: stopped: {what}.\n"
        "  The output is intact: the units committed so far are kept, nothing else is visible, and\n"
        "  a rerun of the same command continues from them (making room first if the disk is full):\n"
        f"  {shown}",
        file=sys.stderr,
        flush=True,
    )
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(prepare_main())
