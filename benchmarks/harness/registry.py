"""The harness's registry: workloads, loaders, sizes, worker counts and storages as data, and the
named suites (the benchmarks of record) that select cells of that grid.

Guarantees:
- A cell is one point of the grid ``workload/loader/size/workers/storage``, named by exactly that
  string (``scan/ours/400k/2/local``); `cell_name` and `parse_cell` are inverses.
- A selector is a suite's name (``peers``, ``worker-start``) or a cell name whose parts may be
  comma lists or ``*`` (``scan,filter/ours,lance.torch/40k/0,2``); parts left off take the
  defaults of `DEFAULTS`. `select` expands it to cells in grid order, dropping the pairs a loader
  cannot run (`Loader.runs`), and names any unknown part with the known ones (`SelectError`).
- Imports nothing but the standard library: the peers' environment imports it too.

To add a benchmark: add its workload to `WORKLOADS` or its loader (or loader variant, e.g. an
environment setting) to `LOADERS`; add a `Suite` when a result file of record comes from it. A
workers setting that is not a number (a policy that chooses the count) is a loader variant, or a
worker value that `workers_value` learns to read.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


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


def parse_cell(name: str) -> Cell:
    cells = select(name)
    if len(cells) != 1:
        raise SelectError(f"{name!r} names {len(cells)} cells, not one")
    return cells[0]


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
