"""Planning once per node through the user's path: a 2-rank DDP ``Trainer.fit`` (gloo, CPU) of a
filtered split trains exactly the matching rows, and the node evaluates the filter once.

The test runs this file as a DDP script (Lightning starts rank 1 from the same command). Each rank
records the ids it trained on and how its surveys went (`lance_lightning.plan.survey_cache.OUTCOMES`),
and appends a line to a counter file per filter scan it starts (the survey's ``find_matches``,
wrapped). Lance's I/O counters cannot tell the scan apart here: pinning checks the filter with a
short scan of its own, through a handle that shares the planning handle's counters (one Lance
session per dataset and process); `tests/unit/plan/test_survey_cache.py` counts bytes where they
can. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script by the test
    sys.path.insert(0, str(REPO_ROOT))

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402

from lance_lightning.plan.survey_cache import ENV_DIR, ENV_SWITCH, SUFFIX  # noqa: E402
from tests.helpers import run_ddp_script  # noqa: E402

ROWS = 200_000
FILTER = "label < 10"
BATCH = 250
WORLD = 2


def write_labels(path: Path) -> str:
    """``id``, ``x`` (float32) and ``label``: each of 0..99 on exactly 1% of the rows, in random
    order (the filter matches 20,000 rows: 40 full batches per rank, no padding)."""
    labels = np.random.default_rng(7).permutation(np.arange(ROWS, dtype=np.int32) % 100)
    ids = np.arange(ROWS, dtype=np.int64)
    table = pa.table({"id": ids, "x": (ids / ROWS).astype(np.float32), "label": labels})
    lance.write_dataset(table, str(path), max_rows_per_file=ROWS // 4)
    return str(path)


@pytest.mark.slow
def test_ddp_ranks_train_the_matching_rows_and_the_node_surveys_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = write_labels(tmp_path / "ds.lance")
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "surveys"))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    run_ddp_script(__file__, [uri, str(tmp_path)], timeout=480)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]

    dataset = lance.dataset(uri)
    expected = sorted(dataset.to_table(columns=["id"], filter=FILTER).column(0).to_pylist())
    trained = [i for rank in ranks for batch in rank["seen"] for i in batch]
    assert sorted(trained) == expected  # every matching row once, nothing else
    assert [len(rank["seen"]) for rank in ranks] == [len(expected) // (BATCH * WORLD)] * WORLD

    outcomes = [rank["outcomes"] for rank in ranks]
    assert sorted(outcomes, key=json.dumps) == [{"computed": 1}, {"loaded": 1}], outcomes
    scans = (tmp_path / "scans.txt").read_text().split()
    assert len(scans) == 1 and scans[0] in {str(rank["pid"]) for rank in ranks}  # one filter scan on the node
    assert len(list((tmp_path / "surveys").glob(f"*{SUFFIX}"))) == 1


def _ddp_main(uri: str, out_dir: str) -> None:
    import lightning.pytorch as pl

    from lance_lightning import LanceDataModule, LanceSource, RowShuffle
    from lance_lightning.plan import survey, survey_cache
    from tests.helpers import RecordingModel

    scan = survey.find_matches

    def counted(*args: Any, **kwargs: Any) -> Any:  # one line per filter scan started
        with open(Path(out_dir, "scans.txt"), "a", encoding="utf-8") as scans:
            scans.write(f"{os.getpid()}\n")
        return scan(*args, **kwargs)

    survey.find_matches = counted

    model = RecordingModel()
    source = LanceSource(uri, columns=["id", "x"], filter=FILTER)
    datamodule = LanceDataModule(train=source, batch_size=BATCH, shuffle=RowShuffle(seed=3), drop_last=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=out_dir,
    )
    trainer.fit(model, datamodule=datamodule)
    result = {"seen": model.seen, "outcomes": dict(survey_cache.OUTCOMES), "pid": os.getpid()}
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    _ddp_main(*sys.argv[1:3])
