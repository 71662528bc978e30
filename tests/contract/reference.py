"""The reference run: each epoch's sequence of units it trained, checked against `truth`.

Guarantees (each failure is one line of `sequences`' result, naming the epoch):
- Each epoch of the reference run holds exactly the units `truth` computes: each matching row (or
  window) once, in storage order under `NoShuffle`.
- A mixture's draws obey the documented rules: counts per whole block (under a schedule, those
  `truth.scheduled_counts` gives); a source's draws in its own order under `NoShuffle`, else no
  repeat within a pass through the source.
- A row shuffle orders each epoch anew.
- With clips, a unit is a clip keyed by its video and start frame: each epoch holds exactly the
  clips `truth` computes for that epoch (every matching video ``clips_per_item`` times, each clip at
  the start its (seed, epoch, unit) gives), in unit order under `NoShuffle`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from tests.contract import truth
from tests.contract.runner import Phase
from tests.contract.scenario import Scenario


def sequences(scenario: Scenario, phase: Phase) -> tuple[list[list[int]], list[str]]:
    """The reference run's sequence of units per data epoch, and what they got wrong."""
    by_epoch: dict[int, list[int]] = {}
    for event in phase.events("batch"):
        by_epoch.setdefault(event["epoch"], []).extend(event["units"])
    seqs = [by_epoch.get(e, []) for e in range(scenario.data_epochs + 1)]
    sources = [truth.source_units(scenario, j) for j in range(len(scenario.sources))]
    failures: list[str] = []
    for epoch, seq in enumerate(seqs):
        if scenario.clips is not None and epoch:  # a clip's key holds its start: the epoch's own
            sources = [truth.source_units(scenario, j, epoch) for j in range(len(scenario.sources))]
        if scenario.mixture is None:
            failures += _plain_sequence_failures(scenario, epoch, seq, sources[0])
        else:
            failures += _mixture_sequence_failures(scenario, epoch, seq, sources)
    shuffle = scenario.shuffle
    clumps = min(len(sources[j]) for j in _drawn(scenario)) // shuffle.clump_rows
    orders = seqs[:2]
    if scenario.clips is not None:  # clips' starts change with the epoch: compare the units' videos
        orders = [[key // truth.CLIP_KEY for key in seq] for seq in orders]
    if shuffle.kind == "row" and len(seqs[0]) >= 8 * shuffle.clump_rows and clumps >= 8 and orders[0] == orders[1]:
        failures.append("reference: epochs 0 and 1 of a row shuffle have the same order")
    return seqs, failures


def _drawn(scenario: Scenario) -> list[int]:
    """The sources an epoch draws from: every source, or a mixture's with a weight above 0 in a
    stage (a source of one clump keeps its order, whatever the epoch)."""
    mixture = scenario.mixture
    if mixture is None:
        return [0]
    stages = [stage["weights"] for stage in mixture.schedule] if mixture.schedule else [mixture.weights]
    return [j for j in range(len(mixture.sources)) if any(weights[j] > 0 for weights in stages)]


def _plain_sequence_failures(scenario: Scenario, epoch: int, seq: list[int], units: np.ndarray) -> list[str]:
    if scenario.shuffle.kind == "none":
        if seq != units.tolist():
            return [f"reference epoch {epoch}: NoShuffle order differs from storage order: {_diff(seq, units)}"]
    elif sorted(seq) != sorted(units.tolist()):
        return [f"reference epoch {epoch}: not each unit once: {_diff(sorted(seq), np.sort(units))}"]
    return []


def _mixture_sequence_failures(scenario: Scenario, epoch: int, seq: list[int], sources: list[np.ndarray]) -> list[str]:
    mixture = scenario.mixture
    counts = truth.block_counts(mixture.weights, mixture.block) if mixture.schedule is None else []
    expected = truth.epoch_units(scenario)
    where = f"reference epoch {epoch} (mixture)"
    if len(seq) != expected:
        return [f"{where}: {len(seq)} draws, the epoch rule gives {expected}"]
    array = np.asarray(seq, dtype=np.int64)
    source = array // truth.BIG
    scheduled = truth.scheduled_counts(mixture, epoch) if mixture.schedule is not None else None
    for block in range(len(seq) // mixture.block):
        if scheduled is not None:  # the counts scheduled at the block's first sample
            counts = scheduled[block]
        got = np.bincount(source[block * mixture.block : (block + 1) * mixture.block], minlength=len(counts))
        if got.tolist() != counts:
            return [f"{where}: block {block} holds {got.tolist()} draws per source, not {counts}"]
    failures = []
    for j, units in enumerate(sources):
        draws = array[source == j]
        n = len(units)
        if scenario.shuffle.kind == "none":
            want = np.resize(units, len(draws))
            if not np.array_equal(draws, want):
                failures.append(f"{where}: source {j}'s draws are not its storage order: {_diff(draws.tolist(), want)}")
            continue
        members = set(units.tolist())
        for first in range(0, len(draws), n):
            chunk = draws[first : first + n].tolist()
            if len(set(chunk)) != len(chunk) or not set(chunk) <= members:
                repeats = [u for u, c in Counter(chunk).items() if c > 1][:5]
                failures.append(f"{where}: source {j}'s pass {first // n} repeats or strays: repeated {repeats}")
                break
    return failures


def _diff(got: list[int], want: np.ndarray | list[int]) -> str:
    want = list(want)
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"first difference at {i}: {a} vs {b} ({len(got)} vs {len(want)} units)"
    return f"{len(got)} vs {len(want)} units"
