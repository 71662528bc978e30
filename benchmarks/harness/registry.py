"""The harness's registry: workloads, loaders, sizes, worker counts and storages as data, the
named suites (the benchmarks of record) that select cells of that grid, and the studies (the
benchmarks of record that are not a grid: `Study`, run by `benchmarks.harness.study`) with their
parameters.

Guarantees:
- A cell is one point of the grid ``workload/loader/size/workers/storage``, named by exactly that
  string (``scan/ours/400k/2/local``); `select` of a cell's name is that one cell.
- A selector is a suite's name (``peers``, ``worker-start``) or a cell name whose parts may be
  comma lists or ``*`` (``scan,filter/ours,lance.torch/40k/0,2``); parts left off take the
  defaults of `DEFAULTS`. `select` expands it to cells in grid order, dropping the pairs a loader
  cannot run (`Loader.runs`), and names any unknown part with the known ones (`SelectError`).
- A study's name is never a workload's (a selector names one or the other).
- Imports nothing but the standard library: the peers' environment imports it too.

To add a benchmark: add its workload to `WORKLOADS` or its loader (or loader variant, e.g. an
environment setting) to `LOADERS`; add a `Suite` when a result file of record comes from it. A
workers setting that is not a number (a policy that chooses the count) is a loader variant, or a
worker value that `workers_value` learns to read.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field


class SelectError(ValueError):
    """A selector names a part the registry does not know."""


@dataclass(frozen=True)
class Workload:
    """What is read: a table kind, its columns, an order, a filter, a decode."""

    table: str  # "vec" (id, label, vec 128 x float32) or "images" (id, 64x64 JPEG, label)
    columns: tuple[str, ...]
    strategy: str = "NoShuffle"  # ours: the class name in lance_lightning; peers: shuffled or not
    strategy_args: tuple[tuple[str, object], ...] = ()
    filter: str | None = None
    decode: bool = False  # JPEG bytes to uint8 tensors (ours: DecodeImage; peers: TorchCodec)
    label: str = ""

    @property
    def shuffled(self) -> bool:
        return self.strategy != "NoShuffle"


VEC = ("id", "label", "vec")
WORKLOADS: dict[str, Workload] = {
    "scan": Workload("vec", VEC, label="(1) sequential scan"),
    "shuffle": Workload("vec", VEC, "RowShuffle", (("seed", 0),), label="(2) row shuffle"),
    "filter": Workload("vec", VEC, filter="label < 10", label="(3) filter `label < 10`"),
    "jpeg": Workload(
        "images", ("id", "image", "label"), "RowShuffle", (("seed", 0),), decode=True, label="(4) shuffled JPEG decode"
    ),
    "shard-shuffle": Workload("vec", VEC, "ShardShuffle", (("seed", 0),), label="ShardShuffle()"),
    "buffer-shuffle": Workload("vec", VEC, "BufferShuffle", (("seed", 0),), label="BufferShuffle()"),
    "clump-shuffle": Workload(
        "vec", VEC, "RowShuffle", (("seed", 0), ("clump_rows", 64)), label="RowShuffle(clump_rows=64)"
    ),
}
#: The scale table (one int64 column ``x = row``, files of 2^22 rows): every order of ours, with
#: and without the 10% filter ``x % 10 = 0``: ``x-scan``, ``x-shuffle-f10``, ...
X_ORDERS = {
    "scan": ("NoShuffle", ()),
    "shard-shuffle": ("ShardShuffle", (("seed", 0),)),
    "shuffle": ("RowShuffle", (("seed", 0),)),
    "clump-shuffle": ("RowShuffle", (("seed", 0), ("clump_rows", 64))),
    "buffer-shuffle": ("BufferShuffle", (("seed", 0),)),
}
for _name, (_strategy, _args) in X_ORDERS.items():
    for _filter in (None, "x % 10 = 0"):
        _label = _strategy + ("(64)" if len(_args) > 1 else "") + (", 10% filter" if _filter else "")
        _key = f"x-{_name}" + ("-f10" if _filter else "")
        WORKLOADS[_key] = Workload("x", ("x",), _strategy, _args, _filter, label=_label)


@dataclass(frozen=True)
class Loader:
    """Who reads: ours (in the project's environment) or a peer (in the peers' environment)."""

    label: str
    peer: bool = False
    env: tuple[tuple[str, str], ...] = ()  # environment of the cell's process
    dist: str = "lance-lightning"  # the distribution whose version the result records

    only: tuple[str, ...] = ()  # the workloads it runs, when not every one

    def runs(self, workload: Workload, name: str) -> bool:
        """Ours runs every workload; a peer only storage order and a true row shuffle of the
        vector and image tables; a baseline only the workloads it names."""
        if self.only:
            return name in self.only
        plain_rows = workload.strategy in ("NoShuffle", "RowShuffle") and "clump_rows" not in dict(
            workload.strategy_args
        )
        return not self.peer or (plain_rows and workload.table != "x")


HANDOFF_OFF = (("LANCE_LIGHTNING_WORKER_HANDOFF", "off"), ("LANCE_LIGHTNING_WORKER_CHOICE", "workers"))
LOADERS: dict[str, Loader] = {
    # ours, as users get it (with workers: the measured race, lance_lightning.load.race)
    "ours": Loader("lance-lightning `LanceDataModule`"),
    # ours waiting for its workers, the race's outcome forced to them: every batch is a worker's
    "ours-waited": Loader("lance-lightning `LanceDataModule`, waited", env=HANDOFF_OFF),
    # ... and its workers started the stock way (each imports the main module again)
    "ours-stock": Loader(
        "lance-lightning, waited, stock worker start",
        env=(*HANDOFF_OFF, ("LANCE_LIGHTNING_LEAN_WORKERS", "off")),
    ),
    "lance.torch": Loader("pylance `lance.torch`", peer=True, dist="pylance"),
    "litdata": Loader("LitData `StreamingDataset`", peer=True, dist="litdata"),
    "lancedb": Loader("LanceDB `StreamingDataset`", peer=True, dist="lancedb"),
    "mosaic": Loader("MosaicML `StreamingDataset`", peer=True, dist="mosaicml-streaming"),
    # the baseline of a row shuffle: hand-written Lance takes of random rows, in sorted groups of
    # our reader's full read group (Lance's random access slows as the rows grow sparse)
    "lance-take": Loader("hand-written `dataset.take` of sorted random groups", only=("x-shuffle",)),
}
PEERS = tuple(name for name, loader in LOADERS.items() if loader.peer)

#: Storages a cell reads from. Only the local file system is a harness storage today; the object
#: store benchmark (S3 behind a latency proxy) is still ``benchmarks/bench_object_store.py``.
STORAGES = ("local",)
WORKERS = (0, 2)
SIZES = ("4k", "8k", "20k", "40k", "100k", "400k", "1m")
DEFAULTS = {"size": "40k", "workers": "0", "storage": "local"}


def rows_of(size: str) -> int:
    """``40k`` -> 40,000; ``1m`` -> 1,000,000; ``1e6`` and plain numbers too."""
    text = size.lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        rows = float(number) * scale
    except ValueError:
        raise SelectError(f"size {size!r}: write rows as 40k, 1m, 1e6 or 40000") from None
    if rows < 1 or rows != int(rows):
        raise SelectError(f"size {size!r}: a whole number of rows, at least 1")
    return int(rows)


def workers_value(workers: str) -> int:
    if not workers.isdigit():
        raise SelectError(f"workers {workers!r}: a number of DataLoader worker processes (0, 2, ...)")
    return int(workers)


@dataclass(frozen=True)
class Cell:
    workload: str
    loader: str
    size: str
    workers: str
    storage: str = "local"

    @property
    def name(self) -> str:
        return cell_name(self)

    @property
    def rows(self) -> int:
        return rows_of(self.size)


def cell_name(cell: Cell) -> str:
    return "/".join((cell.workload, cell.loader, cell.size, cell.workers, cell.storage))


@dataclass(frozen=True)
class Suite:
    """A benchmark of record: its cells, the result file it writes with ``--record``, its target."""

    selectors: tuple[str, ...]
    record: str  # under benchmarks/results/
    about: str
    quick: tuple[str, ...] = ()  # the same cells at smoke sizes
    reps: int = 1
    seconds: float = 4.0
    target: str = ""
    verdict: str = ""  # how `benchmarks.harness.report.verdicts` judges the target
    again: bool = False  # each cell also times a second loader's first batch
    resume: int = 0  # ours: the median of this many resumes at 10% and 90% of the epoch


PEER_LOADERS = "ours-waited,lance.torch,litdata,lancedb,mosaic"
SUITES: dict[str, Suite] = {
    "peers": Suite(
        (f"scan,shuffle,filter/{PEER_LOADERS}/400k/0,2", f"jpeg/{PEER_LOADERS}/20k/0,2"),
        "peers.md",
        "ours against pylance lance.torch, LitData, LanceDB and MosaicML (each peer in its own environment, issue #39)",
        quick=(f"scan,shuffle,filter/{PEER_LOADERS}/40k/0,2", f"jpeg/{PEER_LOADERS}/4k/0,2"),
        target="with 2 workers, at least 1.2x the best peer's rows/s",
        verdict="best-peer",
    ),
    "scale": Suite(
        ("x-*/ours,lance-take/1m,10m",),
        "scale.md",
        "setup, first batch, memory, resume at 10% and 90% and rows/s of every order, with and without "
        "a 10% filter, on a one-column int64 table from 10^6 rows up (larger sizes: --sizes 100m, then 1e9)",
        quick=("x-scan,x-shuffle,x-scan-f10/ours,lance-take/20k",),
        resume=21,
        target="setup + first batch <= 1 s (no filter); RowShuffle memory over NoShuffle <= 64 MB; resume "
        "90%/10% <= 1.2; memory over NoShuffle with the filter <= 256 MB",
        verdict="scale",
    ),
    "worker-start": Suite(
        ("scan/ours,ours-waited,ours-stock/20k/0,2",),
        "worker_start.md",
        "iter(loader) to the first batch with 2 workers against 0, in fresh processes whose main module "
        "imports Lightning (the first 2-worker loader starts the fork server; 'again' is a second loader)",
        quick=("scan/ours/4k/0,2",),
        reps=3,
        again=True,
        seconds=0.0,
        target="2 workers cost at most 2 s more than 0 to the first batch (ours)",
        verdict="worker-start",
    ),
}


@dataclass(frozen=True)
class Study:
    """A benchmark of record that is not a grid of loaders' rows/s (a fit resumed, memory over epochs,
    metrics on and off, ...): ``benchmarks/studies/<module>.py``'s ``measure(p)`` with these parameters
    (`benchmarks.harness.study`). Sizes, worker counts, strategies and repetitions are parameters here,
    changed with ``--set KEY=VALUE``; ``quick`` holds the smoke run's."""

    module: str
    record: str  # under benchmarks/results/
    title: str
    about: str
    params: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)
    section: str = ""  # the study writes only this marked section of its result file
    target: str = ""


