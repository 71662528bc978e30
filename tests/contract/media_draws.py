"""Clips over the media corpus (issue #50): video clips and audio windows from every container and
codec users' files come in, through a real ``Trainer.fit``, against a whole-stream PyAV decode.

Guarantees:
- `Media` (a `tests.contract.scenario.Scenario`'s ``media``) names corpus files
  (`tests.media_corpus`: MP4/MOV/MKV/WebM/AVI/MPEG-TS videos with and without audio tracks,
  non-zero starts, B-frames, 29.97/60 fps, VFR; WAV/FLAC/MP3/M4A/Opus audio) and the clips cut
  from them: ``VideoClips(frames, frame_step)`` or ``AudioClips(seconds, sample_rate, channels)``,
  ``clips_per_item`` of 1-3 with ``starts="even"`` (clip ``k`` of ``K`` at fraction
  ``k / (K - 1)``: the first and the last possible clip of every file are always among them),
  batch size, reader threads; `draw_media` draws one from its own random stream. In 60% of
  draws (issue #52) also TorchCodec's placement options (docs/video.md): ``policy``
  (``repeat_last``, ``wrap``, ``error``), a sampling range (video: frame indices, negative from the
  end; audio: seconds), regular starts (``seconds_between_clip_starts``, with a range in seconds)
  and the aliases (``num_clips``, ``num_frames_per_clip``, ``num_indices_between_frames``,
  ``num_channels``). The new fields default to the old behaviour (and are absent from a scenario's
  JSON at their default), so a line replayed from before them is the same scenario.
- `run_media` writes the files as a Lance blob table with pylance (``id``, the media column,
  ``name``), trains one epoch of a `LanceDataModule` with those clips in this process, records
  every clip, and returns every failure of the oracle, computed from the corpus's whole-stream
  decode (`tests.media_corpus.whole_video_rgb`, `whole_audio`; no code of this package):
  - the fit raises nothing (a clip the documented rule places inside the file is never a bad row),
    unless the documented rule makes a clip a bad row (a clip past the end with ``policy="error"``,
    a regular start at or after the end, a range start past the media): then the fit raises
    `BadRowError` for one of those files, with the documented reason;
  - each file gives exactly its ``K`` clips; each clip equals one of the file's expected clips:
    video frames ``floor(f * (n - span)) + i * step`` of the ``n`` decoded frames, bit-exact, at
    their decoded times; audio samples ``round(f * (total - count))`` onward of the decode at the
    window's rate and layout (``total``: the container's duration there), within the codec's
    tolerance, starting at that sample's time. With the placement options the start is re-derived
    from docs/video.md (`video_start`, `audio_start`) and positions past the end are filled as the
    policy says (`fill`), each taken from the whole decode (its frame times repeated with them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tests import media_corpus

#: Largest frame-time difference accepted (PyAV's times are floats).
TIME_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Media:
    """Clips over corpus files (`tests.media_corpus`), trained for one epoch."""

    kind: Literal["video", "audio"] = "video"
    names: list[str] = field(default_factory=list)
    per_item: int = 2
    #: Video: frames per clip and the step between them.
    frames: int = 4
    frame_step: int = 1
    #: Audio: window length, output rate (None: each file's own; then one file a batch) and layout.
    seconds: float = 0.4
    sample_rate: int | None = 16000
    channels: int = 1
    batch_size: int = 1
    reader_threads: int = 2
    #: TorchCodec's placement options (issue #52); the defaults are the sampler's, as before them.
    policy: str = "error"
    #: ``sampling_range_start``/``_end``: video frame indices (int), or seconds with ``every``;
    #: audio seconds.
    range_start: float | None = None
    range_end: float | None = None
    #: ``seconds_between_clip_starts`` (regular starts).
    every: float | None = None
    #: Construct the sampler with TorchCodec's names (``num_clips``, ...) instead of ours.
    aliases: bool = False


#: The corpus's files, in its order (from its specs: nothing is encoded to draw); a file added to
#: the corpus joins the draws (a drawn scenario names its files, so a replayed line stays the same).
VIDEOS = tuple(spec.name for spec in media_corpus.VIDEOS)
AUDIOS = tuple(spec.name for spec in media_corpus.AUDIOS)


#: Share of media draws that also draw the placement options (issue #52).
OPTIONS_SHARE = 0.6
POLICIES = ("error", "repeat_last", "wrap")


def draw_media(rng: random.Random) -> Media:
    kind = rng.choice(["video", "audio"])
    names = sorted(rng.sample(VIDEOS if kind == "video" else AUDIOS, rng.randint(1, 4)))
    if kind == "video":  # spans of 21 frames at most: every corpus video has more (`test_parts`)
        frames = rng.randint(1, 6)
        media = Media(
            kind, names, rng.randint(1, 3), frames, rng.randint(1, 18 // frames + 1), reader_threads=rng.choice([1, 2])
        )
    else:
        rate = rng.choice([None, 16000, 22050, 48000])
        media = Media(
            kind, names, rng.randint(1, 3), seconds=round(rng.uniform(0.05, 1.5), 3), sample_rate=rate,
            channels=rng.choice([1, 2]), batch_size=1 if rate is None else rng.choice([1, 2, 3]),
            reader_threads=rng.choice([1, 2]),
        )  # fmt: skip
    # Drawn after the rest (from the same stream): every field drawn before keeps its value.
    return _draw_options(rng, media) if rng.random() < OPTIONS_SHARE else media


def _draw_options(rng: random.Random, media: Media) -> Media:
    """Policy, sampling range or regular starts, and the aliases. The corpus's shortest video has
    30 frames (0.98 s), its shortest audio 2.3 s: ranges often start near the end, so clips reach
    past it (filled, or a bad row with ``policy="error"``)."""
    policy, aliases = rng.choice(POLICIES), rng.random() < 0.5
    start: float | None = None
    end: float | None = None
    every: float | None = None
    video = media.kind == "video"
    if rng.random() < 0.4:  # regular starts; the range in seconds
        every = round(rng.uniform(0.05, 0.45 if video else 0.8), 3)
        start = None if rng.random() < 0.5 else round(rng.uniform(0.0, 1.0 if video else 1.5), 3)
        if rng.random() < 0.3:
            end = round((start or 0.0) + rng.uniform(0.3, 1.5 if video else 2.5), 3)
    elif video:  # frame indices, negative from the end
        start = rng.choice([None, rng.randint(0, 29), -rng.randint(1, 20), -rng.randint(1, 20)])
        if start is None or start >= 0:
            end = rng.choice([None, (start or 0) + rng.randint(1, 20)])
        elif start < -1:
            end = rng.choice([None, start + rng.randint(1, -start - 1)])
    else:  # seconds from the audio's first sample
        start = rng.choice([None, round(rng.uniform(0.0, 2.2), 3), round(rng.uniform(1.2, 2.2), 3)])
        end = rng.choice([None, round((start or 0.0) + rng.uniform(0.05, 1.5), 3)])
    return replace(media, policy=policy, range_start=start, range_end=end, every=every, aliases=aliases)


def fractions(per_item: int) -> list[float]:
    """The documented ``even`` starts."""
    return [k / (per_item - 1) for k in range(per_item)] if per_item > 1 else [0.5]


# -- the table and the fit ----------------------------------------------------------------------------
def write_table(media: Media, uri: str) -> None:
    import lance
    import pyarrow as pa

    from tests.media_corpus import by_name

    column = media.kind
    schema = pa.schema([
        pa.field("id", pa.int64()),
        pa.field(column, pa.large_binary(), metadata={"lance-encoding:blob": "true"}),
        pa.field("name", pa.string()),
    ])  # fmt: skip
    data = [by_name(name).data for name in media.names]
    table = pa.table({"id": range(len(data)), column: data, "name": list(media.names)}, schema=schema)
    lance.write_dataset(table, uri)


def sampler(media: Media, rate: int | None) -> Any:
    from lance_lightning import AudioClips, VideoClips

    options: dict[str, Any] = {}  # only those drawn: a media without them makes the sampler as before
    if media.policy != "error":
        options["policy"] = media.policy
    for name, value in (("sampling_range_start", media.range_start), ("sampling_range_end", media.range_end),
                        ("seconds_between_clip_starts", media.every)):  # fmt: skip
        if value is not None:
            options[name] = value
    clips = "num_clips" if media.aliases else "clips_per_item"
    if media.kind == "video":
        frames, step = (
            ("num_frames_per_clip", "num_indices_between_frames") if media.aliases else ("frames", "frame_step")
        )
        return VideoClips(
            **{frames: media.frames, step: media.frame_step, clips: media.per_item}, starts="even", **options
        )
    channels = "num_channels" if media.aliases else "channels"
    return AudioClips(
        seconds=media.seconds, sample_rate=rate, **{channels: media.channels, clips: media.per_item}, starts="even",
        **options,
    )  # fmt: skip


def fit_clips(media: Media, uri: str, root: Path) -> tuple[list[tuple[int, Any, Any]], str | None]:
    """One epoch through a real Trainer: [(dataset row, clip, times or start)], and the error raised."""
    import lightning.pytorch as pl
    import torch

    from lance_lightning import LanceDataModule, LanceSource

    rows: list[tuple[int, Any, Any]] = []
    column = media.kind

    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            suffix = batch[f"{column}_timestamps"] if column == "video" else batch[f"{column}_start"]
            for i, row in enumerate(batch["_clip_row"].tolist()):
                rows.append((int(row), batch[column][i].numpy().copy(), np.asarray(suffix[i]).tolist()))
            return self.layer(torch.zeros(1, 1)).sum() * 0

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    groups = [[name] for name in media.names] if media.kind == "audio" and media.sample_rate is None else [media.names]
    error = None
    for group in groups:  # each file at its own rate: one table and one fit per file
        from tests.media_corpus import by_name

        rate = media.sample_rate or by_name(group[0]).sample_rate
        part = media if len(groups) == 1 else Media(**{**media.__dict__, "names": group})
        table = uri if len(groups) == 1 else f"{uri}-{group[0]}"
        write_table(part, table)
        dm = LanceDataModule(
            train=LanceSource(table, columns=["id", column]),
            batch_size=media.batch_size if media.kind == "audio" else 1,
            clips=sampler(media, rate),
            reader_threads=media.reader_threads,
            drop_last=False,
        )
        trainer = pl.Trainer(
            accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, default_root_dir=str(root), num_sanity_val_steps=0,
        )  # fmt: skip
        before = len(rows)
        try:
            trainer.fit(Recorder(), datamodule=dm)
        except Exception as failed:  # noqa: BLE001 - the oracle reports it
            error = f"{type(failed).__name__}: {str(failed)[:2000]}"
            break
        if len(groups) > 1:  # rows of this table: its file is `group[0]`
            rows[before:] = [(media.names.index(group[0]), clip, when) for _, clip, when in rows[before:]]
    return rows, error


# -- the oracle -----------------------------------------------------------------------------------------
#: The documented reasons a drawn clip is a bad row (docs/video.md), as the error names them.
PAST_END, REGULAR_PAST, RANGE_PAST = "policy 'error'", "at or after the end", "sampling_range_start"


def fill(positions: np.ndarray, length: int, policy: str) -> np.ndarray | str:
    """docs/video.md's ``policy`` for positions at or past ``length``: ``repeat_last``
    (``[a, b, c, c, c]``), ``wrap`` (``[a, b, c, a, b]``), or the bad row's reason (``error``)."""
    inside = positions[positions < length]
    if len(inside) == len(positions):
        return positions
    if policy == "error":
        return PAST_END
    if policy == "repeat_last":  # the last position inside, to the clip's end
        return np.concatenate([inside, np.full(len(positions) - len(inside), inside[-1])])
    return inside[np.arange(len(positions)) % len(inside)]  # the clip's own positions again, from its first


