"""Who reads a loader's batches, its workers or the training process: decided by a measured race.

Guarantees:
- With ``num_workers > 0`` a `LanceDataLoader` reads in the training process while its workers
  start (`lance_lightning.load.handoff`), measuring the rows per second the training loop receives
  (`Rates.in_process`: all its batches' rows over their seconds, once `WINDOW_BATCHES` are
  measured; the first batch of each iteration is left out: it carries the start). Once the
  workers run it takes their batches for a trial (`Race.trial_items` messages, each worker's
  first message left out: it carries the worker's start) and measures their delivered rate the
  same way (`Rates.workers`): rows over the seconds of the training loop's whole cycle.
- The workers are started at all only where they can pay (`Race.may_start_workers`): what they add
  over this process's reader threads is running, in parallel, Python code that holds the GIL. So
  while it reads, the CPU time of a transform that may hold it (`may_hold_gil`: any callable but
  the package's transforms that declare ``releases_gil``) is measured on the reader threads, and
  the CPU time of the loop's own thread (its step) on that thread (`Rates.gil_share`: the
  transform's CPU seconds a call over those plus the loop's a batch, its share of the work the GIL
  serializes), and the workers are started only when `amdahl_gain` of that share over the workers'
  cores reaches `START_GAIN` (the fork server is started ahead, at ``setup``, only where such a
  transform is configured: `lance_lightning.load.handoff.start_server_early`). A read without such
  a transform (a scan, a filter, a shuffle, a JPEG decode) never starts a process: its imports
  would take a core from a read that uses them all. CPU time on both sides, so a call's waits (for
  the GIL, a sleep, I/O), which load stretches, are not the transform's. Timed by wall time, as
  before, a transform adding one tensor a batch read 1%-11% of the loop on an idle machine and
  1%-17% beside two busy loops, since each call counted its wait to take the GIL back after a
  torch op released it, and under load it opened the gate (a CI failure); in CPU time it reads
  2%-4% either way. Load still moves a heavy transform's share (a 600-step Python loop a row: 75%
  idle, 61% beside two busy loops; benchmarks/results/gil_share.md, gil_share_busy.md). A loop
  that mostly waits for I/O makes the share overstate what workers gain: their trial measures it.
  `START_GAIN` is low on purpose: Amdahl's bound leaves out that workers also run the rest of the
  read in parallel, so it understates what they deliver (a 60-step Python loop a row measured a
  wall share of 66%, a bound of 1.49x that kept a gate at 1.5x shut, while the worker path read it
  1.4x-2.7x as fast as ``num_workers=0`` in epochs 2-8 of the same run:
  benchmarks/results/worker_gate_gil_busy_gate150.md); the gate only keeps the workers from reads
  they cannot speed up, and the trial decides. A gate opened for workers that then lose costs
  their trial (`Race.trial_items` messages) and retrials that back off; the fork server's imports
  are not the gate's to spend: they start at ``setup`` wherever such a transform is configured.
- `choose` is the decision, a pure function of the two rates: the workers only when they deliver at
  least `MARGIN` times the in-process rate; ``in_process`` otherwise (the copies between processes
  and the idle memory of workers are then not worth it). Either way every batch is read once, in
  the plan's order: the loader switches at a batch boundary and the other side begins at the next
  batch, as a restore from a cursor there would (`lance_lightning.cursor.tracker`).
- The choice is kept for the loader's later epochs and re-checked cheaply at each epoch boundary
  while it reads in process (`Race.decide` with the rates measured so far, the in-process one
  growing with every epoch read here): once it names the workers they start again. Workers that
  lost a trial while the GIL share says they could gain `START_GAIN` are tried again
  (`Race.retrial_due`), after `RETRY_EPOCHS` epochs read in process, then twice as many after each
  further loss: one trial measures a few batches of workers just started, on a machine that may be
  busy at that moment (a loaded run measured 7,126 rows/s from workers that read 18,781 once running:
  benchmarks/results/worker_gate_gil.md, its command in benchmarks/results/INDEX.md), so
  a single loss does not settle a loader's every later epoch; the doubling bounds what trials that
  keep losing cost (at most one per doubling of the epochs read). A worker
  that cannot start is raised when the loader starts its workers: at the hand-over, or at the
  latest in the next epoch, never dropped; an epoch this process finishes before the fork server
  is ready does not wait for it.
- ``LANCE_LIGHTNING_WORKER_CHOICE`` (`CHOICE_SWITCH`) forces the outcome of every trial:
  ``workers`` or ``in_process``; ``race`` (the default) measures. Everything else runs as in a
  race (the workers start, the trial runs), so a forced outcome takes the same path as a measured
  one: the knob the tests use to check both paths' rows and order without timing margins. Forced
  to ``workers``, the loader waits for them once an epoch's first batch is yielded
  (`lance_lightning.load.handoff`).
- `Race.describe` states what it will do (``explain()``) and what it did, with both rates (the
  end-of-fit report). Nothing here reads a clock: the loader passes the seconds it measured, so the
  decision is tested with any rates (tests/unit/load/test_race.py).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

#: The workers must deliver at least this multiple of the in-process rate to take over.
MARGIN = 1.15
#: Workers start only where parallel transforms could make the read this many times faster
#: (Amdahl's bound over the GIL share: a share of 40% with 2 workers on 2 cores).
START_GAIN = 1.25
#: Epochs read in process after a lost trial before the workers are tried again (doubled after each loss).
RETRY_EPOCHS = 1
#: In-process batches per measured window.
WINDOW_BATCHES = 16
#: Forces the race's outcome: ``race`` (default), ``workers`` or ``in_process``.
CHOICE_SWITCH = "LANCE_LIGHTNING_WORKER_CHOICE"
CHOICES = ("race", "workers", "in_process")


def forced_choice() -> str:
    """``race``, ``workers`` or ``in_process`` from `CHOICE_SWITCH` (an unknown value is ``race``)."""
    value = os.environ.get(CHOICE_SWITCH, "race").strip().lower().replace("-", "_")
    return value if value in CHOICES else "race"


def may_hold_gil(transform: Any) -> bool:
    """Whether ``transform`` may run Python that holds the GIL: any callable but one that declares
    ``releases_gil`` (the package's decoders and batched tensor transforms; `Compose` when all its
    transforms do)."""
    return transform is not None and not getattr(transform, "releases_gil", False)


def amdahl_gain(share: float, cores: int) -> float:
    """The most a read gains when ``share`` of its time runs on ``cores`` in parallel."""
    return 1.0 / ((1.0 - share) + share / max(cores, 1))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def choose(in_process: float | None, workers: float | None, margin: float = MARGIN) -> str | None:
    """``workers``, ``in_process``, or None while the workers' rate is unknown (rows per second)."""
    if workers is None:
        return None
    if in_process is None or in_process <= 0:
        return "workers"  # nothing measured in process: the configured workers
    return "workers" if workers >= margin * in_process else "in_process"


