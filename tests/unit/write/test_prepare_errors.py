"""Bad input to prepare is a `ConfigError` naming the file or the flag, raised before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_lightning.errors import ConfigError
from lance_lightning.source import LanceSource, Prepare
from lance_lightning.write import prepare, prepare_sources
from tests.unit.write.inputs import hf_folder, image_folder, parquet_files, tar_shards


def _refused(tmp_path: Path, spec: Prepare, match: str, output: str = "out.lance") -> ConfigError:
    with pytest.raises(ConfigError, match=match) as error:
        prepare(spec, str(tmp_path / output), progress=False)
    assert not Path(f"{tmp_path / output}.partial").exists()
    return error.value


def test_missing_and_empty_input(tmp_path: Path) -> None:
    assert _refused(tmp_path, Prepare("imagefolder", str(tmp_path / "nope")), "does not exist").param == "input"
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    assert _refused(tmp_path, Prepare("imagefolder", str(tmp_path / "empty")), "holds no image files").param == "input"
    assert not (tmp_path / "out.lance").exists()


def test_mixed_formats_name_the_file_and_guess_its_format(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=1)
    (root / "dog" / "notes.parquet").write_bytes(b"x")
    error = _refused(tmp_path, Prepare("imagefolder", str(root)), "a folder of mixed formats")
    assert error.value == "dog/notes.parquet" and "--format parquet" in error.problem
    (root / "dog" / "notes.parquet").unlink()
    (root / "top.jpg").write_bytes(b"x")
    assert _refused(tmp_path, Prepare("imagefolder", str(root)), "top level").value == "top.jpg"
    data = parquet_files(tmp_path / "tables", files=1)
    (data / "extra.csv").write_text("a,b\n")
    assert _refused(tmp_path, Prepare("parquet", str(data)), "not a Parquet file").value == "extra.csv"


def test_a_corrupt_file_is_refused_by_option_naming_it(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=1, bad=("fox/bad.png",))
    spec = Prepare("imagefolder", str(root), on_bad_file="error", workers=1)
    with pytest.raises(ConfigError, match="is not a readable image") as error:
        prepare(spec, str(tmp_path / "out.lance"), progress=False)
    assert error.value.value == "fox/bad.png" and "--on-bad-file skip" in error.value.fix
    assert not (tmp_path / "out.lance").exists()  # never complete


def test_corrupt_parquet_and_tar_are_skipped_at_survey_or_refused(tmp_path: Path) -> None:
    data = parquet_files(tmp_path / "tables", files=2, rows=3)
    (data / "part-9.parquet").write_bytes(b"PAR1 not really")
    report = prepare(Prepare("parquet", str(data)), str(tmp_path / "a.lance"), progress=False)
    assert report.rows == 6 and report.skipped[0][0] == "part-9.parquet"
    _refused(tmp_path, Prepare("parquet", str(data), on_bad_file="error"), "cannot be read as parquet", "b.lance")
    shards = tar_shards(tmp_path / "shards", shards=2, per_shard=2)
    (shards / "shard-05.tar").write_bytes(b"\x00garbage" * 200)
    report = prepare(Prepare("webdataset", str(shards)), str(tmp_path / "c.lance"), progress=False)
    assert report.rows == 4 and report.skipped[0][0] == "shard-05.tar"


def test_parquet_files_of_other_schemas_name_the_file_and_column(tmp_path: Path) -> None:
    data = parquet_files(tmp_path / "tables", files=2)
    pq.write_table(pa.table({"x": ["a"], "text": ["b"]}), data / "part-2.parquet")
    error = _refused(tmp_path, Prepare("parquet", str(data)), "has another schema than part-0.parquet")
    assert error.value == "part-2.parquet" and "`x` is string" in error.problem


def test_an_input_id_column_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "t" / "a.parquet")
    _refused(tmp_path, Prepare("parquet", str(tmp_path / "t")), "already has a column named `id`")


def test_hf_folders_that_are_not_one_saved_split(tmp_path: Path) -> None:
    hf_folder(tmp_path / "dd" / "train")
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    error = _refused(tmp_path, Prepare("hf", str(tmp_path / "dd")), "DatasetDict")
    assert str(tmp_path / "dd" / "train") in error.fix
    (tmp_path / "plain").mkdir()
    _refused(tmp_path, Prepare("hf", str(tmp_path / "plain")), "no state.json")


def test_an_output_with_another_schema_or_not_ours_is_refused_untouched(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=1)
    lance.write_dataset(pa.table({"a": [1]}), tmp_path / "other.lance")
    _refused(tmp_path, Prepare("imagefolder", str(root)), "exists with another schema", "other.lance")
    assert lance.dataset(str(tmp_path / "other.lance")).version == 1
    prepare(Prepare("imagefolder", str(root)), str(tmp_path / "mine.lance"), progress=False)
    same = lance.dataset(str(tmp_path / "mine.lance")).to_table()
    lance.write_dataset(same, tmp_path / "copy.lance")
    _refused(tmp_path, Prepare("imagefolder", str(root)), "not written by lance-lightning prepare", "copy.lance")
    (tmp_path / "in2").mkdir()
    (tmp_path / "in2" / "x").mkdir()
    (tmp_path / "in2" / "x" / "a.png").write_bytes((root / "cat" / "000.png").read_bytes())
    _refused(tmp_path, Prepare("imagefolder", str(tmp_path / "in2")), "prepared from other input", "mine.lance")


def test_output_inside_input_and_bad_spec_values(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "in", per_class=1)
    with pytest.raises(ConfigError, match="inside the input"):
        prepare(Prepare("imagefolder", str(root)), str(root / "cat.lance"), progress=False)
    with pytest.raises(ConfigError, match="is not a format prepare reads") as error:
        Prepare("csv", str(root))
    assert error.value.param == "prepare.format" and "imagefolder" in error.value.fix
    with pytest.raises(ConfigError, match="integer >= 1"):
        Prepare("imagefolder", str(root), workers=0)


def test_a_data_module_source_names_its_own_fields(tmp_path: Path) -> None:
    source = LanceSource(str(tmp_path / "out.lance"), prepare=Prepare("imagefolder", str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="does not exist") as error:
        prepare_sources([source], progress=False)
    assert error.value.param == "prepare.input"