def video_start(media: Media, times: np.ndarray, f: float, k: int) -> int | str:
    """The first frame of clip ``k`` (at fraction ``f``) of a video with frames at ``times``: regular
    starts at the first frame at or after ``(range start or the first frame's time) + k * every``;
    else ``low + floor(f * (last - low))`` within the range ``[low, end)`` (negative: from the end;
    no end: the last start where the clip fits). Or the documented bad row's reason."""
    n, span = len(times), (media.frames - 1) * media.frame_step + 1
    if media.every is not None:
        at = (times[0] if media.range_start is None else media.range_start) + k * media.every
        start = int(np.searchsorted(times, at - 1e-9))
        past = start >= n or (media.range_end is not None and at >= media.range_end)
        return REGULAR_PAST if past else start
    low = 0 if media.range_start is None else int(media.range_start)
    low += n if low < 0 else 0
    if not 0 <= low < n:
        return RANGE_PAST
    if media.range_end is None:
        last = n - span
    else:
        end = int(media.range_end)
        last = min(end + n if end < 0 else end, n) - 1
    return low + math.floor(f * max(last - low, 0))


def audio_first(media: Media, total: int, count: int, rate: int, f: float, k: int) -> int | str:
    """The first output sample of window ``k`` (at fraction ``f``): regular starts at
    ``round(((range start or 0) + k * every) * rate)``, a bad row at or after the end (or the range's
    end); else ``low + round(f * (high - 1 - low))`` for the range ``[low, high)`` in samples (no
    end: the last start where the window fits; an end past the audio is its end; at least one start)."""
    low = 0 if media.range_start is None else round(media.range_start * rate)
    end = total if media.range_end is None else min(round(media.range_end * rate), total)
    if media.every is not None:
        first = round(((media.range_start or 0.0) + k * media.every) * rate)
        return REGULAR_PAST if first >= end else first
    if low >= total:
        return RANGE_PAST
    high = max(total - count + 1 if media.range_end is None else end, low + 1)
    return low + round(f * (high - 1 - low))


