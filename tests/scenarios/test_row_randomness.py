"""A run with a per-row random transform, interrupted and resumed through ``Trainer.fit(ckpt_path=...)``
with another number of worker processes or another world size, draws for every row exactly what the
uninterrupted run drew; every row names the same row address and epoch position as well."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ckpt_file
from tests.helpers import run_ddp_script, write_dataset
from tests.row_random_worker import fit_draws

ROWS = 192  # 12 steps of 16 rows on one rank, 6 of 2 x 16 on two: no tail on either
BATCH = 16
STOP = 4  # the interrupted run stops (and checkpoints) after this many steps of epoch 0
EPOCHS = 2
SHUFFLE = "row:5"

#: One trained row: (epoch, epoch position) -> (id, row address, draw, flipped).
Draws = dict[tuple[int, int], tuple[int, int, float, bool]]


def by_position(records: list[list[Any]]) -> Draws:
    out: Draws = {}
    for epoch, position, row_id, address, draw, flipped in records:
        key = (epoch, position)
        assert key not in out, f"epoch {epoch} position {position} trained twice"
        out[key] = (row_id, address, draw, flipped)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run and the interrupted one (one rank, in-process threads)."""
    root = tmp_path_factory.mktemp("draws")
    uri = write_dataset(root / "ds.lance", ROWS, fragment_rows=50)
    base = {"uri": uri, "root": str(root), "shuffle": SHUFFLE, "batch_size": BATCH, "max_epochs": EPOCHS}
    _, whole = fit_draws({**base, "name": "whole", "num_workers": 0})
    _, stopped = fit_draws({**base, "name": "stop", "num_workers": 0, "max_steps": STOP, "ckpt_every": STOP})
    return {"base": base, "root": root, "whole": by_position(whole), "stopped": by_position(stopped)}


def check_resumed(runs: dict[str, Any], resumed: Draws) -> None:
    whole, stopped = runs["whole"], runs["stopped"]
    assert len(whole) == EPOCHS * ROWS
    assert len(stopped) == STOP * BATCH and set(stopped) == {(0, p) for p in range(STOP * BATCH)}
    assert not set(stopped) & set(resumed), "a row trained before the checkpoint was trained again"
    assert {**stopped, **resumed} == whole  # same rows, addresses, draws and flips at every position
    assert 0.3 < sum(flipped for *_, flipped in whole.values()) / len(whole) < 0.7


def test_resume_with_worker_processes_repeats_every_draw(runs: dict[str, Any]) -> None:
    _, resumed = fit_draws(
        {
            **runs["base"],
            "name": "resume_workers",
            "num_workers": 2,
            "ckpt_path": str(ckpt_file(runs["root"], "stop", STOP)),
        }
    )
    check_resumed(runs, by_position(resumed))


def test_resume_on_two_ranks_repeats_every_draw(runs: dict[str, Any]) -> None:
    root: Path = runs["root"]
    out = root / "ddp"
    spec = {
        **runs["base"],
        "name": "resume_ddp",
        "num_workers": 0,
        "devices": 2,
        "ckpt_path": str(ckpt_file(root, "stop", STOP)),
        "out": str(out),
    }
    spec_path = root / "ddp_spec.json"
    spec_path.write_text(json.dumps(spec))
    run_ddp_script("tests/row_random_worker.py", [str(spec_path)], timeout=300)
    ranks = [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) > 0
    check_resumed(runs, by_position(ranks[0] + ranks[1]))
