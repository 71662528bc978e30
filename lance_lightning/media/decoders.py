"""The clip decoder of a sampler: which library decodes, and the media kept open per process.

Guarantees:
- `clip_decoder(sampler)` returns one `ClipDecoder` per sampler per process, so the media it keeps
  open (`lance_lightning.media.containers.MediaPool`, at most ``sampler.open_files``) outlive a
  reader and an epoch: a video's headers and index are read once while it stays open, and
  resident memory is bounded by the pool, not by the number of videos.
- PyAV decodes (its wheels bundle FFmpeg: nothing to install beside ``uv sync``). A missing PyAV
  is a `ConfigError` naming ``clips.decoder`` and what to install, raised when the split is
  planned (``explain`` calls `decoder_line`), in the main process.
- `decoder_line` says which decoder runs and why, with TorchCodec's state on this machine (its
  video and audio decoders need the system's FFmpeg libraries; probed once per process).
- ``decode`` returns one clip's arrays or raises `BadMedia` (the reader applies the bad-row policy).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Hashable
from typing import IO, Any

import numpy as np

from lance_lightning.errors import ConfigError
from lance_lightning.media.place import place_of
from lance_lightning.media.samplers import AudioClips, ClipSampler, VideoClips


def check_pyav() -> Any:
    """The ``av`` module, or `ConfigError` saying what to install."""
    try:
        import av
    except ImportError as error:
        raise ConfigError(
            "clips.decoder",
            "pyav",
            f"PyAV cannot be imported ({error}), and clips are decoded with it",
            "install it: `uv add av` (its wheels bundle FFmpeg; no system package is needed)",
        ) from None
    return av


@functools.cache
def torchcodec_state() -> str:
    """Whether TorchCodec's video decoder works here, in a few words (decodes a tiny clip once)."""
    try:
        from torchcodec.decoders import VideoDecoder

        from lance_lightning.media.synthetic import encode_video

        frames = np.zeros((2, 16, 16, 3), dtype=np.uint8)
        VideoDecoder(encode_video(frames, fps=2, gop=1)).get_frame_at(0)
    except Exception as error:  # noqa: BLE001 - any failure means: not usable here
        first = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(":. ")
        return f"TorchCodec video decoding is unavailable here ({first[:100]}: it needs the system's FFmpeg libraries)"
    return "TorchCodec video decoding works here too; clips decode through PyAV, this package's clip decoder"


def decoder_line(sampler: ClipSampler) -> str:
    """Which decoder runs for ``sampler`` and why (for ``explain``)."""
    av = check_pyav()
    ffmpeg = getattr(av, "ffmpeg_version_info", None) or "?"
    chosen = "chosen" if sampler.decoder == "pyav" else "auto"
    return (
        f"PyAV {av.__version__} (FFmpeg {ffmpeg}, bundled with its wheels; decoder={chosen!r}), "
        f"{sampler.open_files} file(s) kept open per process; {torchcodec_state()}"
    )


class ClipDecoder:
    """Decodes clips of one sampler, keeping up to ``sampler.open_files`` media open."""

    def __init__(self, sampler: ClipSampler) -> None:
        from lance_lightning.media.containers import MediaPool

        check_pyav()
        self.sampler = sampler
        self.pool = MediaPool(sampler.open_files)

    def opened(self, key: Hashable) -> Any | None:
        """The open media of ``key`` if the pool holds it (then this thread's until `release`)."""
        return self.pool.checkout(key)

    def open(self, file: IO[bytes]) -> Any:
        """``file`` opened as media of the sampler's kind (headers parsed); `BadMedia` if it is not."""
        from lance_lightning.media.containers import open_audio, open_video

        return open_audio(file) if isinstance(self.sampler, AudioClips) else open_video(file)

    def release(self, key: Hashable, opened: Any) -> None:
        """Give ``opened`` back to the pool (the least recently used beyond the bound is closed)."""
        self.pool.checkin(key, opened)

    def decode(self, opened: Any, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """The clip starting at ``fraction`` of the room ``opened`` leaves after it: (media array,
        times): video ``uint8 [T, 3, H, W]`` and frame times ``float64 [T]``; audio ``float32
        [channels, samples]`` and the start time ``float64 [1]``; within the sampler's sampling
        range, past the end as its ``policy`` says (`lance_lightning.media.place`). `BadMedia` if
        it cannot."""
        sampler = self.sampler
        if isinstance(sampler, VideoClips):
            from lance_lightning.media.video import decode_video_clip, frame_step

            step = frame_step(opened, None if sampler.fps else sampler.frame_step, sampler.fps)
            place = place_of(sampler, opened.start_time, fraction)
            clip = decode_video_clip(opened, fraction, sampler.frames, step, sampler.size, place)
            return clip.frames, clip.timestamps
        from lance_lightning.media.audio import decode_audio_clip

        assert isinstance(sampler, AudioClips)
        place = place_of(sampler, 0.0, fraction)  # audio's clock starts at its first sample
        window = decode_audio_clip(opened, fraction, sampler.seconds, sampler.sample_rate, sampler.channels, place)
        return window.samples, np.array([window.start], dtype=np.float64)


_DECODERS: dict[ClipSampler, ClipDecoder] = {}
_LOCK = threading.Lock()


def clip_decoder(sampler: ClipSampler) -> ClipDecoder:
    """This process's decoder of ``sampler`` (made on first use)."""
    with _LOCK:
        decoder = _DECODERS.get(sampler)
        if decoder is None:
            decoder = _DECODERS[sampler] = ClipDecoder(sampler)
        return decoder


def close_decoders() -> None:
    """Close every open media of this process (tests, and a caller that wants the memory back)."""
    with _LOCK:
        for decoder in _DECODERS.values():
            decoder.pool.clear()
        _DECODERS.clear()