def expected_places(media: Media, name: str) -> list[np.ndarray | str]:
    """Each clip's positions (video frame indices, audio output samples) into the whole decode, or
    the documented reason it is a bad row; one per even start (regular starts: clip ``k``)."""
    from tests.media_corpus import by_name

    item, out = by_name(name), []
    for k, f in enumerate(fractions(media.per_item)):
        if media.kind == "video":
            start = video_start(media, np.asarray(item.frame_times), f, k)
            length, count, step = len(item.frame_times), media.frames, media.frame_step
        else:
            rate = media.sample_rate or item.sample_rate
            total, count, step = item.duration_samples * rate // item.sample_rate, round(media.seconds * rate), 1
            start, length = audio_first(media, total, count, rate, f, k), total
        out.append(start if isinstance(start, str) else fill(start + np.arange(count) * step, length, media.policy))
    return out


def bad_reasons(media: Media, name: str) -> list[str]:
    """The documented reasons some clip of ``name`` is a bad row (empty: every clip is placed)."""
    return [place for place in expected_places(media, name) if isinstance(place, str)]


def expected_clips(media: Media, name: str) -> list[tuple[np.ndarray, Any]]:
    """The file's clips from a whole-stream decode: (video frames [T, H, W, 3] or audio [C, S],
    frame times or the start in seconds), one per even start; for a file with no bad row."""
    from tests.media_corpus import by_name, whole_audio, whole_video_rgb

    item, places = by_name(name), expected_places(media, name)
    assert not any(isinstance(place, str) for place in places), f"{name} has a bad row: {places}"
    if media.kind == "video":
        decoded, times = whole_video_rgb(item.data), np.asarray(item.frame_times)
        return [(decoded[indices], times[indices].tolist()) for indices in places]
    rate = media.sample_rate or item.sample_rate
    decoded = whole_audio(item.data, rate, media.channels)
    return [(decoded[:, indices], int(indices[0]) / rate) for indices in places]


