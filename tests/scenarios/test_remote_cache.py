"""The remote cache against a real S3-compatible server on loopback, behind a proxy that counts
the bytes it serves: a split read by take from the store is copied once and read locally, in the
same order, with the same cursor, through ``Trainer.fit`` (and a resume with the cache on or off).
A copy damaged on disk (truncated, bits flipped, rows replaced, a file deleted) is copied again with
one line before ``Trainer.fit`` trains a row of it, and trains the source's rows; one that cannot be
copied again ends ``lance-lightning fit`` with one error naming the copy and the option.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_lightning import ConfigError, LanceDataModule, LanceSource, NoShuffle, RemoteCache, RowShuffle
from lance_lightning.materialize.copy import tree_bytes
from lance_lightning.materialize.space import estimate_view_bytes
from lance_lightning.source import pin_source
from tests import zygote
from tests.fault_proxy import FaultProxy
from tests.harness import Job, Setup, assert_exact, ckpt_file, fit, run_and_check_resume, subprocess_env
from tests.helpers import DAMAGE_KINDS, RecordingModel, damage_cached_copy, flat, make_table
from tests.s3_server import S3Server, environment_credentials

ROWS, BATCH, FILE_ROWS = 2_000, 20, 500
#: Steps of one epoch of `_module` (the first steps of `from_store`).
EPOCH_STEPS = ROWS // BATCH
COLUMNS = ["id", "x", "vec"]


@pytest.fixture(scope="module")
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy.serving(s3.endpoint) as served:
        yield served


@pytest.fixture(scope="module")
def s3_uri(s3: S3Server) -> str:
    uri = s3.fresh_uri("data", "cached")
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options(), max_rows_per_file=FILE_ROWS)
    return uri


def _options(s3: S3Server, proxy: FaultProxy) -> dict[str, str]:
    return {**s3.storage_options(), "aws_endpoint": proxy.endpoint}


def _module(uri: str, options: dict[str, str], cache: RemoteCache | None, **kwargs: object) -> LanceDataModule:
    return LanceDataModule(
        train=LanceSource(uri, columns=COLUMNS, storage_options=options, filter=kwargs.pop("filter", None)),
        batch_size=kwargs.pop("batch_size", BATCH),
        shuffle=kwargs.pop("shuffle", RowShuffle(seed=3)),
        remote_cache=cache,
        **kwargs,
    )


def _column_bytes(uri: str, options: dict[str, str]) -> int:
    return lance.dataset(uri, storage_options=options).to_table(columns=COLUMNS).nbytes


@pytest.fixture(scope="module")
def from_store(
    tmp_path_factory: pytest.TempPathFactory, s3: S3Server, proxy: FaultProxy, s3_uri: str
) -> list[list[int]]:
    """The batches (ids per step) of a 2-epoch ``Trainer.fit`` of `_module` with the cache off, read
    from the store: the reference the cached runs of this module's tests are compared with (one fit
    for them all; epoch 0 is its first ``ROWS // BATCH`` steps)."""
    root = tmp_path_factory.mktemp("store")
    return fit(root, _module(s3_uri, _options(s3, proxy), RemoteCache(enabled=False)), name="off", max_epochs=2).seen


def test_a_row_shuffle_reads_one_local_copy_in_the_same_order(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str, from_store: list[list[int]]
) -> None:
    options = _options(s3, proxy)
    cache = RemoteCache(directory=str(tmp_path / "cache"))

    before = proxy.bytes_sent
    dm = _module(s3_uri, options, cache)
    cold = fit(tmp_path, dm, name="cold", max_epochs=2)
    cold_bytes = proxy.bytes_sent - before
    assert cold.seen == from_store  # same batches, same order, both epochs
    assert "cache:" in dm.explain() and "downloaded in" in dm.explain() and str(tmp_path / "cache") in dm.explain()
    assert len(list((tmp_path / "cache").glob("*.lance"))) == 1
    # One sequential copy of the read columns: far below the take path's re-downloads.
    assert cold_bytes <= 1.5 * _column_bytes(s3_uri, s3.storage_options()) + 200_000, cold_bytes

    before = proxy.bytes_sent
    warm_dm = _module(s3_uri, options, cache)
    warm = fit(tmp_path, warm_dm, name="warm", max_epochs=2)
    warm_bytes = proxy.bytes_sent - before
    assert warm.seen == from_store
    assert "reused" in warm_dm.explain()
    column_bytes = _column_bytes(s3_uri, s3.storage_options())
    # Planning's metadata only (manifest, footers, a sample of rows): no copy of the rows again.
    assert warm_bytes < 0.5 * column_bytes, f"a warm run downloaded {warm_bytes} bytes (rows: {column_bytes})"


