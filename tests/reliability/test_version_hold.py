"""The pinned version kept alive: a cleanup of the dataset during or between fits cannot delete it.

Real Lance datasets are appended to, compacted and cleaned up with ``cleanup_old_versions`` while a
real `Trainer.fit` trains on an older version (with worker processes that reopen it each epoch),
and between a stopped fit and its resume. The fit's Lance tag keeps that version's files; without
it (``hold_versions="off"``, or the tag released with the documented command) the same cleanup
deletes them and the run stops with a clear error.
"""

from __future__ import annotations

import threading
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lance_lightning import ConfigError, LanceDataModule, LanceSource, RowShuffle
from lance_lightning.errors import DataReadError
from lance_lightning.hold import TAG_PREFIX, VersionHold, list_holds
from lance_lightning.source import pin_source
from tests.helpers import RecordingModel, append_rows, flat, make_table, run_cli_process, write_dataset
from tests.s3_server import S3Server

ROWS, BATCH, EPOCHS = 400, 20, 3


def _clean_up(uri: str) -> None:
    """What a maintenance job does: append, compact, then delete every old version it may."""
    append_rows(uri, 40)
    lance.dataset(uri).optimize.compact_files()
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)


class CleanUpMidFit(pl.Callback):
    """At one batch of the first epoch, the dataset is cleaned up the way a maintenance job would."""

    def __init__(self, uri: str, at_batch: int = 3) -> None:
        self.uri, self.at_batch = uri, at_batch
        self.holds_during: dict[str, int] = {}
        self.refused: str = ""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch != 0 or batch_idx != self.at_batch:
            return
        self.holds_during = list_holds(lance.dataset(self.uri))
        append_rows(self.uri, 40)
        lance.dataset(self.uri).optimize.compact_files()
        try:  # Lance's default refuses to delete a tagged version, naming the tag
            lance.dataset(self.uri).cleanup_old_versions(older_than=timedelta(0))
        except OSError as error:
            self.refused = str(error)
        lance.dataset(self.uri).cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)


