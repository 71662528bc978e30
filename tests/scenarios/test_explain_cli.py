"""``lance-lightning explain --config``: each split's plan from a fit config, in a subprocess, nothing
trained or written; an unknown subcommand lists every subcommand."""

from __future__ import annotations

from pathlib import Path

import lance

from tests.helpers import run_cli_process, write_dataset

ROWS, BATCH = 400, 16


def _config(tmp_path: Path, uri: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""\
trainer:
  accelerator: cpu
  devices: 2
  max_steps: 3
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, columns: [id, x], filter: "label < 5", version: release-1}}
  val: {{uri: {uri}, columns: [id, x], filter: "label >= 5"}}
  batch_size: {BATCH}
"""
    )
    return config


def test_explain_prints_every_split_without_training(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", ROWS, fragment_rows=100)
    lance.dataset(uri).tags.create("release-1", 1)
    config = _config(tmp_path, uri)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out = run_cli_process(["explain", "--config", str(config)], cwd=tmp_path)
    assert code == 0, out
    assert f"split 'train': {uri} @ version 1 (tag release-1)" in out, out
    assert f"split 'val': {uri} @ version 1," in out, out
    # the config's trainer has 2 devices: 200 matching rows / 2 ranks / 16 = 7 batches (the last padded)
    assert f"batches: 7 per rank x 2 rank(s), batch_size {BATCH}" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "explain wrote something"

    code, out = run_cli_process(["explain", "--config", str(config), "--split", "val", "--world_size", "1"], tmp_path)
    assert code == 0 and "split 'train'" not in out and "x 1 rank(s)" in out, out


def test_explain_names_a_split_the_config_lacks(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", ROWS, fragment_rows=100)
    lance.dataset(uri).tags.create("release-1", 1)
    code, out = run_cli_process(["explain", "--config", str(_config(tmp_path, uri)), "--split", "test"], tmp_path)
    assert code == 1 and "parameter: split" in out and "that split is not configured" in out, out
    assert len(out.strip().splitlines()) <= 6, out


def test_an_unknown_subcommand_lists_every_subcommand(tmp_path: Path) -> None:
    code, out = run_cli_process(["explian"], tmp_path)
    assert code == 2, out
    for name in ("fit", "validate", "test", "predict", "profile", "materialize", "holds", "prepare", "explain"):
        assert name in out, out
    assert len(out.strip().splitlines()) == 1, out
