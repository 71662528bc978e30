"""Video clips in a scenario's runs (`tests.contract.scenario.Clips`): each trained clip is the clip
its unit names, and the starts follow the documented rule.

A clip's unit key (`tests.contract.truth`) is its video's ``id`` and its start frame: the oracle
checks, through the keys, that each data epoch trains exactly the clips `truth` computes for it
(nothing lost, nothing repeated, the same order as the uninterrupted run across a resume on any
world size, worker count or batch size). This module checks what a key alone does not say.

Guarantees (each failure is one line of `check_clips`' result):
- `check_clips` (part of `tests.contract.oracle.check`): in every phase, every trained clip (the
  ``clips`` entry of a batch event: its frames' CRC-32, ``_clip_row`` and frame times) is the clip
  of its key: frame ``start + i * frame_step`` for ``i < frames``, inside the video
  (``start <= n - span``, the stored video decoding to its ``n`` frames); times
  ``(start + i * frame_step) / FPS`` (within 1 microsecond); frames equal to a decode of the whole
  stored video from its start at those indices (`truth.decoded_video`, compared by CRC-32);
  ``_clip_row`` the video's dataset position (`truth.clip_positions`).
- `fraction_failures`: the start fractions (`truth.clip_fractions`) of every clip of every data
  epoch a run may read obey the documented rule (`lance_lightning.plan.clips`): ``random``, clip
  ``k`` of ``K`` in ``[k / K, (k + 1) / K]``; ``even``, ``k / (K - 1)`` (``0.5`` for ``K = 1``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tests.contract import truth

if TYPE_CHECKING:
    from tests.contract.runner import Run
    from tests.contract.scenario import Scenario

#: Tolerance of a frame time (the recorded times are Python floats of PyAV's ``frame.time``).
TIME_TOLERANCE = 1e-6
#: Failures reported per phase (the first ones say enough).
SHOWN = 5


def check_clips(run: Run) -> list[str]:
    """Everything the runs' trained clips got wrong (empty without clips)."""
    scenario = run.scenario
    if scenario.clips is None:
        return []
    failures = fraction_failures(scenario)
    uris = list(run.versions)  # the tables' URIs, in the scenario's order
    for role, phase in run.phases.items():
        found: list[str] = []
        for rank, events in enumerate(phase.ranks):
            for event in events:
                if event["t"] != "batch":
                    continue
                clips = event.get("clips")
                if clips is None or len(clips) != len(event["units"]):
                    found.append(f"{role} rank {rank} epoch {event['epoch']} idx {event['idx']}: no clip record")
                    continue
                for key, clip in zip(event["units"], clips):
                    problem = clip_problem(scenario, uris, key, clip)
                    if problem is not None:
                        found.append(f"{role} rank {rank} epoch {event['epoch']} idx {event['idx']}: {problem}")
        failures += found[:SHOWN]
    return failures


def clip_problem(scenario: Scenario, uris: list[str], key: int, clip: list[Any]) -> str | None:
    """Why the recorded ``clip`` ([CRC-32, _clip_row, times]) is not the clip ``key`` names (None: it
    is); ``uris``: the scenario's tables."""
    clips = scenario.clips
    digest, position, times = clip
    source, rest = divmod(key, truth.BIG)
    row, start = divmod(rest, truth.CLIP_KEY)
    if not 0 <= source < len(scenario.sources):
        return f"clip {key}: no source {source}"
    index = scenario.sources[source].table
    table = scenario.tables[index]
    positions = truth.clip_positions(table)
    if row not in positions:
        return f"clip {key}: id {row} is no live row of table {index}"
    room = int(truth.video_frames(np.array([row]))[0]) - truth.clip_span(clips)
    if not 0 <= start <= room:
        return f"clip of id {row} starts at frame {start}, outside [0, {room}] (the video's room for the clip)"
    stored = len(truth.decoded_video(uris[index], row))
    if stored != room + truth.clip_span(clips):
        return f"the stored video of id {row} decodes to {stored} frames, not {room + truth.clip_span(clips)}"
    want_times, want_digest = truth.clip_content(clips, uris[index], row, start)
    if len(times) != len(want_times) or np.abs(np.asarray(times) - want_times).max() > TIME_TOLERANCE:
        return f"clip of id {row} from frame {start}: frame times {times}, expected {want_times}"
    if digest != want_digest:
        return f"clip of id {row} from frame {start}: its frames are not frames {start}.. every {clips.frame_step}"
    if position != positions[row]:
        return f"clip of id {row}: _clip_row {position}, the row's dataset position is {positions[row]}"
    return None


def fraction_failures(scenario: Scenario) -> list[str]:
    """Where the start fractions of the clips of any data epoch a run may read break the documented rule."""
    clips = scenario.clips
    k_of_k = clips.per_item
    units = max(len(truth.source_units(scenario, j)) for j in range(len(scenario.sources)))
    unit = np.arange(units, dtype=np.int64)
    k = unit % k_of_k
    for epoch in range(scenario.data_epochs + 1):
        fractions = truth.clip_fractions(clips, epoch, unit)
        if clips.starts == "even":
            wrong = fractions != (k / (k_of_k - 1) if k_of_k > 1 else 0.5)
        else:
            wrong = (fractions < k / k_of_k) | (fractions > (k + 1) / k_of_k)
        if wrong.any():
            first = int(np.flatnonzero(wrong)[0])
            return [
                f"epoch {epoch}: clip unit {first} (clip {k[first]} of {k_of_k}, starts={clips.starts}) "
                f"starts at fraction {fractions[first]}, outside the documented rule"
            ]
    return []
