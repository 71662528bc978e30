"""Shared pieces of the benchmarks: cached datasets, result tables and plots, machine facts.

`steady_allocator` pins glibc malloc's thresholds so that both sides of a pair are measured under
the same allocator state, whichever ran first. Paired timing (`paired`, `Paired`, `quiet_reps`,
`iterate`) has its one home in `benchmarks.harness.timing`.

The shared module of the harness's studies (``benchmarks.studies``) and the probes alike:

- data: `vec_dataset`, `image_dataset` (`synthetic_jpegs`), `scale_dataset` (the scale
  benchmark's one-column tables, which the probes of ``probes/`` reuse), each written once under a
  cache folder;
- timing: `steady_allocator`, `median_ms`, `interleaved_median_ms`; fresh processes: `run_child`;
  memory: `rss_mb`, `peak_rss_mb`;
- result files: `command_line` (a probe's), `machine`, `stamp`, `load_average`, `Row`,
  `markdown_table` (through `benchmarks.harness.tables`, which writes every result table),
  `rows_report` (a ratio study's table, set-up notes and raw figures), `bar_plot`, `write_result`.

A study imports it as ``benchmarks.common``; so does a probe, after putting the repository root on
``sys.path`` (the line at its top).
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.harness.tables import table

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_CACHE = Path(os.environ.get("LANCE_LIGHTNING_BENCH_DIR", "/tmp/lance_lightning_bench"))
#: Where `scale_dataset` writes the one-column scale tables the probes share (the harness's scale
#: suite writes the same tables under its own cache folder).
SCALE_CACHE = Path("/tmp/lance_lightning_scale")
#: Rows per Lance file of the scale tables.
SCALE_FRAGMENT_ROWS = 1 << 22

VEC_DIM = 128
LABELS = 100
#: Rows per Lance file (fragment) of the vector table: 1M rows -> 4 fragments.
FRAGMENT_ROWS = 262_144
IMAGE_SIDE = 64


# -- data ------------------------------------------------------------------------------------
def table_ready(path: Path, rows: int, index_column: str | None) -> bool:
    """True when ``path`` holds a complete dataset of ``rows`` rows (and the index, if asked)."""
    import lance

    if not path.exists():
        return False
    try:
        ds = lance.dataset(str(path))
        if ds.count_rows() != rows:
            return False
        if index_column is not None:
            names = {tuple(i["fields"]) for i in ds.list_indices()}
            return (index_column,) in names
        return True
    except Exception:  # noqa: BLE001 - a half-written cache: rebuild it
        return False


def vec_dataset(cache_dir: Path, rows: int, log: Callable[[str], None] = print) -> str:
    """The (id int64, label int32, vec fixed_size_list<float32>[128]) table, written once.

    ``label`` takes 100 values in random order and has a BITMAP scalar index.
    """
    import lance

    path = cache_dir / f"vec_{_short(rows)}.lance"
    if table_ready(path, rows, "label"):
        log(f"[data] reusing {path}")
        return str(path)
    log(f"[data] writing {rows:,} rows to {path} ...")
    started = time.perf_counter()
    schema = pa.schema([("id", pa.int64()), ("label", pa.int32()), ("vec", pa.list_(pa.float32(), VEC_DIM))])

    def batches() -> Iterable[pa.RecordBatch]:
        rng = np.random.default_rng(0)
        chunk = 65_536
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            ids = np.arange(first, first + n, dtype=np.int64)
            labels = rng.integers(0, LABELS, n, dtype=np.int32)
            values = rng.random(n * VEC_DIM, dtype=np.float32)
            vec = pa.FixedSizeListArray.from_arrays(pa.array(values), VEC_DIM)
            yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(labels), vec], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    ds = lance.write_dataset(reader, str(path), mode="overwrite", max_rows_per_file=FRAGMENT_ROWS)
    ds.create_scalar_index("label", "BITMAP")
    log(f"[data] wrote {path} in {time.perf_counter() - started:.1f} s")
    return str(path)


def synthetic_jpegs(count: int, side: int, gen: Any, quality: int = 90) -> list[bytes]:
    """``count`` JPEGs of ``side`` x ``side``: smooth random colour fields plus noise (drawn from the
    torch generator ``gen``), encoded by TorchCodec's ``JpegEncoder``, or by torchvision's
    ``encode_jpeg`` where TorchCodec does not import (a GPU image whose torch has no matching build)."""
    import torch
    import torch.nn.functional as F

    coarse = torch.rand(count, 3, 8, 8, generator=gen)
    smooth = F.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
    images = ((smooth * 0.85 + torch.rand(count, 3, side, side, generator=gen) * 0.15) * 255).to(torch.uint8)
    try:
        from torchcodec.encoders import JpegEncoder
    except (ImportError, OSError, RuntimeError):
        from torchvision.io import encode_jpeg

        return [encode_jpeg(image, quality=quality).numpy().tobytes() for image in images]
    return [JpegEncoder(image).to_tensor(quality=quality).numpy().tobytes() for image in images]


def image_dataset(cache_dir: Path, rows: int, log: Callable[[str], None] = print) -> str:
    """(id int64, image binary JPEG 64x64 RGB, label int32), written once.

    Images are `synthetic_jpegs` (a few KB each).
    """
    import lance
    import torch

    path = cache_dir / f"images_{_short(rows)}.lance"
    if table_ready(path, rows, None):
        log(f"[data] reusing {path}")
        return str(path)
    log(f"[data] encoding {rows:,} JPEGs into {path} ...")
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    schema = pa.schema([("id", pa.int64()), ("image", pa.binary()), ("label", pa.int32())])

    def batches() -> Iterable[pa.RecordBatch]:
        chunk = 1024
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            blobs = synthetic_jpegs(n, IMAGE_SIDE, gen)
            labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int32).numpy()
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.arange(first, first + n, dtype=np.int64)), pa.array(blobs, pa.binary()), pa.array(labels)],
                schema=schema,
            )

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    lance.write_dataset(reader, str(path), mode="overwrite")
    log(f"[data] wrote {path} in {time.perf_counter() - started:.1f} s")
    return str(path)


def scale_dataset(cache: Path, rows: int, log: Callable[[str], None] | None = None) -> str:
    """``cache/x_{rows}.lance``: ``rows`` rows of one int64 column ``x = row`` (written once, streaming,
    in files of `SCALE_FRAGMENT_ROWS`): the scale benchmark's tables."""
    import lance

    path = Path(cache) / f"x_{rows}.lance"
    if table_ready(path, rows, None):
        return str(path)
    schema = pa.schema([("x", pa.int64())])

    def batches() -> Iterable[pa.RecordBatch]:
        for first in range(0, rows, 1 << 20):
            yield pa.record_batch(
                [pa.array(np.arange(first, min(rows, first + (1 << 20)), dtype=np.int64))], schema=schema
            )

    started = time.perf_counter()
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        str(path),
        mode="overwrite",
        max_rows_per_file=SCALE_FRAGMENT_ROWS,
        max_rows_per_group=1 << 16,
    )
    message = f"wrote {rows:,} rows in {time.perf_counter() - started:.1f} s"
    if log is None:
        print(message, file=sys.stderr)
    else:
        log(message)
    return str(path)


