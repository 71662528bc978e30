"""Throttles and transient errors of an object store during `Trainer.fit`: ridden out, counted, reported.

A real S3 server (moto) on loopback sits behind a real HTTP proxy (`tests.fault_proxy`) that
answers chosen data-file GETs with ``503 SlowDown`` or ``429 TooManyRequests``. The storage
options are the user's defaults (no client settings), so this is what a user gets: every row
once, and the retries, throttles and their waiting time in the logged ``data/*`` figures (read
back from the CSV logger) and in the end-of-fit report.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import lance
import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger

from lance_lightning import DataLoadingMonitor, LanceDataModule, LanceSource, NoShuffle
from lance_lightning.source import LOCAL_READ_BLOCK_BYTES, READ_CLIENT_OPTIONS, _read_options
from tests.fault_proxy import FaultProxy
from tests.helpers import RecordingModel, flat, make_table
from tests.s3_server import S3Server

ROWS, BATCH = 1200, 50
#: Seconds the store throttles data reads, from the first one.
OUTAGE_S = 1.5
#: Paths of the dataset's data files (not its manifests).
DATA_FILES = ".lance/data/"
#: Lance sends the first request of a range read up to this many times at once before an error
#: reaches Python (not configurable), so a retry needs at least this many failed requests.
SENDS_PER_ATTEMPT = 4


@pytest.fixture(scope="module")
def proxied(s3: S3Server) -> Iterator[tuple[str, dict[str, str], FaultProxy]]:
    uri = s3.fresh_uri("data", "throttled")
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options(), max_rows_per_file=300)
    with FaultProxy.serving(s3.endpoint) as proxy:
        yield uri, {**s3.storage_options(), "aws_endpoint": proxy.endpoint}, proxy


class ThrottleAtStart(pl.Callback):
    """Makes the store throttle data-file reads for a while from the first one of the fit (after
    planning): long enough that Lance's immediate re-sends of a request all fail."""

    def __init__(self, proxy: FaultProxy, status: int) -> None:
        self.proxy, self.status = proxy, status

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.proxy.throttle(OUTAGE_S, self.status, DATA_FILES)


def _csv(root: Path) -> list[dict[str, str]]:
    with open(root / "csv" / "version_0" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _total(rows: list[dict[str, str]], key: str) -> float:
    return sum(float(row[key]) for row in rows if row.get(key))


@pytest.mark.parametrize(("num_workers", "status"), [(0, 503), (2, 429)])
def test_a_throttled_store_loses_nothing_and_the_figures_show_it(
    proxied: tuple[str, dict[str, str], FaultProxy],
    tmp_path: Path,
    num_workers: int,
    status: int,
    capsys: pytest.CaptureFixture,
) -> None:
    uri, options, proxy = proxied
    before = proxy.failed
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], storage_options=options),
        batch_size=BATCH,
        shuffle=NoShuffle(),
        num_workers=num_workers,
    )
    model = RecordingModel()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=CSVLogger(str(tmp_path), name="csv"),
        callbacks=[DataLoadingMonitor(), ThrottleAtStart(proxy, status)],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, datamodule=dm)

    assert flat(model.seen) == list(range(ROWS)), "every row exactly once, in order"
    failed = proxy.failed - before
    assert failed >= SENDS_PER_ATTEMPT, f"the proxy answered data reads with {status}"
    rows = _csv(tmp_path)
    retries, throttles = _total(rows, "data/epoch/retries"), _total(rows, "data/epoch/throttles")
    assert 1 <= retries <= failed // SENDS_PER_ATTEMPT and throttles == retries
    assert _total(rows, "data/epoch/retry_wait_s") > 0
    assert _total(rows, "data/retries") == retries, "the per-step figures add up to the epoch's"
    report = capsys.readouterr().out
    assert f"storage retries          {retries:,.0f} ({throttles:,.0f} throttled by the store)," in report


def test_reads_leave_retries_to_the_policy_unless_the_user_sets_the_client() -> None:
    options = {"aws_endpoint": "http://127.0.0.1:9"}
    assert _read_options("s3://bucket/ds.lance", options) == {**options, **READ_CLIENT_OPTIONS}
    assert _read_options("s3://bucket/ds.lance", None) == READ_CLIENT_OPTIONS
    own = {**options, "Client_Max_Retries": "5"}
    read = _read_options("s3://bucket/ds.lance", own)
    assert read["Client_Max_Retries"] == "5" and "client_max_retries" not in read, "the user's setting wins"
    assert read["download_retry_count"] == READ_CLIENT_OPTIONS["download_retry_count"]
    # Local files: no client to configure; nearby byte ranges are merged (the user's block_size wins).
    local = {"block_size": str(LOCAL_READ_BLOCK_BYTES)}
    assert _read_options("/data/ds.lance", None) == local and _read_options("file:///d.lance", {}) == local
    assert _read_options("/data/ds.lance", {"block_size": "4096"}) == {"block_size": "4096"}
    assert _read_options("memory://d.lance", None) is None
