"""The data loading report: what limits throughput, with the numbers and the first thing to change.

Guarantees:
- `diagnose` names exactly one bottleneck from a span's figures (`lance_lightning.metrics.figures.FIGURES`):
  ``none`` when fewer than 2 batches were measured; ``model`` when the step waited for data less
  than `MODEL_BOUND_BELOW` of its cycle; otherwise the largest share of loader time among
  ``storage`` (I/O wait), ``decode`` (decode/transform), ``convert`` (Arrow to tensors), ``other``
  (other measured stages, e.g. pinning memory) and ``workers`` (waiting that no stage explains:
  moving batches out of worker processes, or without workers the hand-off between the reader
  threads and the step). A loader-only profile has no model, so it never names ``model``.
- Loader time is wall-equivalent: a stage's thread-seconds divided by the threads that run it
  (``reader_threads`` x processes), so the shares compare with the step's wait.
- A loader with ``num_workers`` whose workers never started (``workers_started`` false in its
  config: the race kept every batch in the training process, `lance_lightning.load.race`) is
  reported as reading in one process, with all the workers' reader threads: no worker transfer,
  read-ahead per worker or worker output, and no advice about worker processes it never ran.
- Under DDP the report shows the mean over ranks with the range, and diagnoses the rank that
  waited most (in DDP every rank ends up waiting for the slowest).
- Given a replay probe's figures (`lance_lightning.metrics.figures.REPLAY_FIGURES`), `format_report`
  adds the compute floor: the step with data for free beside the real step cycle, the cycle split
  into compute, the rest of the step and the wait (by loader part), and the speed-ups.
- `format_report` is plain text; nothing here reads clocks, loggers or the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lance_lightning.metrics.figures import figures
from lance_lightning.metrics.meter import Snapshot

#: Below this share of the step cycle spent waiting for data, the model is the bottleneck.
MODEL_BOUND_BELOW = 0.05
#: The first batch counts as a start-up cost worth a note above this share of the loop time.
STARTUP_NOTE_ABOVE = 0.2
#: A row shuffle reading clumps shorter than this is dominated by per-row take requests.
SHORT_CLUMP = 64

PARTS = {
    "storage": ("io_wait_s", "waiting on storage (I/O)"),
    "decode": ("decode_s", "in decode/transform"),
    "convert": ("convert_s", "converting Arrow to tensors"),
    "other": ("other_s", "in other measured stages (e.g. pinning memory)"),
}


@dataclass(frozen=True)
class Diagnosis:
    """The bottleneck, a one-line verdict with its numbers, and the first thing to change."""

    bottleneck: str  # "model" | "storage" | "decode" | "convert" | "workers" | "other" | "none"
    headline: str
    advice: str
    shares: dict[str, float] = field(default_factory=dict)  # loader part -> share of loader time
    seconds: dict[str, float] = field(default_factory=dict)  # loader part -> wall-equivalent seconds
    rank: int = 0


def worker_processes(config: Mapping[str, Any]) -> int:
    """The worker processes that read: ``num_workers``, or 0 where they never started."""
    workers = int(config.get("num_workers", 0) or 0)
    return workers if config.get("workers_started", True) else 0


def parallelism(config: Mapping[str, Any]) -> int:
    """Threads running the loader stages: reader threads (at least the iterating one) x processes."""
    return max(int(config.get("num_workers", 0)), 1) * max(int(config.get("reader_threads", 1)), 1)


def loader_seconds(fig: Mapping[str, float], config: Mapping[str, Any]) -> dict[str, float]:
    """Wall-equivalent seconds per loader part, ``workers`` being the wait no stage explains."""
    threads = parallelism(config)
    parts = {name: fig[key] / threads for name, (key, _) in PARTS.items()}
    busy = sum(parts.values())
    # While the step runs, busy stages overlap it; only stage time beyond the step can cause a wait.
    parts["workers"] = max(0.0, fig["wait_s"] - max(0.0, busy - fig["step_s"]))
    return parts


def diagnose(
    fig: Mapping[str, float], config: Mapping[str, Any], *, loader_only: bool = False, rank: int = 0
) -> Diagnosis:
    """What limits throughput in the span ``fig`` (one rank's figures) of a loader with ``config``."""
    seconds = loader_seconds(fig, config)
    total = sum(seconds.values())
    shares = {name: value / total if total > 0 else 0.0 for name, value in seconds.items()}
    wait = fig["wait_fraction"]
    if fig["batches"] < 2:
        return Diagnosis("none", "not enough batches measured to tell", "run more steps", shares, seconds, rank)
    if not loader_only and wait < MODEL_BOUND_BELOW:
        busy = total / fig["seconds"] if fig["seconds"] > 0 else 0.0
        headline = (
            f"model-bound: the step waited for data {wait:.0%} of the time; the loader keeps up "
            f"(busy {min(busy, 1.0):.0%} of the time)"
        )
        advice = "speed up the training step (model, precision, batch size); loader settings will not raise throughput"
        if busy < 0.25 and parallelism(config) > 1:
            advice += (
                f"; the loader idles, so fewer `reader_threads` ({config.get('reader_threads')} now) or "
                f"`num_workers` ({config.get('num_workers')} now) would free CPU for the step"
            )
        return Diagnosis("model", headline, advice, shares, seconds, rank)
    name = max(shares, key=shares.__getitem__)
    if name == "workers" and not worker_processes(config):
        what = "outside the measured stages (hand-off between reader threads and the step)"
    elif name == "workers":
        what = "moving batches from worker processes (not reading, decoding or converting)"
    else:
        what = PARTS[name][1]
        if name == "decode" and config.get("transform"):
            what += f" ({config['transform']})"
    waited = (
        "no model: the profile consumes batches as fast as they come"
        if loader_only
        else f"the step waited for data {wait:.0%} of the time"
    )
    headline = f"{name}-bound: {shares[name]:.0%} of loader time {what}; {waited}"
    advice = _advice(name, config)
    if name == "storage" and fig["throttles"]:
        advice = (
            f"the store throttled {fig['throttles']:,.0f} read(s) and retries waited {fig['retry_wait_s']:.1f} s: "
            "more reader threads would be throttled too; ask the store for a higher request rate, spread the "
            "data over more key prefixes, or read fewer, larger ranges (ShardShuffle/BufferShuffle, a larger "
            "`clump_rows`)"
        )
    return Diagnosis(name, headline, advice, shares, seconds, rank)


def _advice(name: str, config: Mapping[str, Any]) -> str:
    threads, workers = config.get("reader_threads"), config.get("num_workers", 0)
    groups, processes = config.get("prefetch_groups"), worker_processes(config)
    if name == "storage":
        shuffle = config.get("shuffle") or {}
        clump = shuffle.get("clump_rows")
        if config.get("method") == "take" and clump is not None and clump < SHORT_CLUMP:  # short clumps taken
            return (
                f"reads are random row takes (RowShuffle clump_rows={clump}): set `shuffle.clump_rows` to "
                f"{SHORT_CLUMP} or more, or use ShardShuffle/BufferShuffle, so Lance reads ranges"
            )
        return (
            f"raise `reader_threads` ({threads} now) and `prefetch_groups` ({groups} now) to keep more reads "
            "in flight; on object stores also raise LANCE_IO_THREADS"
        )
    if name == "decode":
        if not workers:
            return (
                f"raise `reader_threads` ({threads} now; decoding runs on them); if the transform is pure "
                "Python (holds the GIL), use `num_workers` processes instead"
            )
        if not processes:
            return (
                f"raise `reader_threads` ({threads} per worker now; the training process read with every "
                "worker's threads, and decoding runs on them)"
            )
        return f"raise `num_workers` ({workers} now) or `reader_threads` ({threads} per worker now)"
    if name == "convert":
        return (
            f"read fewer columns (`columns`), or raise `reader_threads` ({threads} now); columns with nulls, "
            "bools or several chunks are copied"
        )
    if name == "workers" and processes:
        return (
            f"use `num_workers=0` with `reader_threads` (Lance reads and torchvision decoding release the "
            f"GIL, so threads skip the copy between processes), or fewer, larger batches "
            f"({workers} worker process(es) now)"
        )
    if name == "workers":
        return f"raise `prefetch_groups` ({groups} now) so more batches are ready ahead"
    return "pinning memory on the reader threads: raise `reader_threads`, or pin on the GPU side (`pin_memory=False`)"


def format_report(
    per_rank: Sequence[Mapping[str, float]],
    config: Mapping[str, Any],
    *,
    loader_only: bool = False,
    title: str = "Data loading report",
    replay: Mapping[str, float] | None = None,
) -> str:
    """The console report of one span: ``per_rank[r]`` holds rank r's figures (one entry without DDP);
    ``replay``: the compute-floor figures of the diagnosed rank, if a replay probe ran."""
    ranks = len(per_rank)
    per_rank = [{**f, "step_ms": 1e3 * f["step_s"] / f["batches"] if f["batches"] else 0.0} for f in per_rank]
    mean = {k: sum(f[k] for f in per_rank) / ranks for k in per_rank[0]}
    worst = 0 if loader_only else max(range(ranks), key=lambda r: per_rank[r]["wait_fraction"])
    diagnosis = diagnose(per_rank[worst], config, loader_only=loader_only, rank=worst)

    def show(key: str, fmt: str, scale: float = 1.0) -> str:
        text = format(mean[key] * scale, fmt)
        if ranks > 1:
            low, high = (min(f[key] for f in per_rank) * scale, max(f[key] for f in per_rank) * scale)
            text += f" [{format(low, fmt)} .. {format(high, fmt)}]"
        return text

    workers, threads = worker_processes(config), config.get("reader_threads")
    if config.get("num_workers") and not workers:  # one process read, with every worker's reader threads
        threads = max(int(threads or 1), 1) * int(config["num_workers"])
    if ranks > 1:
        title += f" ({ranks} ranks, mean [min .. max])"
    elif config.get("world_size", 1) > 1:
        title += f" (rank {config.get('rank', 0)})"
    lines = [
        f"{title}: {show('batches', ',.0f')} batches, {show('rows', ',.0f')} rows in {show('seconds', '.2f')} s",
        f"  {diagnosis.headline}" + (f" (rank {diagnosis.rank})" if ranks > 1 else ""),
        f"  first thing to change: {diagnosis.advice}",
        "",
    ]
    if loader_only:
        per_batch = mean["seconds"] / mean["batches"] if mean["batches"] else 0.0
        lines.append(
            f"  loader ceiling           a batch every {per_batch * 1e3:.2f} ms: a training step slower "
            "than this would not wait for data"
        )
    else:
        lines.append(f"  step waited for data     {show('wait_fraction', '.1%')} of the step cycle")
        lines.append(f"  training step            {show('step_ms', '.2f')} ms per batch")
    lines += [
        f"  wait per batch           p50 {show('fetch_p50_ms', '.2f')} ms, p99 {show('fetch_p99_ms', '.2f')} ms",
        f"  first batch              {show('first_batch_s', '.3f')} s",
        f"  delivered                {show('rows_per_s', ',.0f')} rows/s, {show('bytes_per_s', ',.2f', 1e-6)} MB/s",
        f"  loader time (wall-equivalent: stage thread-seconds / {parallelism(config)} threads = "
        f"{threads} reader thread(s) x {max(workers, 1)} process(es)):",
    ]
    labels = {
        "storage": "storage (I/O wait)",
        "decode": "decode/transform",
        "convert": "convert to tensors",
        "other": "other (pin memory)",
        "workers": "workers (transfer)" if workers else "hand-off (unmeasured)",
    }
    for name in ("storage", "decode", "convert", "other", "workers"):
        if name == "other" and diagnosis.seconds.get(name, 0.0) == 0.0:
            continue
        line = f"    {labels[name]:<22} {diagnosis.seconds[name]:8.3f} s {diagnosis.shares[name]:6.1%}"
        if name == "storage":
            line += (
                f"   {show('io_bytes', ',.2f', 1e-6)} MB read in {show('io_requests', ',.0f')} requests "
                f"({show('io_amplification', ',.1f')}x the rows' bytes, {show('io_ms_per_request', ',.1f')} ms "
                f"per request), {show('io_mb_per_s', ',.1f')} MB/s per reader thread"
            )
        lines.append(line)
    unit = "batches" if config.get("transform") else "read groups"
    lines.append(
        f"  read-ahead               {show('prefetch_ready', '.2f')} of {show('prefetch_slots', '.0f')} "
        f"{unit} ready when asked" + (" (per worker)" if workers else "")
    )
    if mean["bad_rows"]:
        lines.append(f"  bad rows replaced        {show('bad_rows', ',.0f')}")
    if mean["retries"]:
        lines.append(
            f"  storage retries          {show('retries', ',.0f')} ({show('throttles', ',.0f')} throttled "
            f"by the store), {show('retry_wait_s', ',.2f')} s waiting between them"
        )
    if config.get("workers_choice"):
        whose = f"rank {config.get('rank', 0)} (each rank decides for itself): " if ranks > 1 else ""
        lines.append(f"  {whose}{config['workers_choice']}")
    if config.get("worker_server"):
        lines.append(f"  their fork server        {config['worker_server']}")
    if workers:
        lines.append(
            f"  worker output            {show('workers_ready', '.2f')} finished batches not yet received when asked"
        )
    startup = mean["first_batch_s"] * mean["epochs"]
    if mean["seconds"] > 0 and startup / mean["seconds"] > STARTUP_NOTE_ABOVE:
        why = (
            "worker processes start and the first reads run; keep `persistent_workers=True`"
            if workers
            else "the first reads run"
        )
        lines.append(
            f"  note: start-up (the first batch of each of {mean['epochs']:.0f} epoch(s), "
            f"{mean['first_batch_s']:.2f} s each) is {startup / mean['seconds']:.0%} of the loop time: "
            f"{why}; measure longer runs for steady-state figures"
        )
    if replay is not None:
        lines += _floor_lines(replay, labels)
    if ranks > 1:
        slow = max(range(ranks), key=lambda r: per_rank[r]["wait_fraction"])
        fast = min(range(ranks), key=lambda r: per_rank[r]["rows_per_s"])
        lines.append(
            f"  stragglers               rank {slow} waited most for data "
            f"({per_rank[slow]['wait_fraction']:.1%}); rank {fast} delivered fewest rows/s "
            f"({per_rank[fast]['rows_per_s']:,.0f})"
        )
    return "\n".join(lines)


def _floor_lines(replay: Mapping[str, float], labels: Mapping[str, str]) -> list[str]:
    """The compute floor's lines: the floor, the real cycle split up, the wait by part, the speed-up."""
    r = replay
    parts = ", ".join(
        f"{labels[name].split(' (')[0]} {r[f'wait_share/{name}']:.1%}"
        for name in ("storage", "decode", "convert", "other", "workers")
        if name != "other" or r["wait_share/other"]
    )
    rows, fit_rows = r["rows_per_step"], r["rows_per_batch"]
    scaled = f" (scaled from {r['replayed_step_s'] * 1e3:.2f} ms on {rows:,.1f} rows to the fit's {fit_rows:,.1f})"
    scaled = scaled if abs(rows - fit_rows) > 0.005 * fit_rows else ""
    speedup = (
        f"at most {r['speedup']:.2f}x with data for free (cycle / floor); "
        f"{r['speedup_without_wait']:.2f}x from removing the wait alone"
        if r["speedup"] > 1
        else f"none measurable: the replayed step was not faster than the real one ({r['speedup']:.2f}x): "
        "the run is at its compute floor"
    )
    return [
        f"  compute floor (replay)   {r['step_s'] * 1e3:.2f} ms per step{scaled}"
        f": {r['steps']:.0f} steps on {r['batches']:.0f} cached batch(es), data for free (training step, backward, "
        f"optimizer step; {r['intraop_threads']:.0f} torch intra-op thread(s))",
        f"  real step cycle          {r['real_step_s'] * 1e3:.2f} ms per batch: compute {r['compute_share']:.1%}, "
        f"rest of the step {r['rest_share']:.1%} (loop, logging, validation, checkpoints, CPU taken by the "
        f"loader), wait for data {r['wait_share']:.1%}",
        f"  wait for data by part    {parts} of the cycle",
        f"  speed-up from the data   {speedup}",
    ]


def loader_report(
    loader: Any, since: Snapshot | None = None, *, loader_only: bool = False, title: str = "Data loading report"
) -> str:
    """The report of one `LanceDataLoader` in this process, from ``since`` (default: its creation)."""
    fig = figures(loader.metrics_snapshot().minus(since))
    return format_report([fig], loader.describe(), loader_only=loader_only, title=title)
