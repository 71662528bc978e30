"""What tests/unit/test_zygote.py asks of a process, as a script or ``-m tests.zygote_probe``:
``state`` prints (JSON) what a fresh interpreter sets up (argv, path head, cwd, a variable, signal
dispositions and mask, ``__main__``, session, parent pid); ``raise``, ``interrupt``, ``exit CODE``,
``exit-text``, ``kill``, ``term`` (SIGTERM), ``segv`` (a crash) end the process each way an interpreter
can end; ``atexit`` prints at exit; ``interleave`` writes to stdout and stderr in turn; ``group``
starts a grandchild in its process group that sleeps (``hold``: holding stdout; else with its
output closed), prints its pid and exits (``hang``: sleeps too)."""

import atexit
import faulthandler
import json
import os
import signal
import sys
import time


def state() -> dict:
    import __main__

    handlers = {}
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            handler = signal.getsignal(sig)
            handlers[int(sig)] = getattr(handler, "__name__", str(handler))
    return {
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "path": sys.path[:2],
        "cwd": os.getcwd(),
        "variable": os.environ.get("ZYGOTE_PROBE"),
        "signals": handlers,
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "main": {k: repr(v) for k, v in vars(__main__).items() if k in ("__name__", "__package__", "__file__")},
        "spec": getattr(__main__.__spec__, "name", None),
        "loader": type(__main__.__loader__).__name__,
        "own_session": os.getsid(0) == os.getpid(),
        "ppid": os.getppid(),
        "stdin": os.path.realpath("/proc/self/fd/0"),
        "stdio": [
            (type(f.buffer).__name__, f.line_buffering, f.write_through, f.encoding, f.errors, f.buffer.raw.name)
            if hasattr(f.buffer, "raw")
            else (type(f.buffer).__name__, f.line_buffering, f.write_through, f.encoding, f.errors, f.buffer.name)
            for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        ],
        "faulthandler": faulthandler.is_enabled(),
        "bytecode": [sys.dont_write_bytecode, sys.pycache_prefix],
    }


def main(what: str, *rest: str) -> None:
    if what == "state":
        print(json.dumps(state()))
    elif what == "raise":
        print("before", flush=True)
        raise ValueError("the probe raised")
    elif what == "interrupt":
        atexit.register(print, "atexit ran")
        raise KeyboardInterrupt
    elif what == "exit":
        sys.exit(int(rest[0]))
    elif what == "exit-text":
        sys.exit("the probe exits with a message")
    elif what == "kill":
        sys.stdout.write("partial")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "term":
        sys.stdout.write("partial")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)
    elif what == "segv":
        print("before the crash")
        import ctypes

        ctypes.string_at(0)
    elif what == "interleave":
        for i in range(3):
            print(f"out {i}")
            print(f"err {i}", file=sys.stderr)
        sys.stdout.write("no newline")
    elif what == "group":
        import subprocess

        code = "import sys, time; time.sleep(int(sys.argv[1])); print('grandchild done', flush=True)"
        held = None if rest[0] == "hold" else subprocess.DEVNULL
        child = subprocess.Popen([sys.executable, "-c", code, rest[1]], stdout=held, stderr=held)
        print(child.pid, flush=True)
        if rest[2:] == ("hang",):
            time.sleep(600)
    elif what == "atexit":
        atexit.register(print, "atexit ran")
        sys.stdout.write("unflushed")


if __name__ == "__main__":
    main(*sys.argv[1:])
