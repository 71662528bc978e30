"""The shipped round trip, through the real command line: ``lance-lightning predict --config
configs/digits_embed.yaml`` writes a 32-float ``embedding`` into every row of ``data/digits.lance``
(a progress bar, then one closing line), a rerun writes nothing and names the version, and
``configs/digits_from_embedding.yaml`` trains a classifier on that column."""

from __future__ import annotations

import sys
from pathlib import Path

import lance
import numpy as np
import pytest

from tests import zygote
from tests.harness import REPO_ROOT, subprocess_env


def _cli(cwd: Path, *args: str) -> str:
    """``lance-lightning ARGS`` in a subprocess, forked from the test zygote (`tests.zygote`: the
    process a fresh start gives, less the imports)."""
    proc = zygote.run(
        [sys.executable, "-m", "lance_lightning.cli", *args], cwd=cwd, env=subprocess_env(), text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_digits_embed_then_train_on_the_embedding(tmp_path: Path) -> None:
    from examples.digits import prepare

    prepare(str(tmp_path / "data" / "digits.lance"))
    embed = str(REPO_ROOT / "configs" / "digits_embed.yaml")
    out = _cli(tmp_path, "predict", "--config", embed, "--trainer.enable_progress_bar=true")
    assert "Predicting DataLoader 0: 100%" in out
    assert "prediction writer: wrote column(s) embedding of data/digits.lance: 1797 rows" in out
    dataset = lance.dataset(str(tmp_path / "data" / "digits.lance"))
    assert dataset.version == 2 and dataset.schema.field("embedding").type.list_size == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"], "the run left files outside its dataset"
    vectors = np.stack(dataset.to_table(columns=["embedding"])["embedding"].to_numpy(zero_copy_only=False))
    assert vectors.shape == (1797, 32) and np.isfinite(vectors).all() and vectors.std() > 0

    again = _cli(tmp_path, "predict", "--config", embed)
    assert "nothing to write: column(s) embedding of data/digits.lance are in version 2" in again
    assert lance.dataset(str(tmp_path / "data" / "digits.lance")).version == 2

    train = str(REPO_ROOT / "configs" / "digits_from_embedding.yaml")
    _cli(tmp_path, "fit", "--config", train, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false")
