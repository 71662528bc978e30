"""Real DDP: 2 CPU processes (gloo) through ``Trainer.fit(strategy="ddp")``.

One subprocess launch (``tests/ddp_worker.py``) fits every configuration in turn; Lightning
re-launches the script for rank 1. Each rank records the ids it trained on. Checked per
configuration and epoch: equal step counts, the exact planned batches on each rank, disjoint
ranks, the union is the epoch minus the documented tail, and nothing hangs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lance_lightning import NoShuffle
from lance_lightning.source import pin_source
from tests import ddp_worker
from tests.helpers import plan_of, run_ddp_script, write_dataset

ROWS = 250
TIMEOUT_S = 480


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, float]:
    """Launch the DDP script once for every configuration, in its own session, rank 0 forked from
    the test zygote and rank 1 from its spare (`tests.helpers.run_ddp_script`); return (uri, out dir,
    seconds)."""
    root = tmp_path_factory.mktemp("ddp")
    uri = write_dataset(root / "ds.lance", ROWS, fragment_rows=64)
    out = root / "out"
    out.mkdir()
    started = time.perf_counter()
    output = run_ddp_script("tests/ddp_worker.py", [str(out), uri], timeout=TIMEOUT_S)
    seconds = time.perf_counter() - started
    print(output[-3000:])
    return uri, out, seconds


def load(out: Path, name: str) -> list[dict]:
    records = []
    for rank in range(ddp_worker.WORLD_SIZE):
        path = out / f"{name}.rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no record for {name}"
        records.append(json.loads(path.read_text()))
    return records


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ddp_worker.CONFIGS))
def test_ddp_ranks_train_disjoint_equal_shares_of_the_epoch(ddp_run: tuple[str, Path, float], name: str) -> None:
    uri, out, _ = ddp_run
    records = load(out, name)
    W = ddp_worker.WORLD_SIZE
    config = ddp_worker.CONFIGS[name]
    assert [r["rank"] for r in records] == list(range(W))
    assert all(r["world_size"] == W for r in records)
    # Only rank 0 prints the plan, so only rank 0 builds its text.
    assert [r["explained"] for r in records] == [["train"]] + [[]] * (W - 1)
    # The node evaluates the filter once (the survey cache: one rank scans, the others load its
    # result), in a child process where the configuration says so.
    in_child = name in ddp_worker.FILTER_IN_CHILD
    assert sum(r["child_scans"] for r in records) == (1 if in_child else 0)

    # The plan every rank used, rebuilt here: the expected rows come from the pure plan layers.
    datamodule = ddp_worker.make_datamodule(uri, name)
    source = pin_source(datamodule.sources["train"], "train")
    plan = plan_of(
        "train", source, datamodule.shuffle, datamodule.filter_read, ddp_worker.BATCH_SIZE, config["drop_last"]
    )
    ids = np.arange(ROWS)
    if config["filter"] is not None:
        table = source.open().to_table(columns=["id"], filter=config["filter"])
        ids = table.column("id").to_numpy()
    assert plan.matched_rows == len(ids)
    layout = plan.layout(W)
    assert layout.steps > 0

    orders = []
    for epoch in range(ddp_worker.MAX_EPOCHS):
        per_rank = []
        for record in records:
            steps = [ids_ for ids_, e in zip(record["seen"], record["seen_epochs"]) if e == epoch]
            per_rank.append(steps)
        # Both ranks ran the same number of steps, the planned number.
        assert [len(s) for s in per_rank] == [layout.steps] * W, f"epoch {epoch}"
        assert all(r["num_training_batches"] == layout.steps for r in records)
        # Each rank trained on exactly its planned batches, in order.
        order = plan.order(epoch)
        for rank, steps in enumerate(per_rank):
            expected = [ids[order.matched_indices(layout.batch_rows(rank, s))].tolist() for s in range(layout.steps)]
            assert steps == expected, f"rank {rank}, epoch {epoch}"
        # Disjoint ranks; their union is the epoch minus the documented tail.
        rank_sets = [Counter(i for batch in steps for i in batch) for steps in per_rank]
        union = sum(rank_sets, Counter())
        if config["drop_last"]:
            assert max(union.values()) == 1, "a row was trained twice in one epoch"
            assert len(union) == len(ids) - layout.dropped_rows
            assert layout.dropped_rows < W * ddp_worker.BATCH_SIZE
        else:
            assert set(union) == set(ids.tolist())
            assert sum(union.values()) == len(ids) + layout.repeated_rows
        sets = [set(c) for c in rank_sets]
        overlap = set.intersection(*sets)
        assert len(overlap) <= layout.repeated_rows, f"ranks shared rows {sorted(overlap)}"
        orders.append([i for step in zip(*per_rank) for batch in step for i in batch])
    if isinstance(config["shuffle"], NoShuffle):
        assert orders[0] == orders[1] == ids[: len(orders[0])].tolist()
    else:
        assert orders[0] != orders[1], "the shuffled order did not change between epochs"


@pytest.mark.slow
def test_ddp_run_finishes_in_time(ddp_run: tuple[str, Path, float]) -> None:
    _, out, seconds = ddp_run
    assert seconds < TIMEOUT_S
    for name in ddp_worker.CONFIGS:
        for record in load(out, name):
            assert record["global_step"] == len(record["seen"])