STUDIES: dict[str, Study] = {
    "startup": Study(
        "startup",
        "startup.md",
        "Start-up time of the command line",
        "the lance-lightning commands (a fresh interpreter each) against python -c 'import lance'",
        {"reps": 7, "rows": 2000},
        {"reps": 3},
        target="<= 1.5x for --help, materialize and profile --help",
    ),
    "mixture": Study(
        "mixture",
        "mixture.md",
        "Mixtures: the position map and reading",
        "LanceMixture's position map (positions/s at 10% and 90%, O(1)) and a two-source mixture's rows/s "
        "against one RowShuffle source",
        {"rows": 200_000, "batches": 100, "batch_size": 256, "batch": 4096, "reps": 5},
        {"rows": 50_000, "batches": 20, "reps": 3},
    ),
    "packing": Study(
        "packing",
        "packing.md",
        "Packing: setup time and memory on 10^7 documents, windows/s read",
        "TokenPacking's setup time and memory (with and without lengths_column), windows/s read, mixing",
        {"documents": 10_000_000, "small": 1_000_000, "max_len": 16, "seq_len": 2048, "batch_size": 8, "batches": 1000},
        {"documents": 100_000, "small": 20_000, "batches": 20},
    ),
    "resume": Study(
        "resume",
        "resume.md",
        "Resume benchmark: `Trainer.fit(ckpt_path=...)` to the first training batch",
        "Trainer.fit(ckpt_path=...) to the first batch at 10%, 50% and 90% of an epoch, per strategy (O(1) resume)",
        # 2**21 rows: whole shards of 8192 (a short shard would make every later batch span two ranges,
        # which this benchmark would misread as a resume cost)
        {
            "rows": 2**21,
            "batch_size": 8192,
            "strategies": ["none", "shard", "row", "buffer"],
            "positions": [0.1, 0.5, 0.9],
            "filter": "",
            "workers": 0,
            "reps": 3,
            "steps_per_position": 3,
        },
        {"rows": 200_000, "batch_size": 2048, "strategies": ["shard"], "reps": 1, "steps_per_position": 1},
        target="t90/t10 <= 1.2 per strategy",
    ),
    "memory": Study(
        "memory",
        "memory.md",
        "Memory benchmark: peak RSS per epoch over 20 epochs",
        "peak RSS per epoch over a 20-epoch image fit (RowShuffle, DecodeImage), one run per worker count",
        {"rows": 20_000, "epochs": 20, "batch_size": 128, "workers": [0, 2], "interval": 0.02},
        {"rows": 5_000},
        target="peak RSS of the last epoch / epoch 2 <= 1.05",
    ),
    "planning": Study(
        "planning",
        "planning.md",
        "Planning once per node: N processes planning one filtered split against one process",
        "planning once per node (issue #39): processes started together planning one 10% filter of a "
        "10^7-row table against one process, survey cache off and on",
        {"rows": 10_000_000, "processes": 8, "reps": 3},
        {"rows": 100_000, "processes": 2, "reps": 1},
        target="every ratio N processes / 1 (bytes, CPU, slowest first batch) <= 1.5 with the cache on",
    ),
    "metrics": Study(
        "metrics",
        "metrics.md",
        "Metrics overhead benchmark",
        "the loader and a fit with metrics on against off (scan, takes, JPEG decode, Trainer.fit); metrics.png",
        {"rows": 1_000_000, "image_rows": 20_000, "reps": 12, "min_seconds": 0.5},
        {"rows": 200_000, "image_rows": 5_000, "reps": 4, "min_seconds": 0.3},
        target="rows/s with metrics on >= 0.97 x off",
    ),
    "read": Study(
        "read",
        "read.md",
        "Read benchmark",
        "the train loader against raw Lance reads of the same rows, every strategy and filter, and pylance's "
        "LanceDataset (ratios; targets); read.png",
        {"rows": 1_000_000, "image_rows": 20_000, "clump1_batches": 200, "reps": 5, "min_seconds": 1.0},
        {"rows": 200_000, "image_rows": 5_000, "clump1_batches": 50, "reps": 3, "min_seconds": 0.3},
        target="each row's ratio at least its target (the table's target column)",
    ),
    "filter-scan": Study(
        "filter_scan",
        "filter_scan.md",
        "Filtered reads against lance.torch (issue #39)",
        "filtered reads (label < 1, < 10, < 50; no index, BITMAP, BTREE) against lance.torch's "
        "LanceDataset(filter=...): epoch rows/s, first batch, requests (its section of filter_scan.md)",
        {"rows": 400_000, "reps": 5, "min_seconds": 1.0, "first_reps": 15},
        {"rows": 60_000, "reps": 1, "min_seconds": 0.01, "first_reps": 1},
        section="peer-filters",
        target="epoch rows/s ratio >= 1.3 and first-batch ratio <= 2",
    ),
    "object-store": Study(
        "object_store",
        "object_store.md",
        "Object store: rows/s, requests and bytes per epoch",
        "every strategy and two 1% filters from an S3 server on loopback behind a latency proxy, remote "
        "cache off and on, 0 and 2 workers: rows/s, requests, bytes, amplification (starts its own server)",
        {
            "rows": 100_000,
            "rows_per_file": 0,  # 0: all rows in one data file
            "server": "moto",  # or ministack (benchmarks/ministack_server.py)
            "latency_ms": 20.0,
            "workers": [0, 2],
            "epoch_cap_s": 120.0,
            "patterns": ["scan", "shard", "buffer", "row", "filter", "filter-indexed"],
            "cache_modes": ["off", "on"],
        },
        {"rows": 5_000, "workers": [0], "epoch_cap_s": 20.0, "latency_ms": 2.0},
    ),
    "materialize": Study(
        "materialize",
        "materialize.md",
        "Materialized-view benchmark: S3 source vs local view, multi-epoch",
        "a multi-epoch fit from S3 (moto on loopback) against the same fit from a local MaterializedView "
        "(break-even epochs)",
        {"rows": 200_000, "epochs": 5, "reps": 2},
        {"rows": 50_000, "epochs": 3, "reps": 1},
    ),
    "tuning": Study(
        "tuning",
        "tuning.md",
        "Tuning benchmark",
        "the figures behind the tuning advice no other benchmark measures (clumps, filters per strategy, "
        "wait fractions, shuffle quality of small shards, ...)",
        {"rows": 200_000, "image_rows": 5_000, "reps": 3, "min_seconds": 0.5},
        {"reps": 1, "min_seconds": 0.2},
    ),
    "transforms": Study(
        "transforms",
        "transforms.md",
        "Batch transforms: decode scaling, plain PyTorch, overlap, memory",
        "DecodeImage scaling over threads, the plugin against a plain PyTorch DataLoader, overlap, memory",
        {"rows": 20_000, "reps": 5},
        {"rows": 4_000, "reps": 3},
    ),
    "decode-backends": Study(
        "transforms_backends",
        "decode_backends.md",
        "Decode backends: TorchCodec against torchvision on the CPU",
        "DecodeImage with TorchCodec against torchvision on the same in-memory JPEG batches (no regression: >= 0.97)",
        {"reps": 5},
        {"reps": 3},
    ),
    "video": Study(
        "video",
        "video.md",
        "Video clips: bytes per clip, clips/s, resident memory",
        "VideoClips from Lance blobs: bytes and requests per clip (local and S3 + 20 ms), the read path per "
        "read-ahead, clips/s at 0 and 2 workers against plain DataLoaders, RSS over 20 epochs (starts an S3 server)",
        {
            "frames": 16,
            "batch_size": 8,
            "open_files": 16,
            "workers": [0, 2],
            "rounds": 3,
            "min_seconds": 1.5,
            "latency_ms": 20.0,
            "cost_clips": 12,
            "memory_epochs": 20,
        },
        {"open_files": 4, "workers": [0], "rounds": 1, "min_seconds": 0.1, "cost_clips": 2, "memory_epochs": 3},
    ),
    "prepare": Study(
        "prepare",
        "prepare.md",
        "`prepare` against LitData `optimize` and Mosaic `MDSWriter` (issue #40)",
        "prepare of a 10,000-JPEG image folder against LitData's optimize and Mosaic's MDSWriter (1 and 2 "
        "processes), the peers in their own environment: rows/s, bytes on disk, first training batch",
        {"classes": 10, "per_class": 1000, "reps": 3, "batch_size": 256},
        {"per_class": 100, "reps": 1},
    ),
    "gpu": Study(
        "gpu",
        "gpu.md",
        "GPU: decode, a ResNet-18 fit fed from Lance, copies that overlap",
        "on a CUDA device: GPU decode against CPU decode, a ResNet-18 bf16 fit fed from Lance against batches "
        "already on the GPU, copy bandwidth and overlap (refused without CUDA; device=cpu: a smoke run)",
        {
            "device": "cuda",
            "rows": 256 * 64,  # one epoch must hold `steps` batches of 256
            "steps": 60,  # the first 10 are warm-up
            "reps": 5,  # of each copy measurement
            "variants": [],  # more Lance rows per fit: cpu=F, threads=N, prio, joined by '+'
            "model2": False,  # a second fit: ResNet-18 at 128x128, batch batch2
            "batch2": 1024,
            "steps2": 40,
            "skip_decode": False,
        },
        {"steps": 30, "rows": 30 * 256},
    ),
}