def _matches(media: Media, name: str, got: tuple[Any, Any], want: tuple[np.ndarray, Any]) -> bool:
    from tests.media_corpus import by_name

    clip, when = got
    expected, want_when = want
    if media.kind == "video":
        frames = np.asarray(clip).transpose(0, 2, 3, 1)
        return (
            frames.shape == expected.shape
            and np.array_equal(frames, expected)
            and np.abs(np.asarray(when) - np.asarray(want_when)).max() <= TIME_TOLERANCE
        )
    samples = np.asarray(clip)
    return (
        samples.shape == expected.shape
        and float(np.max(np.abs(samples - expected), initial=0.0)) <= by_name(name).tolerance
        and abs(float(np.ravel(when)[0]) - want_when) <= TIME_TOLERANCE
    )


def check_error(media: Media, bad: dict[str, list[str]], error: str | None) -> list[str]:
    """A fit over files with documented bad rows (``bad``: file -> reasons) raises `BadRowError`
    (the default `RaiseOnBadRow`) with one of their reasons; a fit over none raises nothing."""
    if not bad:
        return [] if error is None else [f"media: the fit over {media.names} failed: {error}"]
    said = error is not None and error.startswith("BadRowError") and any(r in error for rs in bad.values() for r in rs)
    return [] if said else [f"media: expected a BadRowError for {bad}, the fit gave: {error}"]


def run_media(media: Media, root: Path) -> list[str]:
    """Fit one epoch of ``media``'s clips and compare every clip with the whole-stream decode."""
    root.mkdir(parents=True, exist_ok=True)
    rows, error = fit_clips(media, str(root / "media.lance"), root)
    bad = {name: reasons for name in media.names if (reasons := bad_reasons(media, name))}
    if bad or error is not None:
        return check_error(media, bad, error)
    problems: list[str] = []
    for position, name in enumerate(media.names):
        got = [(clip, when) for row, clip, when in rows if row == position]
        want = expected_clips(media, name)
        if len(got) != len(want):
            problems.append(f"media: {name} gave {len(got)} clips, expected {len(want)}")
            continue
        unmatched = list(range(len(want)))
        for clip in got:
            hit = next((k for k in unmatched if _matches(media, name, clip, want[k])), None)
            if hit is None:
                starts = [w[1] if media.kind == "audio" else w[1][0] for w in want]
                shown = clip[1] if media.kind == "audio" else clip[1][:3]
                problems.append(f"media: a clip of {name} at {shown} is none of the whole decode's clips at {starts}")
                break
            unmatched.remove(hit)
    return problems