@pytest.mark.parametrize(("first", "then"), [(True, False), (False, True)], ids=["on-then-off", "off-then-on"])
def test_a_resume_with_the_cache_turned_on_or_off_is_exact(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str, first: bool, then: bool, from_store: list[list[int]]
) -> None:
    options, k = _options(s3, proxy), 7
    cache = {True: RemoteCache(directory=str(tmp_path / "cache")), False: RemoteCache(enabled=False)}
    stop = fit(tmp_path, _module(s3_uri, options, cache[first]), name="A", max_steps=k, ckpt_every=k)
    resumed = fit(
        tmp_path, _module(s3_uri, options, cache[then]), name="B", max_epochs=2, ckpt_path=ckpt_file(tmp_path, "A", k)
    )
    assert_exact(stop.seen, resumed.seen, from_store, k)


def test_a_selective_filter_read_by_take_is_copied_and_scanned_locally(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str
) -> None:
    options = _options(s3, proxy)
    selective = {"filter": "id % 50 = 7", "shuffle": NoShuffle()}  # 2%: read by take from the store
    plain = _module(s3_uri, options, RemoteCache(enabled=False), **dict(selective))
    plain.setup("fit")
    assert plain.plans["train"].method == "take"
    dm = _module(s3_uri, options, RemoteCache(directory=str(tmp_path / "cache")), batch_size=4, **dict(selective))
    seen = flat(fit(tmp_path, dm, name="cached").seen)
    assert seen == list(range(7, ROWS, 50))
    text = dm.explain()
    assert "read: scan" in text and "id % 50 = 7" in text and "selectivity 2.00%" in text, text


