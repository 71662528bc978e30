"""Sections 3 and 4 of the video benchmark: clips/s of every reader, and this loader's resident memory.

Guarantees:
- `speed_section`: per set and worker count, every reader is built once and reads one epoch (its
  first, worker start included), then ``--rounds`` rounds of timed epochs of at least
  ``--min-seconds``, the readers' order reversed every other round; ratios are to this loader in
  the same round. The what-if row's ``VideoFrame.reformat`` patch (`reformat_one_thread`) holds
  only around that reader's epochs, in this process.
- `memory_section`: one loader over the set with more videos than ``open_files`` for
  ``--memory-epochs`` epochs; RSS of this process and all its descendants after each epoch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import memory
from benchmarks.studies.video_data import ARGS, KIB, Data, log
from benchmarks.studies.video_readers import (
    ClipItems,
    FileClips,
    Lance,
    Meter,
    Phase,
    TorchCodecFileClips,
    WholeBlobClips,
    epoch,
    lance_meter,
    plain_loader,
    sampler,
    shutdown,
    timed_epochs,
)
from lance_lightning.media.decoders import clip_decoder


# -- section 1 and 3: the loader and the baselines ---------------------------------------------
@dataclass
class Speed:
    """Per (set, workers, reader): clips/s of every round and bytes/requests per clip."""

    rates: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    ratios: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    per_clip: dict[tuple[str, int, str], tuple[float, float]] = field(default_factory=dict)
    first: dict[tuple[str, int, str], Phase] = field(default_factory=dict)
    #: This loader's (read, decode) ms per clip from its own metrics, each round.
    stages: dict[tuple[str, int, str], list[tuple[float, float]]] = field(default_factory=dict)


@dataclass
class Reader:
    """One reader of section 3, built once: its loader, how its bytes are counted, how it stops."""

    kind: str
    loader: Any
    meter: Meter | None
    close: Callable[[], None]
    stages: Callable[[], tuple[float, float]] | None = None
    #: Entered around each of this reader's epochs (the what-if row's patch), else nothing.
    around: Callable[[], Any] = contextlib.nullcontext


@contextlib.contextmanager
def reformat_one_thread() -> Iterator[None]:
    """While inside: PyAV's ``VideoFrame.reformat`` converts on one thread (``threads=1``) unless told
    otherwise. The what-if row of section 3: the suggested fix, without changing the package."""
    from av.video.frame import VideoFrame

    original = VideoFrame.reformat

    def reformat(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("threads", 1)
        return original(self, *args, **kwargs)

    VideoFrame.reformat = reformat
    try:
        yield
    finally:
        VideoFrame.reformat = original


def build_reader(kind: str, data: Data, workers: int) -> Reader:
    """Reader ``kind`` over ``data`` (local); bytes are counted where this process can see them."""
    if kind.startswith("lance"):
        t0, fix = kind == "lance-t0", kind == "lance-fix"
        seed = 1 if t0 else 2 if fix else 0  # separate pools of open videos in one process
        lance_reader = Lance.build(data.uri, workers, reader_threads=0 if t0 else None, seed=seed)
        around = reformat_one_thread if fix else contextlib.nullcontext
        return Reader(kind, lance_reader.loader, lance_reader.io, lance_reader.close, lance_reader.stages, around)
    meter: Meter | None = None
    if kind == "whole":
        dataset: ClipItems = WholeBlobClips(data.uri, data.labels, ARGS.frames, None)
        if workers == 0:
            meter = lance_meter(dataset.dataset())
    elif kind == "files":
        dataset = FileClips(data.files, data.labels, ARGS.frames)
        if workers == 0:
            meter = lambda: (float(dataset.bytes_read), float(dataset.read_calls))  # noqa: E731
    else:
        dataset = TorchCodecFileClips(data.files, data.labels, ARGS.frames)
    loader = plain_loader(dataset, workers)
    return Reader(kind, loader, meter, lambda: shutdown(loader))


def measured_epoch(reader: Reader) -> Phase:
    before = reader.meter() if reader.meter else (float("nan"),) * 2
    started = time.perf_counter()
    with reader.around():
        clips = epoch(reader.loader)
    seconds = time.perf_counter() - started
    after = reader.meter() if reader.meter else (float("nan"),) * 2
    return Phase(clips, seconds, after[0] - before[0], after[1] - before[1])


def speed_section(sets: list[Data], files_kind: str) -> Speed:
    """Section 3 (and section 1's local rows): per set and worker count, every reader built once and
    read one epoch (its first), then ``--rounds`` rounds of timed epochs, the order reversed each round."""
    result = Speed()
    for data in sets:
        for workers in ARGS.workers:
            kinds = ["lance", "whole", files_kind] + (["lance-t0", "lance-fix"] if workers == 0 else [])
            readers: list[Reader] = []
            try:
                for kind in kinds:
                    readers.append(build_reader(kind, data, workers))
                    first = measured_epoch(readers[-1])
                    result.first[(data.spec.name, workers, kind)] = first
                    log(f"[speed] {data.spec.name:5} workers {workers} {kind:8} first epoch {first.rate:7.1f} clips/s")
                for rnd in range(ARGS.rounds):
                    rates: dict[str, float] = {}
                    for reader in readers if rnd % 2 == 0 else readers[::-1]:
                        stages = reader.stages() if reader.stages else None
                        with reader.around():
                            timed = timed_epochs(reader.loader, reader.meter, ARGS.min_seconds)
                        key = (data.spec.name, workers, reader.kind)
                        if reader.stages and stages:
                            read, decode = (1e3 * (b - a) / timed.clips for a, b in zip(stages, reader.stages()))
                            result.stages.setdefault(key, []).append((read, decode))
                        rates[reader.kind] = timed.rate
                        result.rates.setdefault(key, []).append(timed.rate)
                        result.per_clip.setdefault(key, timed.per_clip())
                        log(
                            f"[speed] round {rnd + 1} {data.spec.name:5} workers {workers} {reader.kind:8} "
                            f"{timed.rate:7.1f} clips/s ({timed.clips} clips in {timed.seconds:.1f} s), "
                            f"{timed.per_clip()[0] / KIB:,.1f} KiB/clip"
                        )
                    for kind, rate in rates.items():
                        result.ratios.setdefault((data.spec.name, workers, kind), []).append(rate / rates["lance"])
            finally:
                for reader in readers:
                    reader.close()
    return result


# -- section 4: memory --------------------------------------------------------------------------
@dataclass
class MemoryRun:
    name: str
    workers: int
    videos: int
    rss: list[float]
    open_after: int | None
    seconds: float


def memory_section(sets: list[Data]) -> list[MemoryRun]:
    runs = []
    data = sets[1]  # more videos than open_files
    for workers in ARGS.workers:
        reader = Lance.build(data.uri, workers)
        rss, started = [], time.perf_counter()
        try:
            for _ in range(ARGS.memory_epochs):
                epoch(reader.loader)
                rss.append(memory.rss() / 2**20)
            pool = len(clip_decoder(sampler(ARGS.open_files)).pool) if workers == 0 else None
        finally:
            reader.close()
        run = MemoryRun(data.spec.name, workers, data.spec.videos, rss, pool, time.perf_counter() - started)
        runs.append(run)
        log(
            f"[memory] {data.spec.name} workers {workers}: RSS after each epoch "
            + " ".join(f"{v:.0f}" for v in rss)
            + f" MiB; containers open: {pool}"
        )
    return runs
