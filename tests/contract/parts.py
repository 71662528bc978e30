"""Issue #50's parts of a scenario: ``prepare`` of raw files, the prediction writer, clips over the
media corpus, each drawn from a random stream of its own and checked against its own oracle.

Guarantees:
- `draw_parts` adds each part to a generated scenario with its own stream (``f"{seed}-ingest"``,
  ``-writing``, ``-media``), so every draw made before stays as it was (and every case written
  before reads and writes the same line).
- `run_parts` runs the scenario's parts, each in its own folder under ``root``, and returns their
  failures (`tests.contract.prepare_draws.run_ingest`, `tests.contract.writer_draws.run_writing`,
  `tests.contract.media_draws.run_media`); `tests.contract.oracle.check` reports them with the fit's.
  A prepare from S3 uses the started server ``s3`` where one is given (the soak's), else its own.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.contract.scenario import Scenario
    from tests.s3_server import S3Server

#: The share of generated scenarios that draws each part.
SHARE = {"ingest": 0.15, "writing": 0.15, "media": 0.15}


def draw_parts(seed: int, scenario: Scenario) -> Scenario:
    from tests.contract.media_draws import draw_media
    from tests.contract.prepare_draws import draw_ingest
    from tests.contract.writer_draws import draw_writing

    draws = {"ingest": draw_ingest, "writing": draw_writing, "media": draw_media}
    for name, draw in draws.items():
        rng = random.Random(f"{seed}-{name}")
        if rng.random() < SHARE[name]:
            scenario = replace(scenario, **{name: draw(rng)})
    return scenario


def run_parts(scenario: Scenario, root: Path, s3: S3Server | None = None) -> list[str]:
    from tests.contract.media_draws import run_media
    from tests.contract.prepare_draws import run_ingest
    from tests.contract.writer_draws import run_writing

    failures: list[str] = []
    if scenario.ingest is not None:
        failures += run_ingest(scenario.ingest, root / "ingest", s3)
    if scenario.writing is not None:
        failures += run_writing(scenario.writing, root / "writing")
    if scenario.media is not None:
        failures += run_media(scenario.media, root / "media")
    return failures