class StopAt(pl.Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == self.batch:
            raise RuntimeError("stopped by the test")


class RecordHolds(pl.Callback):
    def __init__(self, uri: str) -> None:
        self.uri, self.at_start = uri, {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.at_start = list_holds(lance.dataset(self.uri))


def _module(uri: str, **kwargs: Any) -> LanceDataModule:
    kwargs.setdefault("shuffle", RowShuffle(seed=3, clump_rows=8))
    options = kwargs.pop("storage_options", None)
    return LanceDataModule(
        train=LanceSource(uri, columns=["id", "x"], storage_options=options), batch_size=BATCH, **kwargs
    )


def _trainer(root: Path, callbacks: list[pl.Callback], **kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("max_epochs", EPOCHS)
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        **kwargs,
    )


def _epochs(seen: list[list[int]], epochs: int = EPOCHS) -> list[list[int]]:
    ids, per_epoch = flat(seen), ROWS
    return [sorted(ids[e * per_epoch : (e + 1) * per_epoch]) for e in range(epochs)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_cleanup_mid_fit_cannot_delete_the_version_and_the_fit_finishes_exact(
    tmp_path: Path, num_workers: int
) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    cleanup = CleanUpMidFit(uri)
    model = RecordingModel()
    dm = _module(uri, num_workers=num_workers, persistent_workers=False)  # workers reopen the version each epoch
    _trainer(tmp_path, [cleanup]).fit(model, datamodule=dm)

    assert list(cleanup.holds_during.values()) == [1], "the fit held the version it trains on"
    tag = next(iter(cleanup.holds_during))
    assert tag.startswith(TAG_PREFIX) and tag in cleanup.refused, "the default cleanup refused, naming the tag"
    assert len(flat(model.seen)) == EPOCHS * ROWS
    assert _epochs(model.seen) == [list(range(ROWS))] * EPOCHS, "every row of version 1 once per epoch"
    assert list_holds(lance.dataset(uri)) == {}, "the fit removed its tag when it ended"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_a_hold_the_same_cleanup_stops_the_fit_with_a_clear_error(tmp_path: Path, num_workers: int) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    cleanup = CleanUpMidFit(uri)
    dm = _module(uri, hold_versions="off", num_workers=num_workers, persistent_workers=False)
    # With workers, the next epoch's fresh workers find the version gone: the error still arrives whole.
    with pytest.raises(DataReadError, match=r"(?is)version 1.*(not found|does not exist|no such file)"):
        _trainer(tmp_path, [cleanup]).fit(RecordingModel(), datamodule=dm)
    assert cleanup.holds_during == {} and cleanup.refused == ""


def test_a_stopped_fit_keeps_its_hold_and_the_resumed_fit_takes_it_over(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    first = RecordingModel()
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _trainer(tmp_path, [every, StopAt(9)]).fit(first, datamodule=_module(uri))
    kept = list_holds(lance.dataset(uri))
    assert list(kept.values()) == [1], "a stopped fit keeps the tag its checkpoints need"
    _clean_up(uri)

    second, holds = RecordingModel(), RecordHolds(uri)
    ckpt = str(tmp_path / "ckpt" / "epoch=0-step=8.ckpt")
    _trainer(tmp_path, [holds]).fit(second, datamodule=_module(uri), ckpt_path=ckpt)
    assert holds.at_start == kept, "the resumed fit holds the same version under the same tag"
    assert _epochs(first.seen[:8] + second.seen) == [list(range(ROWS))] * EPOCHS, "exact after the cleanup"
    assert list_holds(lance.dataset(uri)) == {}, "the resumed fit removed the tag when it ended"


def test_a_released_and_cleaned_version_is_a_clear_error_on_resume(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _trainer(tmp_path, [every, StopAt(5)]).fit(RecordingModel(), datamodule=_module(uri))
    (tag,) = list_holds(lance.dataset(uri))

    code, out = run_cli_process(["holds", uri], tmp_path)
    assert code == 0 and f"{tag}  version 1" in out
    code, out = run_cli_process(["holds", uri, "--release", "lance-lightning-nope"], tmp_path)
    assert code == 1 and "--release" in out and tag in out, "an unknown tag is refused, naming the ones there are"
    code, out = run_cli_process(["holds", uri, "--release"], tmp_path)
    assert code == 0 and f"released {tag}" in out and list_holds(lance.dataset(uri)) == {}
    _clean_up(uri)

    with pytest.raises(ConfigError, match=r"train\.version") as error:
        ckpt = str(tmp_path / "ckpt" / "epoch=0-step=4.ckpt")
        _trainer(tmp_path, []).fit(RecordingModel(), datamodule=_module(uri), ckpt_path=ckpt)
    assert "no longer exists" in str(error.value)


def test_keep_holds_after_a_normal_end_until_released(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", ROWS, fragment_rows=50)
    _trainer(tmp_path, [], max_epochs=1).fit(RecordingModel(), datamodule=_module(uri, hold_versions="keep"))
    assert list(list_holds(lance.dataset(uri)).values()) == [1]
    code, out = run_cli_process(["holds", uri, "--release"], tmp_path)
    assert code == 0 and list_holds(lance.dataset(uri)) == {}


def test_a_read_only_store_trains_with_one_warning(s3: S3Server, tmp_path: Path) -> None:
    uri = "s3://data/read_only_hold.lance"
    lance.write_dataset(make_table(ROWS), uri, storage_options=s3.storage_options())
    model = RecordingModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = _module(uri, storage_options=s3.read_only_options())
        _trainer(tmp_path, [], max_epochs=2).fit(model, datamodule=dm)
    held = [str(w.message) for w in caught if "could not hold version 1" in str(w.message)]
    assert len(held) == 1 and uri in held[0] and "cleanup_old_versions" in held[0]
    assert s3.secret_key not in held[0] and "aws_secret_access_key" not in held[0]
    assert _epochs(model.seen, 2) == [list(range(ROWS))] * 2
    assert list_holds(lance.dataset(uri, storage_options=s3.storage_options())) == {}


def test_an_unknown_hold_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="hold_versions") as error:
        LanceDataModule(train=LanceSource("unused.lance"), hold_versions="always")
    assert "keep" in str(error.value)


def test_a_mixture_resumes_at_its_sources_versions_after_a_cleanup(tmp_path: Path) -> None:
    """Rows appended, files compacted and old versions cleaned between a stopped fit and its resume:
    each source is re-pinned to the version its checkpoint was read at, held by the stopped fit."""
    from lance_lightning import LanceMixture

    uris = [write_dataset(tmp_path / f"ds{j}.lance", ROWS, fragment_rows=50) for j in range(2)]

    def module() -> LanceDataModule:
        mixture = LanceMixture(
            [LanceSource(uri, columns=["id", "x"]) for uri in uris], weights=[1.0, 3.0], epoch="samples", samples=ROWS
        )
        return LanceDataModule(train=mixture, batch_size=BATCH, shuffle=RowShuffle(seed=5))

    reference = RecordingModel()
    _trainer(tmp_path / "reference", [], max_epochs=2).fit(reference, datamodule=module())
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    first = RecordingModel()
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _trainer(tmp_path, [every, StopAt(9)], max_epochs=2).fit(first, datamodule=module())
    assert [list(list_holds(lance.dataset(uri)).values()) for uri in uris] == [[1], [1]]
    for uri in uris:
        _clean_up(uri)

    second = RecordingModel()
    ckpt = str(tmp_path / "ckpt" / "epoch=0-step=8.ckpt")
    _trainer(tmp_path, [], max_epochs=2).fit(second, datamodule=module(), ckpt_path=ckpt)
    assert first.seen[:8] + second.seen == reference.seen, "exact, at the versions the checkpoint was read at"
    assert [list_holds(lance.dataset(uri)) for uri in uris] == [{}, {}]


def test_tags_change_while_reader_threads_read_through_the_shared_handle(tmp_path: Path) -> None:
    """A fit ends (or starts) while reader threads still read the pinned version through the
    process's shared handle: taking and releasing the hold never fails ("Already borrowed") and
    leaves no tag. Found by the contract checker (case ``hold-released-while-readers-read``)."""
    uri = write_dataset(tmp_path / "ds.lance", 2000, fragment_rows=100)
    source = pin_source(LanceSource(uri), "train")
    handle = source.open(reads=True)
    stop, failures = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                handle.take(list(range(0, 2000, 3)))
            except Exception as error:  # noqa: BLE001 - recorded and asserted on below
                failures.append(error)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a tag that could not be put or removed warns
            for _ in range(40):
                hold = VersionHold("fit")
                hold.acquire([source])
                hold.finish_fit()
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert failures == []
    assert list_holds(lance.dataset(uri)) == {}
