"""Probe: which part of the loader's metrics costs what, on the fastest scan (the worst case).

Backs the per-batch design in ``lance_lightning/metrics/``: one `LanceDataLoader` over the
1M-row vector table (NoShuffle, B=256, the default threads) reads whole epochs in four settings,
interleaved epoch by epoch (the order reversed every other round): everything on, everything off
(what ``metrics=False`` sets), only the training thread's meter, and only the reader threads'
clock (stage times, I/O statistics, batch sizes). Prints each setting's median rows/s (and its
ratio to the median of "off"), and the median and mean of its per-epoch ratio to the "off"
epoch of the same round. First it times the training thread's per-batch work alone: a loop of
1,000,000 `LoaderMeter.delivered` calls with the clock reads the loader makes. Many short
alternations resolve differences of about 1% on this noisy machine, which the benchmark's ~0.5 s
repetitions cannot; not part of ``python -m benchmarks all`` (the ``metrics`` study has the targets).

Usage (from the repository root, under the machine's benchmark lock)::

    python benchmarks/probes/probe_metrics.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks, lance_lightning

from benchmarks import common
from benchmarks.harness.timing import iterate
from benchmarks.studies.metrics import warm_loader

#: Setting name -> (training thread's meter on, reader threads' clock on).
SETTINGS = {"on": (True, True), "off": (False, False), "meter only": (True, False), "clock only": (False, True)}


def meter_us_per_batch(calls: int = 1_000_000) -> float:
    """Microseconds per batch of the meter's work on the training thread, less an empty loop's."""
    from lance_lightning.metrics.meter import LoaderMeter

    def loop(measure: bool) -> float:
        meter, now = LoaderMeter(), time.perf_counter
        delivered = meter.delivered
        started = asked = now()
        meter.start_iteration(asked)
        for _ in range(calls):
            if measure:
                delivered(asked, now())
                asked = now()
        return time.perf_counter() - started

    return 1e6 * (min(loop(True) for _ in range(3)) - min(loop(False) for _ in range(3))) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="epochs per setting (default 200, ~5 min)")
    parser.add_argument("--cache-dir", default=str(common.DEFAULT_CACHE), help="where the datasets are kept")
    args = parser.parse_args(argv)
    print(common.steady_allocator())
    print(f"meter alone: {meter_us_per_batch():.2f} us per batch (best of 3 loops of 1,000,000)")
    uri = common.vec_dataset(Path(args.cache_dir), 1_000_000)
    loader = warm_loader(uri, ["id", "label", "vec"])
    dataset, meter, read_epoch = loader.dataset, loader.meter, iterate(loader)

    def rate(setting: str) -> float:
        meter_on, clock_on = SETTINGS[setting]
        loader.meter, dataset.clock.enabled = (meter if meter_on else None), clock_on
        started = time.perf_counter()
        rows = read_epoch()
        return rows / (time.perf_counter() - started)

    names = list(SETTINGS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rates[name].append(rate(name))
    print(f"{common.command_line()}: {args.rounds} epochs per setting, {common.machine()}")
    for name in names:
        ratios = [r / off for r, off in zip(rates[name], rates["off"])]
        median = statistics.median(rates[name])
        print(
            f"  {name:<11} {median:>12,.0f} rows/s ({median / statistics.median(rates['off']):.4f} of off)   "
            f"per-epoch ratio to off: median {statistics.median(ratios):.4f}, mean {statistics.fmean(ratios):.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
