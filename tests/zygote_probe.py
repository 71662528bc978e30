"""What tests/unit/test_zygote.py asks of a process, as a script or ``-m tests.zygote_probe``:
``state`` prints (JSON) what a fresh interpreter sets up (argv, path head, cwd, a variable, signal
dispositions and mask, ``__main__``, session, parent pid); ``raise``, ``interrupt``, ``exit CODE``,
``exit-text``, ``kill``, ``term`` (SIGTERM), ``segv`` (a crash) end the process each way an interpreter
can end; ``atexit`` prints at exit; ``interleave`` writes to stdout and stderr in turn; ``group``
starts a grandchild in its process group that sleeps (``hold``: holding stdout; else with its
output closed), prints its pid and exits (``hang``: sleeps too). For the DDP rank's spare
(`tests.zygote_spare`): ``ddp OUT`` runs a 2-rank ``strategy="ddp"`` fit, each rank writing
``OUT/rankR.json``; ``launch`` starts ``early`` three times through the launcher's ``Popen``;
``spare`` prints where the spare's stdio points."""

import atexit
import faulthandler
import json
import os
import signal
import sys
import time

#: Whether Lightning was imported before this probe ran (the zygote's children and spares: yes).
EARLY = "lightning.pytorch" in sys.modules


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
    elif what == "ddp":
        _ddp(rest[0])
    elif what == "early":
        print(json.dumps({"early": EARLY, "pid": os.getpid(), "ppid": os.getppid()}), flush=True)
    elif what == "launch":
        _launch()
    elif what == "spare":
        _spare()
    elif what == "atexit":
        atexit.register(print, "atexit ran")
        sys.stdout.write("unflushed")


def _ddp(out: str) -> None:
    """A one-step fit on 2 CPU ranks; each rank writes its `state`, pid, whether Lightning came
    imported, the rank ``rank_zero_only`` (Lightning's, torchmetrics') took at import; rank 0 also
    its handle on rank 1 once that ended (pid, exit status)."""
    early = EARLY
    import lightning.pytorch as pl
    import torch
    import torchmetrics.utilities.prints
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from lance_lightning.lifetime import destroy_gloo_group_at_exit

    at_import = [rank_zero_only.rank, torchmetrics.utilities.prints.rank_zero_only.rank]

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def setup(self, stage: str) -> None:
            # What the data module does for every fit: a gloo group left to the interpreter's
            # finalization ends a finished rank with SIGABRT now and then (pytorch/pytorch#190489).
            destroy_gloo_group_at_exit()

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rows = torch.utils.data.TensorDataset(torch.arange(16, dtype=torch.float32).reshape(8, 2))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Model(), torch.utils.data.DataLoader(rows, batch_size=2))
    record = {"state": state(), "pid": os.getpid(), "early": early, "rank_at_import": at_import}
    if trainer.global_rank == 0:
        (handle,) = trainer.strategy.launcher.procs
        record["rank1"] = {"pid": handle.pid, "status": handle.wait(timeout=120)}
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as file:
        json.dump(record, file)


def _launch() -> None:
    """``early`` through the DDP launcher's ``Popen`` three times, as it starts a rank: with a
    variable read at import changed, then with only the launcher's own variables, then again."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    command = [sys.executable, os.path.abspath(__file__), "early"]
    for changed in ({"OMP_NUM_THREADS": "7"}, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, {"LOCAL_RANK": "1"}):
        child = subprocess_script.subprocess.Popen(command, env={**os.environ, **changed})
        assert child.wait() == 0


def _spare() -> None:
    """The spare's pid, its stdin, stdout and stderr, and whether it shares this session and group."""
    spare = sys.modules.get("tests.zygote_spare")
    pid = spare.SparePopen.spare.pid if spare and spare.SparePopen.spare else None
    if pid is None:
        print(json.dumps(None))
        return
    print(json.dumps({
        "fds": [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)],
        "session": os.getsid(pid) == os.getsid(0),
        "group": os.getpgid(pid) == os.getpgid(0),
    }))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