@dataclass
class Rates:
    """Measured rows per second of each side (None until measured)."""

    in_process: float | None = None
    workers: float | None = None
    #: Everything measured in process: batches, rows, seconds, and the CPU seconds of the loop's thread.
    window: list[float] = field(default_factory=lambda: [0, 0, 0.0, 0.0])
    #: CPU seconds in a transform that may hold the GIL, summed over its calls on the reader threads.
    gil_seconds: float = 0.0
    #: The calls those seconds were measured over (one a batch).
    gil_calls: int = 0
    #: The workers' trial: messages left out, messages, rows and seconds measured.
    trial: list[float] = field(default_factory=lambda: [0, 0, 0, 0.0])
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_in_process(self, batches: int, rows: int, seconds: float, loop_cpu_seconds: float) -> None:
        """Add to the in-process total (``loop_cpu_seconds``: what the loop's thread ran in those
        ``seconds``); its rate counts once `WINDOW_BATCHES` batches are measured."""
        window = self.window
        window[0] += batches
        window[1] += rows
        window[2] += seconds
        window[3] += loop_cpu_seconds
        if window[0] >= WINDOW_BATCHES:
            self.in_process = window[1] / window[2] if window[2] > 0 else float("inf")

    def add_gil_seconds(self, seconds: float) -> None:
        """Add a call's CPU seconds in a transform that may hold the GIL (from any reader thread)."""
        with self._lock:
            self.gil_seconds += seconds
            self.gil_calls += 1

    def gil_share(self) -> float | None:
        """The transform's share of the CPU time the GIL serializes in a batch's cycle: its CPU
        seconds a call over those plus the loop thread's CPU seconds a batch (None until the
        in-process window is measured). CPU time on both sides, so a call's waits (the GIL held
        elsewhere, a sleep, I/O), which load stretches, do not count; per batch on both sides, so
        calls on batches read ahead of the loop weigh as much as those the window measured."""
        if self.in_process is None:
            return None
        transform = self.gil_seconds / self.gil_calls if self.gil_calls else 0.0
        loop = self.window[3] / self.window[0]
        return transform / (transform + loop) if transform + loop > 0 else 0.0


