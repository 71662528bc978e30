"""A media file cut at any byte (an interrupted upload, a partial copy) is a bad row or gives the
samples it holds: opening it and decoding a clip or window at the start, the middle or the end
either raises `BadMedia` or returns exactly what plain PyAV decodes from the same bytes (within
the codec's tolerance for lossy audio). Never another exception, never samples from elsewhere.

The oracle decodes the cut bytes from their start with plain PyAV, one decoder thread as the
package decodes (H.264 conceals a cut packet's damage differently with frame threads), and keeps
what decoded before the first error."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import av
import av.error
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lance_lightning.errors import BadMedia
from lance_lightning.media.audio import decode_audio_clip
from lance_lightning.media.containers import open_audio, open_video
from lance_lightning.media.video import decode_video_clip
from tests.media_corpus import by_name, corpus

AUDIOS = [item.name for item in corpus() if item.kind == "audio"]
VIDEOS = [item.name for item in corpus() if item.kind == "video"]


def decoded_audio(data: bytes, rate: int) -> np.ndarray:
    """Mono float32 samples at ``rate`` that plain PyAV decodes before the first error."""
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
    out = []
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(container.streams.audio[0]):
                out += resampler.resample(frame)
    except (av.error.FFmpegError, IndexError):
        pass
    out += resampler.resample(None)
    return np.concatenate([f.to_ndarray() for f in out], axis=1) if out else np.zeros((1, 0), np.float32)


def decoded_video(data: bytes) -> dict[float, np.ndarray]:
    """RGB frames by presentation time (s) that plain PyAV decodes before the first error."""
    frames = {}
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            for frame in container.decode(stream):
                frames[round(float(frame.time), 6)] = frame.to_ndarray(format="rgb24")
    except (av.error.FFmpegError, IndexError):
        pass
    return frames


def clip_of_cut(open_media: Callable[[Any], Any], decode: Callable[[Any], Any], data: bytes, whole: bool) -> Any:
    """What ``decode`` gives of ``data`` opened by ``open_media``; None for `BadMedia` (never for
    the ``whole`` file: the test would then check nothing)."""
    try:
        opened = open_media(io.BytesIO(data))
    except BadMedia:
        if whole:
            raise
        return None
    try:
        return decode(opened)
    except BadMedia:
        if whole:
            raise
        return None
    finally:
        opened.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(AUDIOS), cut=st.floats(0.0, 1.0), fraction=st.sampled_from([0.0, 0.5, 1.0]))
@example(name="stereo.mp3", cut=0.6, fraction=1.0)  # was a RuntimeError: the stream ended before the window
@example(name="stereo.opus", cut=1.0, fraction=1.0)  # the whole file: a window, never BadMedia
def test_an_audio_file_cut_anywhere_is_bad_media_or_the_samples_it_holds(
    name: str, cut: float, fraction: float
) -> None:
    item = by_name(name)
    data = item.data[: round(cut * len(item.data))]
    window = clip_of_cut(open_audio, lambda o: decode_audio_clip(o, fraction, 0.05, 16000, 1), data, cut == 1.0)
    if window is None:
        return
    first, count = round(window.start * 16000), window.samples.shape[1]
    expected = decoded_audio(data, 16000)[:, first : first + count]
    assert expected.shape[1] == count, f"{name} cut at {len(data)}: a window past what decodes"
    assert float(np.max(np.abs(window.samples - expected))) <= item.tolerance


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(VIDEOS), cut=st.floats(0.0, 1.0), fraction=st.sampled_from([0.0, 0.5, 1.0]))
@example(name="h264_mp2.ts", cut=0.6, fraction=1.0)  # its last frame's packet is cut
@example(name="h264_mp2.ts", cut=1.0, fraction=1.0)  # the whole file: a clip, never BadMedia
def test_a_video_file_cut_anywhere_is_bad_media_or_the_frames_it_holds(name: str, cut: float, fraction: float) -> None:
    item = by_name(name)
    data = item.data[: round(cut * len(item.data))]
    clip = clip_of_cut(open_video, lambda o: decode_video_clip(o, fraction, 3, 1.0, None), data, cut == 1.0)
    if clip is None:
        return
    frames = decoded_video(data)
    for frame, time in zip(clip.frames, clip.timestamps, strict=True):
        assert round(float(time), 6) in frames, f"{name} cut at {len(data)}: frame at {time} does not decode"
        np.testing.assert_array_equal(frame.transpose(1, 2, 0), frames[round(float(time), 6)])
