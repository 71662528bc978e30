"""What a clip is: the samplers chosen in YAML (`VideoClips`, `AudioClips`), checked when made.

Guarantees:
- `VideoClips` and `AudioClips` check their arguments when made (`ConfigError` naming the
  parameter, the value and the fix) and describe themselves as plain values (part of a plan's
  identity: a cursor saved with other clips is refused).
- They take TorchCodec's vocabulary (``torchcodec.samplers``, ``torchcodec.decoders``) beside
  their own names: ``num_clips`` = ``clips_per_item``, ``num_frames_per_clip`` = ``frames``,
  ``num_indices_between_frames`` = ``frame_step``, ``seconds_between_frames`` = ``1 / fps``,
  ``num_channels`` = ``AudioClips.channels``, and both take ``sampling_range_start``/
  ``sampling_range_end``, ``policy`` and ``seconds_between_clip_starts``, parsed and checked in
  one place (`ClipSampler._place_options`; placed by `lance_lightning.media.place`). Rule: either
  name of a pair works (aliases); both given is a `ConfigError` naming the two. Options left at
  their defaults are not part of ``describe()``, so a config of the older names describes (and
  resumes) as before.
- They say what a batch of their clips holds (``shape_line``) and nothing here reads or decodes
  media: which clips an epoch draws is `lance_lightning.plan.clips`', decoding is
  `lance_lightning.media.decoders`'.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from lance_lightning.checks import check_choice, check_int, check_positive_number
from lance_lightning.errors import ConfigError

START_MODES = ("random", "even")
#: What a clip reaching past the media's end gets (TorchCodec's ``policy``): the last frame (sample)
#: repeated, the clip's own frames (samples) again from its first, or a bad row (the default here).
POLICIES = ("repeat_last", "wrap", "error")
#: New options left out of ``describe()`` at these defaults (older configs keep their identity).
_QUIET_DEFAULTS = {
    "policy": "error",
    "sampling_range_start": None,
    "sampling_range_end": None,
    "seconds_between_clip_starts": None,
}
#: Settings that change how clips are decoded, not which: a cursor saved under others still fits.
_NOT_CHOOSING = ("open_files", "decoder")
DECODERS = ("auto", "pyav")


class ClipSampler(ABC):
    """What both samplers share: the media column, clips per row, where clips start (TorchCodec's
    ``policy``, sampling range and regular timestamps: `_place_options`), the decoder."""

    policy: str = "error"
    sampling_range_start: float | None = None
    sampling_range_end: float | None = None
    seconds_between_clip_starts: float | None = None

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

    def _place_options(
        self,
        policy: str,
        start: float | None,
        end: float | None,
        every: float | None,
        seconds: bool,
        from_zero: bool = False,
    ) -> None:
        """Check and keep TorchCodec's placement options (one parser for both samplers): ``policy``,
        ``seconds_between_clip_starts`` and the sampling range, in seconds when ``seconds`` (else
        frame indices, negative from the end; 0 or more when ``from_zero``)."""
        name = type(self).__name__
        check_choice(f"{name}.policy", policy, POLICIES, "is not a policy", "set policy: repeat_last, wrap or error")
        check_positive_number(
            f"{name}.seconds_between_clip_starts",
            every,
            "set seconds_between_clip_starts: 1.0 (seconds of the media's time), or null",
            optional=True,
        )
        self.policy = policy
        self.seconds_between_clip_starts = None if every is None else float(every)
        self.sampling_range_start, self.sampling_range_end = _check_range(
            name, start, end, seconds=seconds, from_zero=from_zero
        )

    def _placement_words(self, noun: str, unit: str, end: str) -> str:
        """The placement options not at their defaults, in words (for ``shape_line``)."""
        words = ""
        if self.seconds_between_clip_starts is not None:
            words += f", {noun} every {self.seconds_between_clip_starts:g} s"
        if self.sampling_range_start is not None or self.sampling_range_end is not None:
            words += f", sampling range [{self.sampling_range_start}, {self.sampling_range_end}){unit}"
        if self.policy != "error":
            words += f", past {end}: {self.policy}"
        return words

    @property
    def clips_per_item(self) -> int:
        """The constructor's ``clips_per_item`` (kept as ``per_item``)."""
        return self.per_item

    def describe(self) -> dict[str, Any]:
        """Plain description of everything that chooses and shapes a clip (not the decoder's pool)."""
        described = {k: v for k, v in vars(self).items() if k not in _NOT_CHOOSING}
        quiet = [k for k, v in _QUIET_DEFAULTS.items() if k in described and described[k] == v]
        return {"kind": type(self).__name__, **{k: v for k, v in described.items() if k not in quiet}}

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
        num_clips, num_frames_per_clip, num_indices_between_frames, seconds_between_frames:
            TorchCodec's names of ``clips_per_item``, ``frames``, ``frame_step`` and ``1 / fps``.
        sampling_range_start, sampling_range_end: Frame indices a clip may start in,
            ``[start, end)`` (negative: from the end; ``end`` null: the last start where the clip
            fits), as TorchCodec's ``clips_at_random_indices``; with ``seconds_between_clip_starts``
            they are seconds of the video's time instead (null: its first frame's time).
        policy: A clip reaching past the last frame: ``"repeat_last"`` (the last frame repeated),
            ``"wrap"`` (the clip's own frames again from its first: ``[a, b, c, a, b]``) or
            ``"error"`` (a bad row; the default, and the only choice of older versions).
        seconds_between_clip_starts: Regular timestamps (TorchCodec's
            ``clips_at_regular_timestamps``): clip ``k`` of ``clips_per_item`` starts at the first
            frame at or after ``sampling_range_start + k * seconds_between_clip_starts``; ``starts``
            is then ignored. A start after the last frame is a bad row.
        starts: ``"random"`` (a new start per clip and epoch, keyed by ``seed``; clip ``k`` of a
            video within the ``k``-th of ``clips_per_item`` equal parts of the possible starts) or
            ``"even"`` (``clips_per_item`` evenly spaced starts from the first frame to the last clip's).
        size: ``[height, width]`` of the decoded frames (``None``: the video's own size; videos of
            different sizes then cannot share a batch).
        seed: Keys the random starts.
        decoder: ``"auto"`` or ``"pyav"`` (`lance_lightning.media.decoders` says which runs and why).
        open_files: Videos kept open per process (headers and indexes read once while open).
    """

    #: TorchCodec-named aliases, folded into ``clips_per_item``, ``frames``, ``frame_step`` and
    #: ``fps`` when made: read those. (None here, so a sampler described by its constructor's
    #: arguments, `lance_lightning.hparams`, is rebuilt from the folded names alone.)
    num_clips = num_frames_per_clip = num_indices_between_frames = seconds_between_frames = None

    def __init__(
        self,
        column: str = "video",
        frames: int | None = None,
        frame_step: int | None = None,
        fps: float | None = None,
        clips_per_item: int | None = None,
        starts: str = "random",
        size: list[int] | tuple[int, int] | None = None,
        seed: int = 0,
        decoder: str = "auto",
        open_files: int = 64,
        *,
        num_clips: int | None = None,
        num_frames_per_clip: int | None = None,
        num_indices_between_frames: int | None = None,
        seconds_between_frames: float | None = None,
        sampling_range_start: float | None = None,
        sampling_range_end: float | None = None,
        policy: str = "error",
        seconds_between_clip_starts: float | None = None,
    ) -> None:
        per_item = _alias("VideoClips", "clips_per_item", clips_per_item, "num_clips", num_clips, 1)
        super().__init__(column, per_item, starts, seed, decoder, open_files)
        frames = _alias("VideoClips", "frames", frames, "num_frames_per_clip", num_frames_per_clip, 8)
        frame_step = _alias(
            "VideoClips", "frame_step", frame_step, "num_indices_between_frames", num_indices_between_frames, 1
        )
        check_int("VideoClips.frames", frames, 1, "set frames: 8")
        check_int("VideoClips.frame_step", frame_step, 1, "set frame_step: 1")
        check_positive_number(
            "VideoClips.seconds_between_frames",
            seconds_between_frames,
            "set seconds_between_frames: 0.1",
            optional=True,
        )
        if seconds_between_frames is not None:
            fps = _alias("VideoClips", "fps", fps, "seconds_between_frames", 1.0 / seconds_between_frames, None)
        check_positive_number(
            "VideoClips.fps", fps, "set fps: 8 (frames per second of the video's time), or null", optional=True
        )
        self.frames = frames
        self.frame_step = frame_step
        self.fps = None if fps is None else float(fps)
        self.size = _check_size(size)
        regular = seconds_between_clip_starts is not None
        self._place_options(
            policy, sampling_range_start, sampling_range_end, seconds_between_clip_starts, seconds=regular
        )

    def shape_line(self) -> str:
        every = f"at {self.fps:g} fps" if self.fps else f"every {self.frame_step} frame(s)"
        unit = " s" if self.seconds_between_clip_starts is not None else " (frames)"
        every += self._placement_words("clips", unit, "the last frame")
        size = "native size" if self.size is None else f"{self.size[0]}x{self.size[1]}"
        return f"{self.frames} frame(s) {every}, {size}, uint8 [B, T, 3, H, W] + '{self.column}_timestamps'"


class AudioClips(ClipSampler):
    """Windows of ``seconds`` from an audio blob column: batches hold ``float32 [B, channels, samples]``.

    Args:
        column: The blob column holding one encoded audio file per row.
        seconds: Duration of each window.
        sample_rate: Samples per second of the output (the audio is resampled).
        channels: 1 (mono) or 2 (stereo): the audio is mixed to that layout (``num_channels``:
            TorchCodec's ``AudioDecoder`` name).
        clips_per_item: Windows drawn from each file per epoch (``num_clips``: TorchCodec's name).
        starts: ``"random"`` or ``"even"``, as for `VideoClips`.
        seed: Keys the random starts.
        decoder: ``"auto"`` or ``"pyav"``.
        open_files: Files kept open per process.
        sampling_range_start, sampling_range_end: Seconds a window may start in, ``[start, end)``,
            counted from the audio's first sample (the clock of the batches' ``'<column>_start'``),
            as TorchCodec's timestamp samplers (``clips_at_random_timestamps``): 0 or more; ``end``
            null: the last start where the window fits; an ``end`` past the audio is its end.
        policy: A window reaching past the audio's last sample: ``"repeat_last"`` (that sample
            repeated), ``"wrap"`` (the window's own samples again from its first) or ``"error"``
            (a bad row; the default, and the only choice of older versions).
        seconds_between_clip_starts: Regular timestamps (TorchCodec's
            ``clips_at_regular_timestamps``): window ``k`` of ``clips_per_item`` starts at
            ``sampling_range_start + k * seconds_between_clip_starts`` (on the output's sample
            grid); ``starts`` is then ignored. A start at or after the end is a bad row.
    """

    #: TorchCodec's names of ``clips_per_item`` and ``channels``, folded into them when made (as
    #: `VideoClips`').
    num_clips = num_channels = None

    def __init__(
        self,
        column: str = "audio",
        seconds: float = 1.0,
        sample_rate: int = 16000,
        channels: int | None = None,
        clips_per_item: int | None = None,
        starts: str = "random",
        seed: int = 0,
        decoder: str = "auto",
        open_files: int = 64,
        *,
        num_clips: int | None = None,
        num_channels: int | None = None,
        sampling_range_start: float | None = None,
        sampling_range_end: float | None = None,
        policy: str = "error",
        seconds_between_clip_starts: float | None = None,
    ) -> None:
        per_item = _alias("AudioClips", "clips_per_item", clips_per_item, "num_clips", num_clips, 1)
        super().__init__(column, per_item, starts, seed, decoder, open_files)
        channels = _alias("AudioClips", "channels", channels, "num_channels", num_channels, 1)
        check_positive_number("AudioClips.seconds", seconds, "set seconds: 1.0")
        check_int("AudioClips.sample_rate", sample_rate, 1, "set sample_rate: 16000")
        check_choice("AudioClips.channels", channels, (1, 2), "must be 1 (mono) or 2 (stereo)", "set channels: 1")
        self.seconds = float(seconds)
        self.sample_rate = sample_rate
        self.channels = channels
        self._place_options(
            policy, sampling_range_start, sampling_range_end, seconds_between_clip_starts, seconds=True, from_zero=True
        )

    @property
    def samples(self) -> int:
        """Samples per window."""
        return round(self.seconds * self.sample_rate)

    def shape_line(self) -> str:
        return (
            f"{self.seconds:g} s at {self.sample_rate} Hz, {self.channels} channel(s)"
            f"{self._placement_words('windows', ' s', 'the end')}, "
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


def _alias(kind: str, name: str, value: Any, other: str, other_value: Any, default: Any) -> Any:
    """``value`` or its TorchCodec-named alias ``other_value`` (``default`` when neither is given);
    both given is a `ConfigError` naming the two."""
    if value is not None and other_value is not None:
        raise ConfigError(
            f"{kind}.{other}",
            other_value,
            f"is another name of {name} (given too: {value!r}); the two cannot both be set",
            f"keep one of {name} and {other}",
        )
    return value if value is not None else other_value if other_value is not None else default


def _check_range(kind: str, start: Any, end: Any, seconds: bool, from_zero: bool) -> tuple[Any, Any]:
    """The sampling range: frame indices (ints, negative from the end), or seconds (0 or more
    when ``from_zero``: audio counts from its first sample)."""
    for name, value in (("sampling_range_start", start), ("sampling_range_end", end)):
        if value is None:
            continue
        if seconds:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(
                    f"{kind}.{name}", value, "must be a finite number of seconds", f"set {name}: 0.0, or null"
                )
            if from_zero and value < 0:
                raise ConfigError(
                    f"{kind}.{name}",
                    value,
                    "is before the audio's first sample (seconds count from it, as the batches' starts do)",
                    f"set {name}: 0.0 or more, or null",
                )
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"{kind}.{name}",
                value,
                "must be a frame index (an int; negative counts from the end) without seconds_between_clip_starts",
                f"set {name}: 0, or set seconds_between_clip_starts to give it in seconds",
            )
    if start is not None and end is not None and (start >= 0) == (end >= 0) and end <= start:
        raise ConfigError(
            f"{kind}.sampling_range_end", end, f"must be after sampling_range_start ({start})", "set a later end"
        )
    return (None if start is None else (float(start) if seconds else start)), (
        None if end is None else (float(end) if seconds else end)
    )