if set(STUDIES) & (set(SUITES) | set(WORKLOADS)):  # a name selects one thing only
    raise RuntimeError(f"study names shared with a suite or workload: {set(STUDIES) & (set(SUITES) | set(WORKLOADS))}")


def _expand(part: str, known: list[str], what: str) -> list[str]:
    out: list[str] = []
    for item in part.split(","):
        matched = [k for k in known if fnmatch.fnmatchcase(k, item)] if any(c in item for c in "*?[") else [item]
        if not matched or (item not in known and not any(c in item for c in "*?[")):
            raise SelectError(f"unknown {what} {item!r}; known: {', '.join(known)}")
        out += [m for m in matched if m not in out]
    return out


def select(selector: str) -> list[Cell]:
    """The cells a selector names (a suite, or ``workload/loader/size/workers/storage`` patterns)."""
    if selector in SUITES:
        return [c for s in SUITES[selector].selectors for c in select(s)]
    parts = selector.split("/")
    if len(parts) > 5 or not parts[0]:
        raise SelectError(
            f"{selector!r}: a suite ({', '.join(SUITES)}) or workload/loader/size/workers/storage, e.g. scan/ours/40k/0"
        )
    parts += [None] * (5 - len(parts))  # type: ignore[list-item]
    workloads = _expand(parts[0], list(WORKLOADS), "workload")
    loaders = _expand(parts[1] or "ours", list(LOADERS), "loader")
    sizes = (parts[2] or DEFAULTS["size"]).split(",")
    for size in sizes:
        rows_of(size)
    workers = (parts[3] or DEFAULTS["workers"]).split(",") if parts[3] != "*" else [str(w) for w in WORKERS]
    for w in workers:
        workers_value(w)
    storages = _expand(parts[4] or DEFAULTS["storage"], list(STORAGES), "storage")
    return [
        Cell(wl, lo, size, w, st)
        for wl in workloads
        for size in sizes
        for w in workers
        for lo in loaders
        for st in storages
        if LOADERS[lo].runs(WORKLOADS[wl], wl)
    ]
