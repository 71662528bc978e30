"""Ground truth of a scenario, computed with numpy alone: never through the package under test.

Guarantees:
- `source_units` lists, in storage (stream) order, the units a source holds: the ids of the rows
  that survive deletion and match the filter, or with packing the key of every window of the
  stream of matching documents. A filter is evaluated here by a parser of the few SQL forms the
  generator writes (``col op value``, ``col % m op value``), not by Lance.
- A unit's key is what `tests.contract.phase.units_of` reads from a batch: a row's ``id``; a
  window's first real token ``v`` and its offset ``o`` as ``v * 64 + o``; a clip's video ``id``
  and its start frame ``f`` as ``id * CLIP_KEY + f``; plus ``source * BIG`` for a mixture's draws.
  Ids and token values are distinct across tables (video tables all start at id 0: a mixture's
  keys still differ by source).
- With clips (`Scenario.clips`), unit ``u`` of a source is clip ``u % K`` of its ``u // K``-th
  matching video, starting at frame ``floor(fraction * (n - span))`` of a video of ``n`` frames
  (``span = (frames - 1) * frame_step + 1``, `lance_lightning.media.video`'s rule), where
  ``fraction`` is the keyed draw of (seed, epoch, unit): the one value taken from the package
  (`clip_fractions`; `tests.contract.clips` checks its documented strata). What a clip must hold
  (`clip_content`) comes from decoding the whole video as stored (read with Lance) with PyAV alone.
- `scheduled_counts` gives a scheduled mixture's samples per source in each block of an epoch,
  from the guide's rule ("Schedules"), in plain Python: the shares at the block's first sample
  ``g = epoch * samples + b * block`` (constant per stage, or linear from a stage's shares to the
  next one's at its end), then largest remainder of ``share * block``.
- `expected_error` says which clear error a scenario must give before training (or None).
- `write_tables` writes the scenario's Lance datasets (`table_data`, or a video table with
  `tests.videos.write_videos`); their content is what the functions above describe. A prepared
  table 0 (`Scenario.prepare`) is left to the first fit.
"""

from __future__ import annotations

import functools
import io
import math
import operator
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tests.contract.scenario import Clips, Packing, Scenario, Table

#: A mixture draw's unit: ``source * BIG + key``.
BIG = 10**12
#: The end-of-document token of packing scenarios; real tokens are ``FIRST_TOKEN`` and up.
EOS = 1
FIRST_TOKEN = 1000
#: A window key is ``token * WINDOW_KEY + offset`` (offsets are below every ``seq_len`` drawn).
WINDOW_KEY = 64
#: A clip key is ``id * CLIP_KEY + start frame`` (start frames are below every video's length).
CLIP_KEY = 1024
#: Video tables: frames of ``CLIP_SIZE`` x ``CLIP_SIZE`` (the clips' ``size`` too), at `tests.videos.FPS`.
CLIP_SIZE = 16

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "=": operator.eq, "!=": operator.ne}
_CLAUSE = re.compile(r"^\s*(\w+)\s*(?:%\s*(\d+)\s*)?(<=|>=|!=|<|>|=)\s*(-?\d+)\s*$")


def document_tokens(table: Table) -> np.ndarray:
    """Tokens per document of a token table (1..max_tokens each, seeded by the table)."""
    rng = np.random.default_rng(table.start + 7 * table.rows + table.max_tokens)
    return rng.integers(1, table.max_tokens + 1, table.rows)


def columns(table: Table) -> dict[str, np.ndarray]:
    """The table's filterable columns, in storage order, after the deletion."""
    index = np.arange(table.rows)
    ids = table.start + index
    cols = {"id": ids}
    if table.tokens:
        cols["topic"] = index * 4 // table.rows
        cols["n_tokens"] = document_tokens(table)
    elif table.video:
        cols["label"] = ids % 3
    else:
        cols["label"] = ids % 10
    if table.delete_mod:
        keep = ids % table.delete_mod != 1
        cols = {name: values[keep] for name, values in cols.items()}
    return cols