def test_a_sparse_filter_downloads_its_rows_not_the_table(tmp_path: Path, s3: S3Server, proxy: FaultProxy) -> None:
    """A 1% filter of 524-byte rows, 52 KB apart: Lance's default handle merges ranges that close,
    so a filtered copy downloaded the whole file. The sparse copy takes the plan's matching rows
    through a handle that merges only ranges under 4 KiB apart: a small multiple of their bytes."""
    rows, uri = 8_000, "s3://data/sparse.lance"
    payload = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(512 * rows, dtype=np.uint8)), 512)
    lance.write_dataset(make_table(rows, extra={"payload": payload}), uri, storage_options=s3.storage_options())
    options, columns = _options(s3, proxy), ["id", "x", "payload"]
    table_bytes = lance.dataset(uri, storage_options=options).to_table(columns=columns).nbytes

    def module(cache: RemoteCache, **more_options: str) -> LanceDataModule:
        given = {**options, **more_options}
        source = LanceSource(uri, columns=columns, filter="id % 100 = 7", storage_options=given)
        return LanceDataModule(train=source, batch_size=BATCH, shuffle=RowShuffle(seed=5), remote_cache=cache)

    uncached = fit(tmp_path, module(RemoteCache(enabled=False)), name="store")
    before = proxy.bytes_sent
    dm = module(RemoteCache(directory=str(tmp_path / "cache")))
    cached = fit(tmp_path, dm, name="sparse")
    downloaded = proxy.bytes_sent - before
    assert cached.seen == uncached.seen
    assert sorted(flat(cached.seen)) == list(range(7, rows, 100))
    delivered = (rows // 100) * (8 + 4 + 512)
    assert downloaded < 0.1 * table_bytes, f"downloaded {downloaded:,} bytes for {delivered:,} (table: {table_bytes:,})"
    assert "by take of the matching 1.00% of the rows" in dm.explain(), dm.explain()

    before = proxy.bytes_sent  # a block_size the user sets wins: Lance merges the ranges again
    merged = fit(tmp_path, module(RemoteCache(directory=str(tmp_path / "merged")), block_size="65536"), name="merged")
    assert merged.seen == uncached.seen
    assert proxy.bytes_sent - before > 0.5 * table_bytes


def test_a_split_larger_than_the_limit_is_read_from_the_store(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str, from_store: list[list[int]]
) -> None:
    options = _options(s3, proxy)
    largest = max(
        f.file_size_bytes
        for frag in lance.dataset(s3_uri, storage_options=options).get_fragments()
        for f in frag.metadata.files
    )
    limit_gb = 1.5 * largest / 1e9  # one data file fits, the split does not
    dm = _module(s3_uri, options, RemoteCache(directory=str(tmp_path / "cache"), limit_gb=limit_gb))
    model = fit(tmp_path, dm, name="over")
    assert "exceed limit_gb" in dm.explain() and "read: take" in dm.explain()
    assert not list((tmp_path / "cache").glob("*.lance"))
    assert model.seen == from_store[:EPOCH_STEPS]


def test_a_limit_below_one_data_file_is_refused_before_training(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str
) -> None:
    dm = _module(s3_uri, _options(s3, proxy), RemoteCache(directory=str(tmp_path / "c"), limit_gb=1e-7))
    with pytest.raises(ConfigError) as error:
        fit(tmp_path, dm, name="tiny")
    assert error.value.param == "remote_cache.limit_gb" and "below one data file" in str(error.value)


def test_a_directory_that_cannot_be_made_is_refused(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dm = _module(s3_uri, s3.storage_options(), RemoteCache(directory=str(blocker / "cache")))
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == "remote_cache.directory" and "cannot be created" in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"limit_gb": 0}, "remote_cache.limit_gb"), ({"directory": "s3://b/c"}, "remote_cache.directory")],
)
def test_bad_settings_name_the_parameter(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(ConfigError) as error:
        RemoteCache(**kwargs)
    assert error.value.param == param and "Fix:" in str(error.value)


_MAKE_COPY = """
import sys
from lance_lightning import LanceDataModule, LanceSource, RemoteCache, RowShuffle
import json
uri, options, directory = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
dm = LanceDataModule(train=LanceSource(uri, columns=["id"], storage_options=options), batch_size=4,
                     shuffle=RowShuffle(seed=0), remote_cache=RemoteCache(directory=directory))
dm.setup("fit")
"""


def test_least_recently_used_copies_not_in_use_are_evicted(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    import json

    directory = tmp_path / "cache"
    other = "s3://data/other.lance"
    lance.write_dataset(make_table(ROWS), other, storage_options=s3.storage_options(), max_rows_per_file=FILE_ROWS)
    # A copy made by a process that has ended: nothing holds it. The script runs in a process forked
    # from the test zygote (`tests.zygote`: the process a fresh start gives, less the imports).
    script = tmp_path / "make_copy.py"
    script.write_text(_MAKE_COPY)
    make_copy = [sys.executable, str(script), other, json.dumps(s3.storage_options()), str(directory)]
    done = zygote.run(make_copy, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (old,) = directory.glob("*.lance")
    pinned = pin_source(LanceSource(s3_uri, columns=["id"], storage_options=s3.storage_options()), "train")
    new = estimate_view_bytes(pinned, pinned.open(), pinned.total_rows, staged=False)
    room = (
        new + 0.5 * sum(tree_bytes(copy) for copy in directory.glob("*.lance"))
    ) / 1e9  # the new copy fits, the old one must go
    dm = LanceDataModule(
        train=LanceSource(s3_uri, columns=["id"], storage_options=s3.storage_options()),
        batch_size=4,
        shuffle=RowShuffle(seed=0),
        remote_cache=RemoteCache(directory=str(directory), limit_gb=room),
    )
    dm.setup("fit")
    (kept,) = directory.glob("*.lance")
    assert kept != old and not old.with_suffix(".json").exists()
    # The copy this process reads is in use: a later copy does not evict it, even over the limit.
    done = zygote.run(make_copy, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert kept.is_dir() and kept.with_suffix(".json").exists()


def test_workers_read_the_local_copy(tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str) -> None:
    options = _options(s3, proxy)
    cache = RemoteCache(directory=str(tmp_path / "cache"))
    in_process = fit(tmp_path, _module(s3_uri, options, cache), name="threads")
    with_workers = fit(tmp_path, _module(s3_uri, options, cache, num_workers=2), name="workers")
    assert with_workers.seen == in_process.seen


def test_object_store_figures_reach_the_logger_and_the_report(
    tmp_path: Path, s3: S3Server, proxy: FaultProxy, s3_uri: str
) -> None:
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from lance_lightning import DataLoadingMonitor
    from lance_lightning.metrics.figures import figures
    from lance_lightning.metrics.meter import Snapshot

    monitor = DataLoadingMonitor(log_every_n_steps=5)
    dm = _module(s3_uri, _options(s3, proxy), RemoteCache(enabled=False))  # takes from the store
    fit(tmp_path, dm, name="figures", callbacks=[monitor], logger=CSVLogger(str(tmp_path), name="csv"))
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    logged: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("data/io_") and value:
                logged[key] = max(logged.get(key, 0.0), float(value))
    for name in ("io_requests", "io_bytes", "io_amplification", "io_ms_per_request"):
        assert logged.get(f"data/{name}", 0.0) > 0, (name, logged)
    assert "x the rows' bytes" in monitor.report() and "ms per request" in monitor.report()
    # The figure is io_bytes over the rows' own bytes.
    span = Snapshot({"io_bytes": 3_000.0, "read_row_bytes": 1_000.0, "io_requests": 4.0, "read_seconds": 0.02})
    assert figures(span)["io_amplification"] == 3.0 and figures(span)["io_ms_per_request"] == 5.0


@pytest.mark.slow
def test_two_ranks_share_one_copy_and_resume_exactly_on_one(
    tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 DDP ranks (gloo) read one copy made by whichever rank took the lock first; the run stops
    mid-epoch and resumes on one rank with the cache off: exactly once, every epoch. Its own 640
    rows in 4 data files (batches of 16: 20 steps an epoch on 2 ranks, the stop at 13)."""
    for name, value in environment_credentials(s3).items():
        monkeypatch.setenv(name, value)  # the ranks' subprocesses read them
    directory, rows = tmp_path / "cache", 640
    uri = s3.fresh_uri("data", "ddp")
    lance.write_dataset(make_table(rows), uri, storage_options=s3.storage_options(), max_rows_per_file=rows // 4)

    def job(name: str, setup: Setup, **kw: object) -> Job:
        cache = {"directory": str(directory)} if setup.devices == 2 else {"enabled": False}
        return Job(name, uri, "row:2", setup, max_epochs=2, extra={"remote_cache": cache}, **kw)

    run_and_check_resume(
        tmp_path, job, rows=rows, k=13, setup_a=Setup(devices=2), setup_b=Setup(devices=1), max_epochs=2
    )
    assert len(list(directory.glob("*.lance"))) == 1


# -- a damaged copy ---------------------------------------------------------------------------------
class _RowModel(RecordingModel):
    """Records every trained row's ``x`` and ``vec`` by its id, to compare with the source's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, tuple[float, list[float]]] = {}

    def training_step(self, batch: Mapping[str, object], batch_idx: int) -> object:
        for i, x, vec in zip(batch["id"].tolist(), batch["x"].tolist(), batch["vec"].tolist()):  # type: ignore[union-attr]
            self.rows[i] = (x, vec)
        return super().training_step(batch, batch_idx)


def _source_rows(uri: str, s3: S3Server) -> dict[int, tuple[float, list[float]]]:
    table = lance.dataset(uri, storage_options=s3.storage_options()).to_table(columns=COLUMNS).to_pydict()
    return {i: (x, vec) for i, x, vec in zip(table["id"], table["x"], table["vec"])}


def _damage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "damaged" in r.getMessage()]


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_a_damaged_copy_is_copied_again_before_fit_trains_a_row_of_it(
    tmp_path: Path,
    s3: S3Server,
    proxy: FaultProxy,
    s3_uri: str,
    kind: str,
    caplog: pytest.LogCaptureFixture,
    from_store: list[list[int]],
) -> None:
    options, directory = _options(s3, proxy), tmp_path / "cache"
    _module(s3_uri, options, RemoteCache(directory=str(directory))).setup("fit")  # the intact copy
    (copy,) = directory.glob("*.lance")
    source = lance.dataset(s3_uri, storage_options=s3.storage_options()).to_table(columns=COLUMNS)
    damaged = damage_cached_copy(copy, kind)
    if kind in ("flip", "replace"):  # what the bug trained: other values, read without an error
        assert lance.dataset(str(copy)).to_table() != source

    caplog.set_level(logging.INFO, logger="lance_lightning.materialize.view")
    before = proxy.bytes_sent
    dm = _module(s3_uri, options, RemoteCache(directory=str(directory)))
    model = fit(tmp_path, dm, name="again", model=_RowModel())
    assert model.seen == from_store[:EPOCH_STEPS], "the same batches in the same order as from the store"
    assert model.rows == _source_rows(s3_uri, s3), "a trained row differs from the source's"
    (line,) = _damage_lines(caplog)
    assert str(copy) in line and damaged[0].name in line and "copying it again" in line and "\n" not in line, line
    assert "downloaded in" in dm.explain(), dm.explain()
    assert proxy.bytes_sent - before > 0.5 * _column_bytes(s3_uri, s3.storage_options()), "not copied again"
    assert lance.dataset(str(copy)).to_table() == source

    # Intact now: the next run reuses it by stat alone, without a line or a download of its rows.
    caplog.clear()
    before = proxy.bytes_sent
    warm = _module(s3_uri, options, RemoteCache(directory=str(directory)))
    warm.setup("fit")
    note = warm.plans["train"].cache or ""
    assert "(reused), verified: " in note and "checked by size and change time" in note, note
    assert "re-read" not in note, note
    assert not _damage_lines(caplog)
    assert proxy.bytes_sent - before < 0.5 * _column_bytes(s3_uri, s3.storage_options())


_DAMAGED_FIT_CONFIG = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 4
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  default_root_dir: {root}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x, vec], storage_options: {options}}}
  batch_size: 20
  shuffle: {{class_path: lance_lightning.RowShuffle, init_args: {{seed: 3}}}}
  remote_cache: {{directory: {directory}, verify: checksum}}
