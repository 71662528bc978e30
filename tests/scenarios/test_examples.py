"""The shipped examples run: each one's ``prepare`` step, then ``lance-lightning fit`` on its config.

Every run works in ``tmp_path`` (the configs' relative ``runs/`` paths land there; the dataset path
is given as an absolute override), trains a few real steps on the real prepared data with the
shipped YAML, and must leave a
checkpoint whose data cursor counts the trained steps, logged metrics in TensorBoard event files,
and a training loss that went down. The image example (``configs/quickstart.yaml``) is run by
``tests/scenarios/test_cli.py``.
"""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np
import pytest
import torch

from tests.helpers import assert_one_saved_cursor, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"


def _scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert tag in events.Tags()["scalars"], (tag, events.Tags()["scalars"])
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _fit(config: Path, run: str, uri: str, *overrides: str) -> tuple[dict, Path]:
    """Fit ``config`` on the dataset at ``uri`` from the current directory; return (last checkpoint,
    TensorBoard dir)."""
    code, out, _ = run_cli(
        [
            "fit",
            "--config",
            str(config),
            f"--data.train.uri={uri}",
            f"--data.val.uri={uri}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.accelerator=cpu",
            *overrides,
        ]
    )
    assert code == 0, out
    log_dir = Path("runs") / run / "tensorboard" / "version_0"
    last = log_dir / "checkpoints" / "last.ckpt"
    assert last.is_file(), out
    assert "Data loading report" in out, "DataLoadingMonitor printed no report"
    assert f"--ckpt_path {last}" in out  # relative to the directory the fit was started in
    return torch.load(last, weights_only=True), log_dir


def _assert_trained(checkpoint: dict, log_dir: Path, steps: int, split_filter: str) -> None:
    assert checkpoint["global_step"] == steps
    cursor = checkpoint["LanceDataModule"]["train_cursor"]
    assert cursor["steps"] == steps and cursor["plan"]["filter"] == split_filter
    assert_one_saved_cursor(checkpoint)
    losses = [value for _, value in _scalars(log_dir, "train/loss")]
    assert len(losses) >= 3 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < losses[0], f"training loss did not go down: {losses}"
    assert _scalars(log_dir, "val/loss"), "no validation ran"
    assert _scalars(log_dir, "data/rows_per_s"), "DataLoadingMonitor logged nothing"


@pytest.mark.slow
def test_lm_pretrain_prepares_stdlib_tokens_and_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from examples import lm_pretrain

    monkeypatch.chdir(tmp_path)
    assert lm_pretrain._main(["data/stdlib_tokens.lance", "--max-files", "40"]) == 0
    printed = capsys.readouterr().out
    assert "train:" in printed and "val:" in printed
    dataset = lance.dataset("data/stdlib_tokens.lance")
    table = dataset.to_table()
    assert str(table.schema.field("tokens").type) == "list<item: int32>"
    first_path = table["path"][0].as_py()
    chunks = sorted((row["chunk"], bytes(row["tokens"])) for row in table.to_pylist() if row["path"] == first_path)
    root, _ = lm_pretrain.stdlib_files()
    assert b"".join(tokens for _, tokens in chunks) == (root / first_path).read_bytes(), "tokens are not the bytes"
    assert max(table["n_tokens"].to_pylist()) <= lm_pretrain.CHUNK_BYTES
    assert set(table["split"].to_pylist()) == {"train", "val"}

    steps = 12
    checkpoint, log_dir = _fit(
        CONFIGS / "lm_pretrain.yaml",
        "lm_pretrain",
        str(tmp_path / "data/stdlib_tokens.lance"),
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=6",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=2",
    )
    _assert_trained(checkpoint, log_dir, steps, "split = 'train'")
    assert _scalars(log_dir, "val/bits_per_byte")


def test_tabular_prepares_indexed_embeddings_and_trains_on_the_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples import tabular

    monkeypatch.chdir(tmp_path)
    tabular.prepare("data/embeddings.lance", rows=8000)
    dataset = lance.dataset("data/embeddings.lance")
    indexed = {name for index in dataset.describe_indices() for name in index.field_names}
    assert indexed >= {"source", "split", "quality"}
    train_filter = "split = 'train' AND quality >= 0.3"
    matched = dataset.count_rows(filter=train_filter)
    assert 0.5 * 0.8 * 8000 < matched < 0.9 * 0.8 * 8000

    steps = 15
    checkpoint, log_dir = _fit(
        CONFIGS / "tabular.yaml",
        "tabular",
        str(tmp_path / "data/embeddings.lance"),
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=5",
        "--trainer.log_every_n_steps=3",
    )
    _assert_trained(checkpoint, log_dir, steps, train_filter)
    assert checkpoint["LanceDataModule"]["train_cursor"]["plan"]["rows"] == matched
    assert checkpoint["LanceDataModule"]["train_cursor"]["plan"]["shuffle"]["strategy"] == "ShardShuffle"
