"""Issue #50: a dataset whose prepare did not finish is refused by a reader at setup (a `ConfigError`
naming the source, the URI, what is missing and both fixes), unless the source says
``allow_incomplete: true``; once the prepare is rerun to completion it reads whole.

Before the fix a `LanceDataModule` trained on an interrupted S3 prepare's committed rows without a
word (370 of 460 rows). Oracle: the input's row count, and the rows an uninterrupted prepare holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lance_lightning import ConfigError, LanceDataModule, LanceSource
from lance_lightning.source import Prepare
from lance_lightning.write import prepare
from tests.harness import fit
from tests.helpers import flat, stop_prepare_after
from tests.s3_server import S3Server
from tests.unit.write.inputs import parquet_files

FILES, ROWS = 5, 8


def _module(uri: str, options: dict | None, **extra: object) -> LanceDataModule:
    return LanceDataModule(train=LanceSource(uri, columns=["id", "x"], storage_options=options, **extra), batch_size=4)


def test_an_interrupted_prepare_on_s3_is_refused_by_fit_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: S3Server
) -> None:
    options, uri = s3.storage_options(), "s3://data/prepare-incomplete.lance"
    spec = Prepare("parquet", str(parquet_files(tmp_path / "in", files=FILES, rows=ROWS)), unit_files=1, workers=1)
    stop_prepare_after(monkeypatch, spec, uri, 2, options)
    with pytest.raises(ConfigError) as error:
        fit(tmp_path, _module(uri, options), name="refused")
    message = str(error.value)
    assert error.value.param == "train.uri" and error.value.value == uri
    assert "prepare that did not finish" in message and "16 rows committed" in message
    assert "lance_lightning.prepare" in message and "rerun the same prepare" in message
    assert "allow_incomplete: true" in message

    allowed = fit(tmp_path, _module(uri, options, allow_incomplete=True), name="allowed")
    assert sorted(flat(allowed.seen)) == list(range(2 * ROWS))  # the two committed units, said on purpose

    assert prepare(spec, uri, storage_options=options, progress=False).status == "resumed"
    whole = fit(tmp_path, _module(uri, options), name="whole")
    assert sorted(flat(whole.seen)) == list(range(FILES * ROWS))


def test_a_local_partial_output_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Prepare("parquet", str(parquet_files(tmp_path / "in", files=FILES, rows=ROWS)), unit_files=1, workers=1)
    out = str(tmp_path / "out.lance")
    stop_prepare_after(monkeypatch, spec, out, 2)
    module = _module(f"{out}.partial", None)
    with pytest.raises(ConfigError, match="did not finish") as error:
        module.setup("fit")
    assert error.value.param == "train.uri" and error.value.value == f"{out}.partial"
    allowed = _module(f"{out}.partial", None, allow_incomplete=True)
    allowed.setup("fit")
    assert sum(len(batch["id"]) for batch in allowed.train_dataloader()) == 2 * ROWS
    prepare(spec, out, progress=False)
    complete = _module(out, None)
    complete.setup("fit")
    assert sum(len(batch["id"]) for batch in complete.train_dataloader()) == FILES * ROWS


def test_allow_incomplete_must_be_a_boolean(tmp_path: Path) -> None:
    from tests.helpers import write_dataset

    module = _module(str(write_dataset(tmp_path / "ds.lance", 8)), None, allow_incomplete="yes")
    with pytest.raises(ConfigError, match="is not a boolean") as error:
        module.setup("fit")
    assert error.value.param == "train.allow_incomplete"
