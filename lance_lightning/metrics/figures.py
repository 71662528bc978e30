"""Figures: a span of loader totals turned into named numbers, and the sizes of a batch.

Guarantees: `figures(later.minus(earlier))` turns two cumulative `Snapshot`s into named, always
finite figures (`FIGURES`); the same names are logged by `DataLoadingMonitor` and read by the
report. `REPLAY_FIGURES` names the compute-floor figures of a replay probe, logged as
``data/replay/<figure>``. `batch_size_and_bytes` and `row_bytes` measure a batch's rows and payload bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lance_lightning.metrics.meter import LatencyHistogram, Snapshot


def batch_size_and_bytes(batch: Any) -> tuple[int, int]:
    """Rows and payload bytes of a batch: tensors, lists of bytes/str, tensor-like pairs."""
    from torch import Tensor as _Tensor  # imported by whoever made the batch (materialize never does)

    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else (batch,)
    rows = nbytes = 0
    for value in values:
        if isinstance(value, _Tensor):
            nbytes += value.nbytes
            if not rows and value.ndim:
                rows = value.shape[0]
        elif isinstance(value, list):
            rows = rows or len(value)
            try:
                nbytes += sum(map(len, value))
            except TypeError:
                pass
        elif isinstance(getattr(value, "values", None), _Tensor):  # e.g. a Ragged column
            nbytes += value.values.nbytes + getattr(value, "offsets", value.values).nbytes
            rows = rows or len(value)
    return rows, nbytes


def row_bytes(batch: Mapping[str, Any]) -> int | None:
    """Payload bytes per row of ``batch`` when every value is a tensor with one row per first-dim
    entry (then any batch converted from the same columns has ``rows * row_bytes`` bytes); else None."""
    from torch import Tensor as _Tensor

    nbytes = rows = 0
    for value in batch.values():
        if not isinstance(value, _Tensor) or not value.ndim or (rows and value.shape[0] != rows):
            return None
        rows = value.shape[0]
        nbytes += value.nbytes
    return nbytes // rows if rows and nbytes % rows == 0 else None


#: Figure name -> meaning. Every figure is finite (0 when there is nothing to measure).
FIGURES: dict[str, str] = {
    "epochs": "iterations over the loader (epochs) started in the span",
    "batches": "batches delivered to the consumer",
    "rows": "rows delivered to the consumer",
    "seconds": "wall time of the consumer loop: waiting for batches plus holding them",
    "rows_per_s": "rows delivered per second of loop time (rows / seconds)",
    "bytes_per_s": "bytes of batch payload delivered per second of loop time",
    "wait_fraction": "share of the step cycle spent waiting for data: wait_s / (wait_s + step_s)",
    "wait_s": "time the consumer blocked waiting for batches (first batch of each epoch excluded)",
    "step_s": "time the consumer held batches (the training step and its hooks)",
    "first_batch_s": "time to the first batch of an epoch (mean over epochs started in the span)",
    "fetch_p50_ms": "median time waiting for one batch (first batch excluded)",
    "fetch_p99_ms": "99th percentile of the time waiting for one batch",
    "io_wait_s": "time reader threads spent in Lance reads (summed over threads and workers)",
    "io_bytes": "bytes read from storage (Lance I/O statistics)",
    "io_requests": "read requests to storage (Lance I/O statistics)",
    "io_mb_per_s": "effective I/O bandwidth: io_bytes / io_wait_s, in MB/s per reader thread",
    "io_amplification": "io_bytes per byte of the rows read (their Arrow size, estimated at setup): 1 reads "
    "each row's bytes once; a take spread over remote files reads far more",
    "io_ms_per_request": "read time per storage request: io_wait_s / io_requests in ms (Lance overlaps "
    "requests, so one request's own latency is longer; it grows with the store's latency)",
    "decode_s": "time in decode/transform (summed over threads and workers)",
    "convert_s": "time converting Arrow to tensors (summed over threads and workers)",
    "other_s": "time in any other measured stage (e.g. pinning memory)",
    "prefetch_ready": "items (read groups, or batches with a transform) ready in the read-ahead queue "
    "when the consumer asked (mean)",
    "prefetch_slots": "size of that read-ahead queue (mean)",
    "bad_rows": "rows the bad-row policy replaced",
    "retries": "reads retried after a transient storage error (each failed attempt that was retried)",
    "throttles": "of those retries, the ones the store asked for by throttling (HTTP 429/503, SlowDown)",
    "retry_wait_s": "time spent waiting between retries (backoff; part of io_wait_s)",
    "workers_ready": (
        "batches the worker processes finished that had not reached the main process when "
        "the consumer asked (mean): batches in transfer"
    ),
}

#: Loader parts the data wait is attributed to (`lance_lightning.metrics.report.loader_seconds`).
REPLAY_PARTS = ("storage", "decode", "convert", "other", "workers")

#: Compute-floor figure name -> meaning (`DataLoadingMonitor(replay_batches=N)`).
REPLAY_FIGURES: dict[str, str] = {
    "steps": "training steps replayed",
    "batches": "cached batches the replayed steps cycled through",
    "rows_per_step": "mean rows of the replayed batches",
    "replayed_step_s": "seconds per replayed training step on cached device batches (data for free)",
    "rows_per_batch": "mean rows per batch of the real run",
    "intraop_threads": "torch intra-op threads of the training thread during the replay (torch.get_num_threads())",
    "step_s": "the compute floor: replayed_step_s scaled to the real run's rows_per_batch (step time taken as "
    "proportional to rows)",
    "real_step_s": "the real run's step cycle: (wait_s + step_s) / batches",
    "speedup": "real_step_s / step_s: the most the run could gain with data for free",
    "speedup_without_wait": "real_step_s / (real_step_s - wait per batch): the gain if only the wait vanished",
    "compute_share": "step_s / real_step_s: the share of the real cycle the step's compute needs",
    "wait_share": "the share of the real cycle spent waiting for data (wait_fraction)",
    "rest_share": "the rest of the real cycle: loop, hooks, logging, validation, checkpoints, CPU taken by the loader",
    **{
        f"wait_share/{part}": f"wait_share attributed to {part} by its share of loader time (the parts add up to it)"
        for part in REPLAY_PARTS
    },
}

#: Clock stages, by the figure they count towards.
STAGE_FIGURES = {
    "read": "io_wait_s",
    "transform": "decode_s",
    "decode": "decode_s",
    "augment": "decode_s",
    "convert": "convert_s",
}


def figures(span: Snapshot) -> dict[str, float]:
    """The `FIGURES` of a span (``after.minus(before)``): every name present, every value finite."""
    t = span.totals
    g = t.get
    batches = g("batches", 0.0)
    wait, step, first = g("wait_s", 0.0), g("step_s", 0.0), g("first_s", 0.0)
    seconds = wait + step + first
    stages = {"io_wait_s": 0.0, "decode_s": 0.0, "convert_s": 0.0, "other_s": 0.0}
    for key, value in t.items():
        if key.endswith("_seconds"):
            stages[STAGE_FIGURES.get(key[: -len("_seconds")], "other_s")] += value
    iterations = g("iterations", 0.0)
    out = {
        "epochs": iterations,
        "batches": batches,
        "rows": g("delivered_rows", 0.0),
        "seconds": seconds,
        "rows_per_s": _ratio(g("delivered_rows", 0.0), seconds),
        "bytes_per_s": _ratio(g("delivered_bytes", 0.0), seconds),
        "wait_fraction": _ratio(wait, wait + step),
        "wait_s": wait,
        "step_s": step,
        "first_batch_s": _ratio(first, iterations),
        "fetch_p50_ms": 1e3 * LatencyHistogram.percentile(span.fetch_counts, 50),
        "fetch_p99_ms": 1e3 * LatencyHistogram.percentile(span.fetch_counts, 99),
        "io_bytes": g("io_bytes", 0.0),
        "io_requests": g("io_requests", 0.0),
        "io_mb_per_s": _ratio(g("io_bytes", 0.0), stages["io_wait_s"]) / 1e6,
        "io_amplification": _ratio(g("io_bytes", 0.0), g("read_row_bytes", 0.0)),
        "io_ms_per_request": 1e3 * _ratio(stages["io_wait_s"], g("io_requests", 0.0)),
        **stages,
        "prefetch_ready": _ratio(g("prefetch_ready", 0.0), g("prefetch_polls", 0.0)),
        "prefetch_slots": _ratio(g("prefetch_slots", 0.0), g("prefetch_polls", 0.0)),
        "bad_rows": g("bad_rows", 0.0),
        "retries": g("retries", 0.0),
        "throttles": g("throttles", 0.0),
        "retry_wait_s": g("retry_wait_s", 0.0),
        "workers_ready": _ratio(g("workers_ready_sum", 0.0), g("workers_ready_samples", 0.0)),
    }
    return {name: float(out[name]) for name in FIGURES}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0
