"""`LanceDataModule.prepare_data` prepares a source with a ``prepare`` spec once, and `explain()` says so."""

from __future__ import annotations

from pathlib import Path

from lance_lightning.datamodule import LanceDataModule
from lance_lightning.source import LanceSource, Prepare
from tests.unit.write.inputs import image_folder


def _module(tmp_path: Path, root: Path) -> LanceDataModule:
    spec = Prepare("imagefolder", str(root), unit_files=4)
    uri = str(tmp_path / "images.lance")
    return LanceDataModule(
        train=LanceSource(uri, columns=["image", "label"], filter="label < 2", prepare=spec),
        val=LanceSource(uri, columns=["image", "label"], filter="label = 2", prepare=spec),
        batch_size=2,
    )


def test_prepare_data_prepares_once_and_explain_says_so(tmp_path: Path, capsys) -> None:
    root = image_folder(tmp_path / "in", per_class=2)
    module = _module(tmp_path, root)
    module.prepare_data()
    assert "images.lance prepared from imagefolder" in capsys.readouterr().err  # the closing report, once
    module.setup("fit")
    text = module.explain("train")
    assert "images.lance prepared from imagefolder" in text and "6 rows in 2 units" in text
    assert "images.lance prepared" in module.explain("val")
    again = _module(tmp_path, root)
    again.prepare_data()
    assert "is already complete" in again.explain("train")
    assert len(list(again.train_dataloader())) == 2  # 4 rows of labels 0 and 1, batches of 2


def test_sources_without_a_spec_prepare_nothing(tmp_path: Path) -> None:
    from tests.helpers import write_dataset

    module = LanceDataModule(train=LanceSource(write_dataset(tmp_path / "ds.lance", 16)), batch_size=4)
    module.prepare_data()
    assert module.prepared == {} and "prepared" not in module.explain("train")


def test_a_mixtures_sources_are_prepared_once_per_uri(tmp_path: Path) -> None:
    from lance_lightning.plan.mixture import LanceMixture
    from lance_lightning.write import prepare_sources
    from tests.unit.write.inputs import parquet_files

    sources = [
        LanceSource(str(tmp_path / f"{name}.lance"), prepare=Prepare("parquet", str(parquet_files(tmp_path / name))))
        for name in ("a", "b")
    ]
    lines = prepare_sources([LanceMixture(sources, [1, 1]), sources[0]], progress=False)
    assert sorted(lines) == [sources[0].uri, sources[1].uri]
    assert all("prepared from parquet" in line for line in lines.values())