def matches(filter: str | None, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Boolean mask of the rows that ``filter`` (clauses joined by AND) keeps."""
    mask = np.ones(len(cols["id"]), dtype=bool)
    if filter is None:
        return mask
    for clause in re.split(r"\s+AND\s+", filter, flags=re.IGNORECASE):
        found = _CLAUSE.match(clause)
        if found is None:
            raise ValueError(f"the contract checker cannot evaluate filter clause {clause!r}")
        name, modulo, op, value = found.groups()
        values = cols[name] % int(modulo) if modulo else cols[name]
        mask &= _OPS[op](values, int(value))
    return mask


def window_keys(tokens: np.ndarray, packing: Packing) -> np.ndarray:
    """Keys of the windows of the stream of documents holding ``tokens`` tokens each (stream order)."""
    total = int(tokens.sum())
    values = FIRST_TOKEN + np.arange(total)
    if packing.eos:
        ends = np.cumsum(tokens)
        stream = np.insert(values, ends, EOS)
    else:
        stream = values
    span = packing.seq_len + (1 if packing.labels is not None else 0)
    windows = max(0, (len(stream) - (span - packing.seq_len)) // packing.seq_len)
    keys = np.empty(windows, dtype=np.int64)
    for w in range(windows):
        window = stream[w * packing.seq_len : (w + 1) * packing.seq_len]
        offset = int(np.flatnonzero(window != EOS)[0])
        keys[w] = int(window[offset]) * WINDOW_KEY + offset
    return keys


def source_units(scenario: Scenario, index: int, epoch: int = 0) -> np.ndarray:
    """Units of source ``index`` in storage order (keys offset by ``index * BIG`` in a mixture);
    with clips, those of data epoch ``epoch`` (where each clip starts changes with the epoch)."""
    source = scenario.sources[index]
    table = scenario.tables[source.table]
    cols = columns(table)
    keep = matches(source.filter, cols)
    if scenario.clips is not None:
        ids = cols["id"][keep].astype(np.int64)
        units = np.repeat(ids, scenario.clips.per_item) * CLIP_KEY + clip_starts(scenario.clips, ids, epoch)
    elif scenario.packing is None:
        units = cols["id"][keep].astype(np.int64)
    else:
        start = table.start + FIRST_TOKEN
        all_tokens = document_tokens(table)
        offsets = np.concatenate([[0], np.cumsum(all_tokens)])
        alive = np.isin(table.start + np.arange(table.rows), cols["id"])
        chosen = np.flatnonzero(alive)[keep]
        units = _keys_of_documents(all_tokens, offsets, chosen, start, scenario.packing)
    return units + (index * BIG if scenario.mixture is not None else 0)


def _keys_of_documents(
    all_tokens: np.ndarray, offsets: np.ndarray, chosen: np.ndarray, start: int, packing: Packing
) -> np.ndarray:
    """Window keys of the stream of documents ``chosen`` (whose tokens are ``start + offsets[d]...``)."""
    values = [start + np.arange(offsets[d], offsets[d] + all_tokens[d]) for d in chosen]
    keys = window_keys(all_tokens[chosen], packing)
    if not len(chosen):
        return keys
    # `window_keys` numbers tokens from FIRST_TOKEN over the chosen documents alone: map them back.
    flat = np.concatenate(values)
    token, offset = np.divmod(keys, WINDOW_KEY)
    return flat[token - FIRST_TOKEN] * WINDOW_KEY + offset


def val_units(scenario: Scenario, epoch: int = 0) -> np.ndarray:
    """Units of the val/predict split: table 0 unfiltered (with clips, those of ``epoch``)."""
    plain = _plain_view(scenario)
    return source_units(plain, 0, epoch)


# -- clips -----------------------------------------------------------------------------------------
def video_frames(ids: np.ndarray) -> np.ndarray:
    """Frames of the videos of ``ids`` (`tests.videos.video_frames`: a video table's id is its row)."""
    from tests.videos import video_frames as frames_of

    return np.array([frames_of(int(i)) for i in ids], dtype=np.int64)


def clip_span(clips: Clips) -> int:
    """Source frames a clip spans, first to last (`lance_lightning.media.video`'s ``span``)."""
    return (clips.frames - 1) * clips.frame_step + 1


def clip_fractions(clips: Clips, epoch: int, units: np.ndarray) -> np.ndarray:
    """Where each clip unit of ``epoch`` starts, as a fraction of the room its video leaves.

    The one call into the package here: the keyed hash of (seed, epoch, unit) that random starts
    draw from is `lance_lightning.plan.clips.start_fractions`' own (its documented strata and even
    starts are checked apart, `tests.contract.clips.fraction_failures`)."""
    from lance_lightning.plan.clips import start_fractions

    return start_fractions(sampler(clips), epoch, np.asarray(units, dtype=np.int64))


def sampler(clips: Clips) -> Any:
    """The `lance_lightning.VideoClips` a scenario's data module gets (`clip_arguments`)."""
    from lance_lightning import VideoClips

    return VideoClips(**clip_arguments(clips))


def clip_arguments(clips: Clips) -> dict[str, Any]:
    """``VideoClips``' arguments, as a YAML ``init_args`` holds them."""
    return {
        "column": "video",
        "frames": clips.frames,
        "frame_step": clips.frame_step,
        "clips_per_item": clips.per_item,
        "starts": clips.starts,
        "size": [CLIP_SIZE, CLIP_SIZE],
        "seed": clips.seed,
    }


def clip_starts(clips: Clips, ids: np.ndarray, epoch: int) -> np.ndarray:
    """The start frame of every clip unit ``u`` of matching rows ``ids`` in ``epoch`` (clip
    ``u % K`` of ``ids[u // K]``): ``floor(fraction * (n - span))`` for a video of ``n`` frames."""
    units = np.arange(len(ids) * clips.per_item, dtype=np.int64)
    fractions = clip_fractions(clips, epoch, units)
    room = video_frames(ids)[units // clips.per_item] - clip_span(clips)
    return np.array([math.floor(float(f) * int(r)) for f, r in zip(fractions, room)], dtype=np.int64)


@functools.lru_cache(maxsize=256)
def decoded_video(uri: str, row: int) -> np.ndarray:
    """Every frame of the video of id ``row`` in the table at ``uri`` (``[n, 3, H, W]`` uint8),
    decoded from its start with PyAV (RGB by ``reformat(format="rgb24")``): what a clip's frames
    must be (`lance_lightning.media.video`). The bytes are read as stored, with Lance (an encode is
    not byte-for-byte repeatable within one long-lived process: encoding again could differ)."""
    import av
    import lance

    dataset = lance.dataset(uri)
    ids = dataset.to_table(columns=["id"])["id"].to_pylist()
    blob = dataset.take_blobs("video", indices=[ids.index(row)])[0]
    try:
        data = blob.read()
    finally:
        blob.close()
    with av.open(io.BytesIO(data)) as container:
        frames = [
            frame.reformat(width=CLIP_SIZE, height=CLIP_SIZE, format="rgb24").to_ndarray()
            for frame in container.decode(container.streams.video[0])
        ]
    return np.ascontiguousarray(np.stack(frames).transpose(0, 3, 1, 2))


def clip_content(clips: Clips, uri: str, row: int, start: int) -> tuple[list[float], int]:
    """The clip of the video of id ``row`` (table ``uri``) from frame ``start``: its frame times
    (frame ``i`` at ``i / FPS``) and the CRC-32 of its frames (`clip_digest`)."""
    from tests.videos import FPS

    indices = start + clips.frame_step * np.arange(clips.frames)
    return (indices / FPS).tolist(), clip_digest(decoded_video(uri, row)[indices])


def clip_digest(frames: np.ndarray) -> int:
    """CRC-32 of a clip's frames (``uint8 [T, 3, H, W]``, C order)."""
    return zlib.crc32(np.ascontiguousarray(frames).tobytes())


def clip_positions(table: Table) -> dict[int, int]:
    """Each live row's dataset position (its index among the rows that survive the deletion), by id."""
    return {int(i): position for position, i in enumerate(columns(table)["id"])}


def _plain_view(scenario: Scenario) -> Scenario:
    from dataclasses import replace

    from tests.contract.scenario import Source

    return replace(scenario, source=Source(0, None), mixture=None)


def block_counts(weights: list[float], block: int) -> list[int]:
    """Samples per block of each source: largest remainder of the weights' shares (docs' rule)."""
    total = float(sum(weights))
    exact = [w / total * block for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in order[: block - sum(counts)]:
        counts[j] += 1
    return counts


def schedule_ends(mixture: Any) -> list[int]:
    """Each stage's end in samples (every stage but the last)."""
    ends = []
    for stage in mixture.schedule[:-1]:
        ends.append(stage["until_sample"] if "until_sample" in stage else stage["until_step"] * mixture.step_samples)
    return ends


def scheduled_shares(mixture: Any, g: int) -> list[float]:
    """The shares the schedule sets at global sample ``g`` (the guide's formula, float by float)."""
    stages = [[w / float(sum(stage["weights"])) for w in stage["weights"]] for stage in mixture.schedule]
    ends = schedule_ends(mixture)
    i = 0
    while i < len(ends) and ends[i] <= g:
        i += 1
    if mixture.interpolate != "linear" or i == len(ends):
        return stages[i]
    start = ends[i - 1] if i else 0
    t = (g - start) / (ends[i] - start)
    return [a + (b - a) * t for a, b in zip(stages[i], stages[i + 1])]


def scheduled_counts(mixture: Any, epoch: int) -> list[list[int]]:
    """Samples of each source in every block of ``epoch`` of a scheduled mixture."""
    samples, block = int(mixture.samples), mixture.block
    out = []
    for first in range(0, samples, block):
        exact = [share * block for share in scheduled_shares(mixture, epoch * samples + first)]
        counts = [int(x) for x in exact]
        order = sorted(range(len(exact)), key=lambda j: (-(exact[j] - counts[j]), j))
        for j in order[: block - sum(counts)]:
            counts[j] += 1
        out.append(counts)
    return out


def epoch_units(scenario: Scenario) -> int:
    """Units in one epoch of the train split (0 when a source has none)."""
    sizes = [len(source_units(scenario, j)) for j in range(len(scenario.sources))]
    mixture = scenario.mixture
    if mixture is None:
        return sizes[0]
    if mixture.epoch == "samples":
        return int(mixture.samples) if min(sizes) else 0
    counts = block_counts(mixture.weights, mixture.block)
    if min(counts) < 1:
        return 0
    return min(n // k for n, k in zip(sizes, counts)) * mixture.block


def expected_error(scenario: Scenario, world_size: int, batch_size: int, drop_last: bool) -> str | None:
    """Why this scenario must stop with a clear `ConfigError` before training, or None."""
    sizes = [len(source_units(scenario, j)) for j in range(len(scenario.sources))]
    if min(sizes) == 0:
        return "a source has no rows (or no whole window)"
    mixture = scenario.mixture
    if mixture is not None and mixture.schedule is None and min(block_counts(mixture.weights, mixture.block)) < 1:
        return "a weight too small for the block"
    units = epoch_units(scenario)
    if units == 0:
        return "no whole mixture block"
    if units < world_size:
        return "fewer units than ranks"
    if drop_last and units < world_size * batch_size:
        return "less than one step with drop_last"
    return None


# -- writing -------------------------------------------------------------------------------------
def write_tables(
    scenario: Scenario, root: Path, base: str | None = None, storage_options: dict[str, str] | None = None
) -> list[str]:
    """Write every table of ``scenario`` under ``root`` (once: an existing one is kept), or under the
    object store prefix ``base`` (with ``storage_options``); return the URIs."""
    uris = []
    for index, table in enumerate(scenario.tables):
        uri = f"{base}/table{index}.lance" if base is not None else str(root / f"table{index}.lance")
        uris.append(uri)
        if base is None and Path(uri).exists():
            continue
        if index == 0 and scenario.prepare is not None:  # made by the first fit's prepare_data
            continue
        write_table(table, uri, storage_options)
    return uris


def write_table(table: Table, uri: str, storage_options: dict[str, str] | None = None) -> None:
    """Write one table directly (`table_data`, ``fragment_rows`` rows per fragment), then delete."""
    import lance
    import pyarrow as pa

    if table.video:  # a local blob video table (`tests.videos.write_videos`: id = row)
        from tests.videos import write_videos

        dataset = lance.dataset(write_videos(uri, table.rows, size=CLIP_SIZE, fragment_rows=table.fragment_rows))
        if table.delete_mod:
            dataset.delete(f"id % {table.delete_mod} = 1")
        return
    kwargs: dict[str, Any] = {"mode": "create", "storage_options": storage_options}
    if table.fragment_rows is not None:
        kwargs["max_rows_per_file"] = table.fragment_rows
        kwargs["max_rows_per_group"] = table.fragment_rows
    dataset = lance.write_dataset(pa.table(table_data(table)), uri, **kwargs)
    if table.delete_mod:
        dataset.delete(f"id % {table.delete_mod} = 1")


def table_data(table: Table) -> dict[str, Any]:
    """The table's columns as written (before the deletion): Arrow arrays by name, ``id`` first."""
    import pyarrow as pa

    ids = table.start + np.arange(table.rows, dtype=np.int64)
    if table.tokens:
        counts = document_tokens(table)
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        values = (FIRST_TOKEN + table.start + np.arange(bounds[-1])).astype(np.int32)
        data: dict[str, Any] = {
            "id": pa.array(ids),
            "tokens": pa.ListArray.from_arrays(pa.array(bounds), pa.array(values)),
            "n_tokens": pa.array(counts.astype(np.int32)),
            "topic": pa.array(np.arange(table.rows, dtype=np.int64) * 4 // table.rows),
        }
    else:
        data = {
            "id": pa.array(ids),
            "label": pa.array(ids % 10),
            "x": pa.array((ids % 1000).astype(np.float32) / 1000),
        }
    return data


def maintain(uris: list[str]) -> None:
    """What a maintenance job does between two runs, without changing any table's rows: compact,
    commit a new version, and delete every old version Lance lets it (tagged ones stay)."""
    from datetime import timedelta

    import lance

    for uri in uris:
        lance.dataset(uri).optimize.compact_files()
        lance.dataset(uri).update_config({"contract.maintenance": "done"})
        lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)


def holds(uris: list[str]) -> dict[str, dict[str, int]]:
    """This package's Lance tags on each table: URI -> tag name -> version."""
    import lance

    from lance_lightning.hold import list_holds

    return {uri: list_holds(lance.dataset(uri)) for uri in uris}


def latest_versions(uris: list[str]) -> dict[str, int]:
    import lance

    return {uri: lance.dataset(uri).version for uri in uris}
