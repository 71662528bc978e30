"""Bad inputs and faults through ``lance-lightning`` in a subprocess: each ends on one screen.

Each case checks the exit status (1 for a configuration or data error, 2 for a parser error), that
nothing looks like a traceback, that the error fits on one screen, and that it names what the user
has to fix (the parameter, the value). The cases, by group:

- a mixture given in YAML with a bad value: the field inside the mixture is named;
- a plain source with a value of the wrong type: named as a `LanceSource` field;
- sources that cannot be read (no dataset, a filter matching nothing);
- ``--ckpt_path`` that is missing, empty, truncated, random bytes, or a checkpoint with an edited
  Lightning version (not a version, or an older one than its contents), a cursor replaced by a
  string or a step count edited to text;
- output directories that cannot be written;
- errors raised while reading, in the training process and in DataLoader worker processes (a
  null, a row the transform cannot decode, the pinned version's files deleted mid-run).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path

import lance
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning import LanceDataModule, LanceSource
from tests.helpers import RecordingModel, encode_image, write_dataset
from tests.reliability.helpers import ONE_SCREEN_LINES, error_screen, run_command, write_config

pytestmark = pytest.mark.slow


def _assert_one_screen(code: int, output: str, expected_code: int, fragments: list[str]) -> None:
    screen = error_screen(output)
    assert code == expected_code, f"exit {code}, expected {expected_code}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    assert len(screen) <= ONE_SCREEN_LINES, "\n".join(screen)
    text = "\n".join(screen)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("one_screen") / "ds.lance", 120)


# -- configuration values ------------------------------------------------------------------------
def _mixture(uri: str, arguments: str) -> str:
    return f"""  train:
    class_path: lance_lightning.LanceMixture
    init_args:
      sources:
        - {{uri: {uri}, columns: [id, x]}}
        - {{uri: {uri}, columns: [id, x], filter: "label < 5"}}
{arguments}"""


CONFIG_CASES: dict[str, tuple[Callable[[str], str], int, list[str]]] = {
    "mixture weight 0": (lambda u: _mixture(u, "      weights: [0, 1]\n"), 1, ["data.train.weights[0]", "0.0"]),
    "mixture weight -1": (lambda u: _mixture(u, "      weights: [-1, 1]\n"), 1, ["data.train.weights[0]", "-1"]),
    "mixture weight nan": (lambda u: _mixture(u, "      weights: [.nan, 1]\n"), 1, ["data.train.weights[0]", "nan"]),
    "mixture one weight for two sources": (lambda u: _mixture(u, "      weights: [1]\n"), 1, ["data.train.weights"]),
    "mixture names twice": (
        lambda u: _mixture(u, "      weights: [1, 1]\n      names: [a, a]\n"),
        1,
        ["data.train.names", "['a', 'a']"],
    ),
    "mixture block 0": (lambda u: _mixture(u, "      weights: [1, 1]\n      block: 0\n"), 1, ["data.train.block"]),
    "mixture samples rule without samples": (
        lambda u: _mixture(u, "      weights: [1, 1]\n      epoch: samples\n"),
        1,
        ["data.train.samples"],
    ),
    "source columns as a string": (lambda u: f"  train: {{uri: {u}, columns: id}}\n", 2, ["LanceSource", "columns"]),
    "source version as text": (lambda u: f"  train: {{uri: {u}, version: latest}}\n", 2, ["LanceSource", "version"]),
    "source storage_options as a list": (
        lambda u: f"  train: {{uri: {u}, storage_options: [a, b]}}\n",
        2,
        ["LanceSource", "storage_options"],
    ),
    "a filter matching nothing": (lambda u: f'  train: {{uri: {u}, filter: "id < 0"}}\n', 1, ["train.filter"]),
    "no dataset at the path": (lambda u: f"  train: {{uri: {u}.missing}}\n", 1, ["train.uri", "no Lance dataset"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_bad_value_is_one_screen(case: str, uri: str, tmp_path: Path) -> None:
    data, expected_code, fragments = CONFIG_CASES[case]
    code, output = run_command(["fit", "--config", str(write_config(tmp_path, data(uri)))])
    _assert_one_screen(code, output, expected_code, fragments)


# -- checkpoint files ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_checkpoint(uri: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good_checkpoint")
    dm = LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10)
    trainer = pl.Trainer(
        max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(RecordingModel(), datamodule=dm)
    path = root / "good.ckpt"
    trainer.save_checkpoint(path)
    return path


def _edited(good: Path, target: Path, edit: Callable[[dict], None]) -> None:
    state = copy.deepcopy(torch.load(good, weights_only=True))
    edit(state)
    torch.save(state, target)


def _cursor(state: dict) -> dict:
    return state["LanceDataModule"]["train_cursor"]


CHECKPOINT_CASES: dict[str, tuple[Callable[[Path, Path], None], list[str]]] = {
    "no such file": (lambda good, path: None, ["ckpt_path", "no such file"]),
    "an empty file": (lambda good, path: path.write_bytes(b""), ["ckpt_path", "cannot be loaded"]),
    "a truncated checkpoint": (
        lambda good, path: path.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
        ["ckpt_path", "cannot be loaded"],
    ),
    "random bytes": (lambda good, path: path.write_bytes(os.urandom(4096)), ["ckpt_path", "cannot be loaded"]),
    "an edited Lightning version": (
        lambda good, path: _edited(good, path, lambda s: s.__setitem__("pytorch-lightning_version", "garbage")),
        ["ckpt_path", "'garbage'"],
    ),
    "a Lightning version edited to an older one": (  # Lightning's migration would end in a bare KeyError
        lambda good, path: _edited(good, path, lambda s: s.__setitem__("pytorch-lightning_version", "0.0.1")),
        ["ckpt_path", "bad.ckpt", "`pytorch-lightning_version` says '0.0.1'", "edited or damaged"],
    ),
    "a cursor replaced by a string": (
        lambda good, path: _edited(good, path, lambda s: s["LanceDataModule"].__setitem__("train_cursor", "abc")),
        ["checkpoint train_cursor", "'abc'"],
    ),
    "a step count edited to text": (
        lambda good, path: _edited(good, path, lambda s: _cursor(s).__setitem__("steps", "four")),
        ["checkpoint train_cursor.steps", "'four'"],
    ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_bad_checkpoint_is_one_screen(case: str, uri: str, good_checkpoint: Path, tmp_path: Path) -> None:
    make, fragments = CHECKPOINT_CASES[case]
    path = tmp_path / "bad.ckpt"
    make(good_checkpoint, path)
    config = write_config(tmp_path, f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 10\n")
    code, output = run_command(["fit", "--config", str(config), "--ckpt_path", str(path)])
    _assert_one_screen(code, output, 1, fragments)


# -- output directories --------------------------------------------------------------------------
def test_an_output_directory_that_cannot_be_made_is_one_screen(uri: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    trainer = (
        "  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        f"      init_args: {{dirpath: {blocker / 'ckpts'}}}\n"
    )
    config = write_config(tmp_path, f"  train: {{uri: {uri}, columns: [id, x]}}\n", trainer=trainer)
    code, output = run_command(["fit", "--config", str(config)])
    _assert_one_screen(code, output, 1, ["ModelCheckpoint.dirpath", "cannot be written"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_log_directory_is_one_screen(uri: str, tmp_path: Path) -> None:
    logs = tmp_path / "root"
    logs.mkdir()
    logs.chmod(0o555)
    try:
        config = write_config(tmp_path, f"  train: {{uri: {uri}, columns: [id, x]}}\n")
        code, output = run_command(["fit", "--config", str(config)])
        _assert_one_screen(code, output, 1, ["trainer.default_root_dir", "cannot be written"])
    finally:
        logs.chmod(0o755)


# -- errors raised while reading, also in worker processes ---------------------------------------------
def _nulls(root: Path) -> str:
    uri = str(root / "nulls.lance")
    x = pa.array([None if i == 37 else float(i) for i in range(100)], pa.float32())
    lance.write_dataset(pa.table({"id": pa.array(np.arange(100)), "x": x}), uri)
    return f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 10\n"


def _bad_image(root: Path) -> str:
    uri = str(root / "images.lance")
    good = encode_image(torch.zeros(1, 4, 4, dtype=torch.uint8), "png")
    images = [b"not an image" if i == 13 else good for i in range(40)]
    x = pa.array(np.zeros(40, dtype=np.float32))
    lance.write_dataset(pa.table({"id": pa.array(np.arange(40)), "x": x, "image": pa.array(images, pa.binary())}), uri)
    transform = "  transform:\n    class_path: lance_lightning.transforms.DecodeImage\n    init_args: {column: image}\n"
    return f"  train: {{uri: {uri}, columns: [id, x, image]}}\n  batch_size: 10\n{transform}"


def _files_deleted(root: Path) -> tuple[str, str]:
    uri = write_dataset(root / "vanishing.lance", 2000, fragment_rows=200)
    data = (
        f"  train: {{uri: {uri}, columns: [id, x]}}\n  batch_size: 10\n  prefetch_groups: 1\n"
        "  shuffle:\n    class_path: lance_lightning.RowShuffle\n"
        "  retry:\n    class_path: lance_lightning.RetryPolicy\n    init_args: {attempts: 1}\n"
    )
    trainer = (
        "  max_steps: 150\n  callbacks:\n    - class_path: tests.reliability.helpers.DeleteDataAt\n"
        f"      init_args: {{uri: {uri}, batch: 2}}\n"
    )
    return data, trainer


READ_CASES: dict[str, tuple[Callable[[Path], str | tuple[str, str]], list[str]]] = {
    "a null without fill_nulls": (_nulls, ["column 'x'", "fill_nulls"]),
    "a row the transform cannot decode": (_bad_image, ["BadRowError", "dataset row 13", "'image'"]),
    "the pinned version's files deleted mid-run": (_files_deleted, ["DataReadError", "vanishing.lance"]),
}


@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "workers"])
@pytest.mark.parametrize("case", list(READ_CASES))
def test_an_error_while_reading_is_one_screen(case: str, num_workers: int, tmp_path: Path) -> None:
    make, fragments = READ_CASES[case]
    made = make(tmp_path)
    data, trainer = made if isinstance(made, tuple) else (made, "")
    config = write_config(tmp_path, data + f"  num_workers: {num_workers}\n", trainer=trainer)
    code, output = run_command(["fit", "--config", str(config)])
    _assert_one_screen(code, output, 1, fragments)
