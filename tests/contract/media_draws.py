"""Clips over the media corpus (issue #50): video clips and audio windows from every container and
codec users' files come in, through a real ``Trainer.fit``, against a whole-stream PyAV decode.

Guarantees:
- `Media` (a `tests.contract.scenario.Scenario`'s ``media``) names corpus files
  (`tests.media_corpus`: MP4/MOV/MKV/WebM/AVI/MPEG-TS videos with and without audio tracks,
  non-zero starts, B-frames, 29.97/60 fps, VFR; WAV/FLAC/MP3/M4A/Opus audio) and the clips cut
  from them: ``VideoClips(frames, frame_step)`` or ``AudioClips(seconds, sample_rate, channels)``,
  ``clips_per_item`` of 1-3 with ``starts="even"`` (clip ``k`` of ``K`` at fraction
  ``k / (K - 1)``: the first and the last possible clip of every file are always among them),
  batch size, reader threads; `draw_media` draws one from its own random stream.
- `run_media` writes the files as a Lance blob table with pylance (``id``, the media column,
  ``name``), trains one epoch of a `LanceDataModule` with those clips in this process, records
  every clip, and returns every failure of the oracle, computed from the corpus's whole-stream
  decode (`tests.media_corpus.whole_video_rgb`, `whole_audio`; no code of this package):
  - the fit raises nothing (a clip the documented rule places inside the file is never a bad row);
  - each file gives exactly its ``K`` clips; each clip equals one of the file's expected clips:
    video frames ``floor(f * (n - span)) + i * step`` of the ``n`` decoded frames, bit-exact, at
    their decoded times; audio samples ``round(f * (total - count))`` onward of the decode at the
    window's rate and layout (``total``: the container's duration there), within the codec's
    tolerance, starting at that sample's time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
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


#: The corpus's files, in its order (from its specs: nothing is encoded to draw); a file added to
#: the corpus joins the draws (a drawn scenario names its files, so a replayed line stays the same).
VIDEOS = tuple(spec.name for spec in media_corpus.VIDEOS)
AUDIOS = tuple(spec.name for spec in media_corpus.AUDIOS)


def draw_media(rng: random.Random) -> Media:
    kind = rng.choice(["video", "audio"])
    names = sorted(rng.sample(VIDEOS if kind == "video" else AUDIOS, rng.randint(1, 4)))
    if kind == "video":  # spans of 21 frames at most: every corpus video has more (`test_parts`)
        frames = rng.randint(1, 6)
        return Media(
            kind, names, rng.randint(1, 3), frames, rng.randint(1, 18 // frames + 1), reader_threads=rng.choice([1, 2])
        )
    rate = rng.choice([None, 16000, 22050, 48000])
    return Media(
        kind, names, rng.randint(1, 3), seconds=round(rng.uniform(0.05, 1.5), 3), sample_rate=rate,
        channels=rng.choice([1, 2]), batch_size=1 if rate is None else rng.choice([1, 2, 3]),
        reader_threads=rng.choice([1, 2]),
    )  # fmt: skip


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

    if media.kind == "video":
        return VideoClips(
            frames=media.frames, frame_step=media.frame_step, clips_per_item=media.per_item, starts="even"
        )
    return AudioClips(
        seconds=media.seconds, sample_rate=rate, channels=media.channels, clips_per_item=media.per_item, starts="even"
    )


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
            error = f"{type(failed).__name__}: {str(failed)[:600]}"
            break
        if len(groups) > 1:  # rows of this table: its file is `group[0]`
            rows[before:] = [(media.names.index(group[0]), clip, when) for _, clip, when in rows[before:]]
    return rows, error


# -- the oracle -----------------------------------------------------------------------------------------
def expected_clips(media: Media, name: str) -> list[tuple[np.ndarray, Any]]:
    """The file's clips from a whole-stream decode: (video frames [T, H, W, 3] or audio [C, S],
    frame times or the start in seconds), one per even start."""
    from tests.media_corpus import by_name, whole_audio, whole_video_rgb

    item = by_name(name)
    out = []
    if media.kind == "video":
        decoded, times = whole_video_rgb(item.data), np.asarray(item.frame_times)
        n, span = len(decoded), (media.frames - 1) * media.frame_step + 1
        for f in fractions(media.per_item):
            indices = math.floor(f * (n - span)) + np.arange(media.frames) * media.frame_step
            out.append((decoded[indices], times[indices].tolist()))
        return out
    rate = media.sample_rate or item.sample_rate
    decoded = whole_audio(item.data, rate, media.channels)
    total, count = item.duration_samples * rate // item.sample_rate, round(media.seconds * rate)
    for f in fractions(media.per_item):
        first = round(f * (total - count))
        out.append((decoded[:, first : first + count], first / rate))
    return out


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


def run_media(media: Media, root: Path) -> list[str]:
    """Fit one epoch of ``media``'s clips and compare every clip with the whole-stream decode."""
    root.mkdir(parents=True, exist_ok=True)
    rows, error = fit_clips(media, str(root / "media.lance"), root)
    if error is not None:
        return [f"media: the fit over {media.names} failed: {error}"]
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
