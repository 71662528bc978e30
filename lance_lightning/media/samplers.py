"""What a clip is: the samplers chosen in YAML (`VideoClips`, `AudioClips`), checked when made.

Guarantees:
- `VideoClips` and `AudioClips` check their arguments when made (`ConfigError` naming the
  parameter, the value and the fix) and describe themselves as plain values (part of a plan's
  identity: a cursor saved with other clips is refused).
- They say what a batch of their clips holds (``shape_line``) and nothing here reads or decodes
  media: which clips an epoch draws is `lance_lightning.plan.clips`', decoding is
  `lance_lightning.media.decoders`'.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from lance_lightning.checks import check_choice, check_int, check_positive_number
from lance_lightning.errors import ConfigError

START_MODES = ("random", "even")
#: Settings that change how clips are decoded, not which: a cursor saved under others still fits.
_NOT_CHOOSING = ("open_files", "decoder")
DECODERS = ("auto", "pyav")


class ClipSampler(ABC):
    """What both samplers share: the media column, clips per row, where clips start, the decoder."""

    def __init__(self, column: str, per_item: int, starts: str, seed: int, decoder: str, open_files: int) -> None:
        name = type(self).__name__
        if not isinstance(column, str) or not column:
            raise ConfigError(f"{name}.column", column, "must be a blob column name", "set column: video")
        check_int(f"{name}.clips_per_item", per_item, 1, "set clips_per_item: 1 or more")
        check_choice(f"{name}.starts", starts, START_MODES, "must be 'random' or 'even'", "set starts: random")
        check_int(f"{name}.seed", seed, 0, "set seed: 0")
        check_choice(f"{name}.decoder", decoder, DECODERS, "is not a decoder this package runs", "set decoder: auto")
        check_int(f"{name}.open_files", open_files, 1, "set open_files: 64")
        self.column = column
        self.per_item = per_item
        self.starts = starts
        self.seed = seed
        self.decoder = decoder
        self.open_files = open_files

    @property
    def clips_per_item(self) -> int:
        """The constructor's ``clips_per_item`` (kept as ``per_item``)."""
        return self.per_item

    def describe(self) -> dict[str, Any]:
        """Plain description of everything that chooses and shapes a clip (not the decoder's pool)."""
        return {"kind": type(self).__name__, **{k: v for k, v in vars(self).items() if k not in _NOT_CHOOSING}}

    @abstractmethod
    def shape_line(self) -> str:
        """What a batch of these clips holds, in words (for ``explain``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self).__name__, *(repr(v) for v in vars(self).values())))


class VideoClips(ClipSampler):
    """Clips of ``frames`` frames from a video blob column: batches hold ``uint8 [B, T, 3, H, W]``.

    Args:
        column: The blob column holding one encoded video per row (``prepare --format videofolder``
            writes ``video``).
        frames: Frames per clip (``T``).
        frame_step: Take every ``frame_step``-th frame of the source (ignored when ``fps`` is set).
        fps: Sample the clip at this many frames per second of the video's time instead.
        clips_per_item: Clips drawn from each video per epoch (each one a sample of its own).
        starts: ``"random"`` (a new start per clip and epoch, keyed by ``seed``; clip ``k`` of a
            video within the ``k``-th of ``clips_per_item`` equal parts of the possible starts) or
            ``"even"`` (``clips_per_item`` evenly spaced starts from the first frame to the last clip's).
        size: ``[height, width]`` of the decoded frames (``None``: the video's own size; videos of
            different sizes then cannot share a batch).
        seed: Keys the random starts.
        decoder: ``"auto"`` or ``"pyav"`` (`lance_lightning.media.decoders` says which runs and why).
        open_files: Videos kept open per process (headers and indexes read once while open).
    """

    def __init__(
        self,
        column: str = "video",
        frames: int = 8,
        frame_step: int = 1,
        fps: float | None = None,
        clips_per_item: int = 1,
        starts: str = "random",
        size: list[int] | tuple[int, int] | None = None,
        seed: int = 0,
        decoder: str = "auto",
        open_files: int = 64,
    ) -> None:
        super().__init__(column, clips_per_item, starts, seed, decoder, open_files)
        check_int("VideoClips.frames", frames, 1, "set frames: 8")
        check_int("VideoClips.frame_step", frame_step, 1, "set frame_step: 1")
        check_positive_number(
            "VideoClips.fps", fps, "set fps: 8 (frames per second of the video's time), or null", optional=True
        )
        self.frames = frames
        self.frame_step = frame_step
        self.fps = None if fps is None else float(fps)
        self.size = _check_size(size)

    def shape_line(self) -> str:
        every = f"at {self.fps:g} fps" if self.fps else f"every {self.frame_step} frame(s)"
        size = "native size" if self.size is None else f"{self.size[0]}x{self.size[1]}"
        return f"{self.frames} frame(s) {every}, {size}, uint8 [B, T, 3, H, W] + '{self.column}_timestamps'"


class AudioClips(ClipSampler):
    """Windows of ``seconds`` from an audio blob column: batches hold ``float32 [B, channels, samples]``.

    Args:
        column: The blob column holding one encoded audio file per row.
        seconds: Duration of each window.
        sample_rate: Samples per second of the output (the audio is resampled).
        channels: 1 (mono) or 2 (stereo): the audio is mixed to that layout.
        clips_per_item: Windows drawn from each file per epoch.
        starts: ``"random"`` or ``"even"``, as for `VideoClips`.
        seed: Keys the random starts.
        decoder: ``"auto"`` or ``"pyav"``.
        open_files: Files kept open per process.
    """

    def __init__(
        self,
        column: str = "audio",
        seconds: float = 1.0,
        sample_rate: int = 16000,
        channels: int = 1,
        clips_per_item: int = 1,
        starts: str = "random",
        seed: int = 0,
        decoder: str = "auto",
        open_files: int = 64,
    ) -> None:
        super().__init__(column, clips_per_item, starts, seed, decoder, open_files)
        check_positive_number("AudioClips.seconds", seconds, "set seconds: 1.0")
        check_int("AudioClips.sample_rate", sample_rate, 1, "set sample_rate: 16000")
        check_choice("AudioClips.channels", channels, (1, 2), "must be 1 (mono) or 2 (stereo)", "set channels: 1")
        self.seconds = float(seconds)
        self.sample_rate = sample_rate
        self.channels = channels

    @property
    def samples(self) -> int:
        """Samples per window."""
        return round(self.seconds * self.sample_rate)

    def shape_line(self) -> str:
        return (
            f"{self.seconds:g} s at {self.sample_rate} Hz, {self.channels} channel(s), "
            f"float32 [B, {self.channels}, {self.samples}] + '{self.column}_start'"
        )


def _check_size(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    if (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        return (int(size[0]), int(size[1]))
    raise ConfigError(
        "VideoClips.size", size, "must be [height, width] of positive integers, or null", "set size: [112, 112]"
    )