def _short(rows: int) -> str:
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}m"
    if rows % 1000 == 0:
        return f"{rows // 1000}k"
    return str(rows)


# -- timing ----------------------------------------------------------------------------------
#: glibc malloc thresholds (bytes) pinned by `steady_allocator`: the largest values glibc's own
#: dynamic tuning reaches in a long-running process (mmap threshold 32 MiB, trim threshold 2x that).
STEADY_MMAP_THRESHOLD = 32 << 20
STEADY_TRIM_THRESHOLD = 64 << 20


def steady_allocator() -> str:
    """Pin glibc malloc's mmap and trim thresholds for the whole run; return what was done.

    Both sides of a comparison run in this one process. By default glibc raises those thresholds
    whenever a large block is freed, so whichever side frees large Arrow buffers first changes how
    the other side's allocations fault in fresh pages (measured: the raw image scan ran at 28-33 ms
    per epoch right after our loader, 41-47 ms alone). Pinned, each side is measured under the same
    allocator state whatever ran before it.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        if libc.mallopt(m_mmap_threshold, STEADY_MMAP_THRESHOLD) and libc.mallopt(
            m_trim_threshold, STEADY_TRIM_THRESHOLD
        ):
            return (
                f"glibc malloc pinned: mmap threshold {STEADY_MMAP_THRESHOLD >> 20} MiB, trim threshold "
                f"{STEADY_TRIM_THRESHOLD >> 20} MiB"
            )
    except (OSError, AttributeError):
        pass
    return "allocator thresholds not pinned (not glibc)"


def median_ms(fn: Callable[[], object], calls: int = 30) -> float:
    """Median milliseconds of ``calls`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def interleaved_median_ms(fns: dict, rounds: int = 60) -> dict:
    """Median ms of each of ``fns``, called in turn ``rounds`` times (slow drifts hit all alike)."""
    times: dict = {key: [] for key in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for key, fn in fns.items():
            started = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - started)
    return {key: 1e3 * statistics.median(values) for key, values in times.items()}


# -- child processes -------------------------------------------------------------------------
def run_child(args: list[str], python: str | Path = sys.executable, **kwargs: Any) -> dict[str, Any]:
    """Run ``python ARGS`` (one measurement in a fresh process; this environment's interpreter unless
    ``python`` names another) and return the JSON object printed on its last line of stdout; a child
    that fails raises with the end of its stderr."""
    done = subprocess.run([str(python), *args], capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux's /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """This process's highest resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- results ---------------------------------------------------------------------------------
@dataclass
class Row:
    """One line of a result table."""

    scenario: str
    rows_per_s: float
    baseline: str
    base_rows_per_s: float
    ratio: float
    target: float | None  # minimum ratio; None = reported only
    note: str = ""

    @property
    def status(self) -> str:
        if self.target is None:
            return "info"
        return "PASS" if self.ratio >= self.target else "FAIL"


def command_line() -> str:
    """The command that produced this run (a probe's script, relative to the repository root)."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(BENCH_DIR.parent)
    except ValueError:
        pass
    python = "uv run python" if os.environ.get("UV") else "python"  # `uv run` sets UV
    return " ".join([python, shlex.quote(str(script)), *map(shlex.quote, sys.argv[1:])])


def machine(lightning: bool = False) -> str:
    """The machine and the versions that matter, for a result file's header (with Lightning's when asked)."""
    import platform

    import lance
    import torch

    text = (
        f"{platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        f"pylance {lance.__version__}, torch {torch.__version__}, pyarrow {pa.__version__}"
    )
    if lightning:
        import lightning as L

        text += f", lightning {L.__version__}"
    return text


def stamp() -> str:
    """Now, for a result file: ``2026-11-27 03:05 UTC`` (local time, with its zone)."""
    import datetime as dt

    return dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def load_average(sep: str = ", ") -> str:
    """The 1, 5 and 15 minute load averages (the machines are shared: a result file says how busy)."""
    return sep.join(f"{x:.2f}" for x in os.getloadavg())


def write_result(path: Path | str, text: str) -> Path:
    """Write a result file (its folder made if missing) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def markdown_table(rows: list[Row]) -> str:
    heads = "scenario | rows/s | baseline | baseline rows/s | ratio | target | result"
    targets = [None if r.target is None else f"≥ {r.target:g}" for r in rows]
    body = [
        (r.scenario, r.rows_per_s, r.baseline, r.base_rows_per_s, r.ratio, t, r.status) for r, t in zip(rows, targets)
    ]
    return "\n".join(table(heads, "< >,.0f < >,.0f >.2f > ^", body))


def rows_report(rows: list[Row], intro: str, notes: list[str], raw: list[str], plot: Path, title: str) -> str:
    """A ratio study's result text: the intro, the table of `Row`, the targets failed, the set-up notes
    and the raw figures per repetition; its bar plot written to ``plot``."""
    failed = [f"{r.scenario} vs {r.baseline}" for r in rows if r.status == "FAIL"]
    bar_plot(rows, plot, title)
    return "\n".join(
        [
            intro,
            "",
            markdown_table(rows),
            "",
            f"Targets failed: {len(failed)} of {sum(r.target is not None for r in rows)}"
            + ("" if not failed else ": " + "; ".join(failed)),
            "",
            "## Setup",
            "",
            *[f"- {n}" for n in notes],
            *[f"- {r.scenario}: {r.note}" for r in rows if r.note],
            "",
            "## Raw rows/s per repetition",
            "",
            *raw,
        ]
    )


def bar_plot(rows: list[Row], path: Path, title: str) -> None:
    """Horizontal bars of each row's ratio, with its target marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.scenario}\nvs {r.baseline}" for r in rows][::-1]
    ratios = [r.ratio for r in rows][::-1]
    colours = [{"PASS": "#2e7d32", "FAIL": "#c62828", "info": "#607d8b"}[r.status] for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.6))
    ax.barh(range(len(rows)), ratios, color=colours)
    for i, r in enumerate(rows[::-1]):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(r.ratio, i, f" {r.ratio:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xscale("log")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if min(ratios) / 2 <= t <= max(ratios) * 2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("ratio to baseline (log scale; black tick = target; green PASS, red FAIL, grey info)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