class Race:
    """The decision of one loader with ``num_workers`` workers (see the module docstring)."""

    def __init__(
        self, num_workers: int, prefetch_factor: int | None, forced: str | None = None, cores: int | None = None
    ) -> None:
        self.num_workers = num_workers
        self.forced = forced if forced is not None else forced_choice()
        #: The cores this process may run on.
        self.cores = cores if cores is not None else usable_cores()
        self.rates = Rates()
        self.choice: str | None = None
        #: Worker messages measured before deciding (each worker's first one is left out).
        self.trial_items = max(4, 2 * num_workers * (prefetch_factor or 2))
        self.switches = 0
        #: Trials run again after a loss, and the in-process epochs to read before the next one.
        self.retrials = 0
        self._retry_after = RETRY_EPOCHS
        self._epochs_since_loss = 0

    @property
    def racing(self) -> bool:
        return self.forced == "race"

    def in_process(self, batches: int, rows: int, seconds: float, loop_cpu_seconds: float) -> None:
        """Record ``batches`` of ``rows`` rows read in this process in ``seconds`` (the loop's cycle),
        the loop's thread running ``loop_cpu_seconds`` of them."""
        self.rates.add_in_process(batches, rows, seconds, loop_cpu_seconds)

    def gain_bound(self) -> float | None:
        """The most the workers could gain (`amdahl_gain` of the GIL share over their cores)."""
        share = self.rates.gil_share()
        return None if share is None else amdahl_gain(share, min(self.num_workers, self.cores))

    def may_start_workers(self) -> bool:
        """Whether the loader may start its workers now: a forced outcome at once (its path is a
        race's), a race once the measured GIL share lets them gain `START_GAIN`."""
        if not self.racing:
            return True
        bound = self.gain_bound()
        return bound is not None and bound >= START_GAIN

    def worker_item(self, rows: int, seconds: float) -> str | None:
        """Record a message of ``rows`` rows from the workers that took ``seconds``; the choice once
        the trial is complete, None while it runs."""
        trial = self.rates.trial
        if trial[0] < self.num_workers:
            trial[0] += 1  # a worker's first message: its start
            return None
        trial[1] += 1
        trial[2] += rows
        trial[3] += seconds
        if trial[1] < self.trial_items:
            return None
        self.rates.workers = trial[2] / trial[3] if trial[3] > 0 else float("inf")
        self.rates.trial = [0, 0, 0, 0.0]
        return self.decide()

    def new_workers(self) -> None:
        """Workers (re)started: their first messages carry their start again (what the trial measured
        so far is kept)."""
        self.rates.trial[0] = 0

    def decide(self) -> str | None:
        """The choice from the rates measured so far (`choose`, or the forced outcome), once the
        workers' rate is known; until then the choice stays as it is."""
        if self.rates.workers is None:
            return self.choice
        chosen = choose(self.rates.in_process, self.rates.workers) if self.racing else self.forced
        self.switches += int(self.choice is not None and chosen != self.choice)
        self.choice = chosen
        return chosen

    def epoch_read_in_process(self) -> None:
        """A whole epoch is read in process after the workers lost a trial (the rest of the epoch
        of the lost trial does not count)."""
        if self.choice == "in_process":
            self._epochs_since_loss += 1

    def retrial_due(self) -> bool:
        """Whether the workers, having lost their trial, are to be tried again before this epoch
        (racing, with a GIL share that lets them gain `START_GAIN`, after the epochs the backoff asks)."""
        return (
            self.racing
            and self.choice == "in_process"
            and self._epochs_since_loss >= self._retry_after
            and self.may_start_workers()
        )

    def retry(self) -> None:
        """Try the workers again: undecided until their new trial; the next wait is twice as long."""
        self.choice = None
        self.rates.workers = None
        self.retrials += 1
        self._retry_after *= 2
        self._epochs_since_loss = 0

    def describe(self, done: bool = False) -> str:
        """What the loader will do (``done``: what it did), with the rates measured."""
        if self.forced != "race":
            how = f"forced by {CHOICE_SWITCH}={self.forced}"
        else:
            how = (
                f"started only where running the transform in parallel could read {START_GAIN:g}x faster, then "
                f"chosen by a measured race (workers take over at {MARGIN:g}x the in-process rows/s)"
            )
        rates = self.rates
        shown = ", ".join(
            f"{name} {rate:,.0f} rows/s" if rate is not None else f"{name} not measured"
            for name, rate in (("in process", rates.in_process), ("workers", rates.workers))
        )
        if not done:
            return f"workers: {self.num_workers}, {how}; the rows and their order are the same either way"
        outcome = {"workers": "the workers read", "in_process": "the training process read", None: "undecided"}
        bound, share = self.gain_bound(), rates.gil_share()
        if self.choice is None and rates.workers is None and bound is not None and not self.may_start_workers():
            return (
                f"workers: {self.num_workers}, {how}: the training process read, the workers never started "
                f"(a transform that may hold the GIL took {share:.0%} of the loop's CPU time: workers could read "
                f"at most {bound:.2f}x faster) ({shown})"
            )
        again = f"; the workers' trial run {self.retrials + 1} times" if self.retrials else ""
        return f"workers: {self.num_workers}, {how}: {outcome[self.choice]} ({shown}{again})"
