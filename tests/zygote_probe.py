"""What tests/unit/test_zygote.py asks of a process, as a script or ``-m tests.zygote_probe``:
``state`` prints (JSON) what a fresh interpreter sets up (argv, path head, cwd, a variable, signal
dispositions and mask, ``__main__``, session, parent pid); ``raise``, ``interrupt``, ``exit CODE``,
``exit-text``, ``kill`` end the process each way an interpreter can end; ``atexit`` prints at exit."""

import atexit
import json
import os
import signal
import sys


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
    elif what == "atexit":
        atexit.register(print, "atexit ran")
        sys.stdout.write("unflushed")


if __name__ == "__main__":
    main(*sys.argv[1:])