"""


@pytest.mark.timeout(300)
def test_a_damaged_copy_that_cannot_be_copied_again_ends_fit_with_one_error(
    tmp_path: Path, s3: S3Server, s3_uri: str
) -> None:
    """The disk cannot hold the copy again (a file size limit: the kernel refuses the write with
    EFBIG): ``lance-lightning fit`` ends with exit status 1 and one error naming the copy, the
    damage and ``remote_cache.directory``; no Lance traceback. Once the copy fits, a run recovers."""
    import json

    directory = tmp_path / "cache"
    _module(s3_uri, s3.storage_options(), RemoteCache(directory=str(directory))).setup("fit")
    (copy,) = directory.glob("*.lance")
    damage_cached_copy(copy, "flip")
    config = tmp_path / "fit.yaml"
    config.write_text(
        _DAMAGED_FIT_CONFIG.format(
            root=tmp_path / "root", uri=s3_uri, options=json.dumps(s3.storage_options()), directory=directory
        )
    )
    limit = min(f.stat().st_size for f in (copy / "data").glob("*.lance")) // 2
    # The CLI under the limit, in its own process: forked from the test zygote (`tests.zygote`: the
    # process a fresh start gives, less the imports), as the other CLI tests' runs are.
    script = tmp_path / "fit_under_limit.py"
    script.write_text(
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "from lance_lightning.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = zygote.run(
        [sys.executable, str(script), "fit", "--config", str(config)],
        text=True,
        timeout=240,
        cwd=tmp_path,
        # Never write bytecode under the limit: a .pyc cut at the limit breaks every later import of it.
        env={**subprocess_env(), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "most recent call last" not in result.stderr, result.stderr[-3000:]
    error = result.stderr[result.stderr.index("lance-lightning fit: error:") :].strip().splitlines()
    assert len(error) <= 6, error
    assert str(copy) in error[0] and "SHA-256 check" in error[0] and "copying it again failed" in error[0], error
    assert "File too large" in error[0], error
    assert any("remote_cache.directory" in line for line in error[1:]), error
    assert any("remote_cache.enabled: false" in line for line in error[1:]), error
    assert sum("is damaged" in line for line in result.stderr.splitlines()) == 1, result.stderr[-3000:]
    assert not copy.with_suffix(".json").exists(), "the damaged copy must not stay readable"

    dm = _module(s3_uri, s3.storage_options(), RemoteCache(directory=str(directory)))
    dm.setup("fit")
    assert "downloaded in" in (dm.plans["train"].cache or "")
    source = lance.dataset(s3_uri, storage_options=s3.storage_options()).to_table(columns=COLUMNS)
    assert lance.dataset(str(copy)).to_table() == source
