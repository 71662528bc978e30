"""Every file of the media corpus (`tests/media_corpus.py`: the containers and codecs users' files
come in) decodes, at the first, middle and last possible clip, to exactly what a whole-stream PyAV
decode gives at those indices (within the stated tolerance for lossy audio), and the length the
planner uses is the whole-stream decode's."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lance_lightning.media.audio import LAYOUTS, decode_audio_clip, tolerance
from lance_lightning.media.containers import open_audio, open_video
from lance_lightning.media.video import decode_video_clip
from tests.media_corpus import by_name, corpus, missing_encoders, whole_audio, whole_video_rgb

VIDEOS = [item.name for item in corpus() if item.kind == "video"]
AUDIOS = [item.name for item in corpus() if item.kind == "audio"]
FRACTIONS = (0.0, 0.5, 1.0, 0.3)
AUDIO_FRACTIONS = (0.0, 1.0, *np.linspace(0.05, 0.95, 10).tolist())


def test_the_corpus_has_every_container_and_codec() -> None:
    """This wheel has every encoder the corpus uses; a missing one would leave its files out."""
    assert missing_encoders() == []
    assert {item.name.rsplit(".", 1)[1] for item in corpus()} == {
        "mp4", "mov", "mkv", "webm", "avi", "ts", "wav", "flac", "mp3", "m4a", "opus", "mka"
    }  # fmt: skip


@functools.cache
def rgb(name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    return whole_video_rgb(by_name(name).data, size)


@pytest.mark.parametrize("name", VIDEOS)
def test_video_clips_are_the_whole_decode_at_their_indices(name: str) -> None:
    item = by_name(name)
    expected = rgb(name)
    opened = open_video(io.BytesIO(item.data))
    try:
        # The planner's frame count is the whole decode's: never a frame past the last one.
        assert opened.frames == item.frames == len(expected)
        for frames, step in [(4, 1.0), (3, 2.5), (item.frames, 1.0)]:
            span = round((frames - 1) * step) + 1
            for fraction in FRACTIONS:
                clip = decode_video_clip(opened, fraction, frames, step, None)
                first = int(np.floor(fraction * (item.frames - span)))
                indices = first + np.round(np.arange(frames) * step).astype(int)
                where = f"{name} fraction {fraction} frames {frames} step {step}: indices {indices.tolist()}"
                np.testing.assert_array_equal(clip.frames.transpose(0, 2, 3, 1), expected[indices], err_msg=where)
                np.testing.assert_allclose(clip.timestamps, np.array(item.frame_times)[indices], err_msg=where)
    finally:
        opened.close()


@pytest.mark.parametrize("name", VIDEOS[:6])
def test_video_clips_resized_are_the_whole_decode_resized(name: str) -> None:
    item = by_name(name)
    expected = rgb(name, (24, 40))
    opened = open_video(io.BytesIO(item.data))
    try:
        for fraction in (1.0, 0.0):
            clip = decode_video_clip(opened, fraction, 5, 2.0, (24, 40))
            first = int(np.floor(fraction * (item.frames - 9)))
            np.testing.assert_array_equal(clip.frames.transpose(0, 2, 3, 1), expected[first : first + 9 : 2])
    finally:
        opened.close()


@functools.cache
def pcm(name: str, sample_rate: int, channels: int) -> np.ndarray:
    return whole_audio(by_name(name).data, sample_rate, channels)


@pytest.mark.parametrize("name", AUDIOS)
@pytest.mark.parametrize("rate, channels", [(None, None), (16000, 1)])
def test_audio_windows_are_the_whole_decode_at_their_samples(name: str, rate: int | None, channels: int | None) -> None:
    """Windows at the start, the middle and the end, at the file's own rate and resampled: WAV and
    FLAC bit-exact, MP3, AAC and Opus within `tolerance` of their codec (decoder pre-roll and the
    encoder's delay handled)."""
    item = by_name(name)
    rate, channels = rate or item.sample_rate, channels or item.channels
    expected = pcm(name, rate, channels)
    atol = tolerance(item.codecs[0])
    assert atol == item.tolerance
    opened = open_audio(io.BytesIO(item.data))
    try:
        # The length the planner uses: the container's (the decode adds AAC's end padding only).
        assert opened.samples == item.duration_samples <= item.samples
        total = opened.samples * rate // item.sample_rate
        assert total <= expected.shape[1]
        count = round(0.4 * rate)
        for fraction in AUDIO_FRACTIONS:
            window = decode_audio_clip(opened, fraction, 0.4, rate, channels)
            first = round(fraction * (total - count))
            assert window.start == first / rate
            want = expected[:, first : first + count]
            error = float(np.max(np.abs(window.samples - want)))
            assert error <= atol, f"{name} at {fraction} ({first}): off by {error:.4g} > {atol}"
    finally:
        opened.close()


@pytest.mark.parametrize("name", AUDIOS)
def test_short_windows_starting_in_the_last_frames_are_the_whole_decode(name: str) -> None:
    """Windows of 0.05 s starting in the last 0.3 s (every 10 ms), one open file for all: FFmpeg's
    FLAC demuxer refuses a seek inside a file's last frames (EPERM), which made every such window
    of ``mono.flac`` from 2.02 s a bad row (the 0.4 s windows above never start there);
    ``decode_from`` now seeks earlier instead. FFmpeg's Ogg demuxer, seeking again after a decode
    stopped mid-page, mistimed the packets after the landing point (``stereo.opus`` from 2.2 s:
    the stream seemed to end short, a raw ``RuntimeError``); an Ogg file is now reopened before
    each window but its first."""
    item = by_name(name)
    expected = pcm(name, 16000, 1)
    opened = open_audio(io.BytesIO(item.data))
    try:
        total, count = opened.samples * 16000 // item.sample_rate, 800
        for first in range(total - count - 4800, total - count + 1, 160):
            window = decode_audio_clip(opened, first / (total - count), 0.05, 16000, 1)
            assert window.start == first / 16000
            error = float(np.max(np.abs(window.samples - expected[:, first : first + count])))
            assert error <= item.tolerance, f"{name} at {first}: off by {error:.4g}"
    finally:
        opened.close()


@pytest.mark.parametrize("name", AUDIOS)
def test_windows_in_any_order_from_one_open_file_are_the_whole_decode(name: str) -> None:
    """A reused open file (as `MediaPool` keeps it) serves windows in a shuffled order over the
    whole stream, each after another stopped wherever it filled: every one is the whole decode."""
    item = by_name(name)
    expected = pcm(name, 16000, 1)
    opened = open_audio(io.BytesIO(item.data))
    try:
        total, count = opened.samples * 16000 // item.sample_rate, 800
        starts = np.random.default_rng(7).permutation(np.arange(0, total - count + 1, 97))[:80]
        for first in (*starts.tolist(), total - count, 0):
            window = decode_audio_clip(opened, first / (total - count), 0.05, 16000, 1)
            error = float(np.max(np.abs(window.samples - expected[:, first : first + count])))
            assert error <= item.tolerance, f"{name} at {first}: off by {error:.4g}"
    finally:
        opened.close()


def test_lossless_tolerance_is_zero_and_channels_are_the_layouts() -> None:
    assert tolerance("flac") == tolerance("pcm_s16le") == 0.0
    assert set(LAYOUTS) == {1, 2}


WITH_AUDIO = [item.name for item in corpus() if item.kind == "video" and len(item.codecs) > 1]


@pytest.mark.parametrize("name", WITH_AUDIO)
def test_audio_tracks_of_videos_give_the_whole_decode(name: str) -> None:
    """``AudioClips`` over a video's audio track (AAC in MP4, MOV and Matroska, Opus in WebM, MP3 in
    AVI, MP2 in MPEG-TS starting at 1 s): windows at the start, middle and end within the codec's
    tolerance. Matroska and WebM time audio in milliseconds and give it no duration of its own:
    frames are placed on the stream's frame grid and its length counted from its packets."""
    item = by_name(name)
    expected = whole_audio(item.data)
    opened = open_audio(io.BytesIO(item.data))
    try:
        rate, count = opened.sample_rate, round(0.3 * opened.sample_rate)
        assert opened.samples <= expected.shape[1]
        for fraction in (0.0, 0.5, 1.0):
            window = decode_audio_clip(opened, fraction, 0.3, rate, 2)
            first = round(fraction * (opened.samples - count))
            error = float(np.max(np.abs(window.samples - expected[:, first : first + count])))
            assert error <= tolerance(item.codecs[1]), f"{name} at {fraction}: off by {error:.4g}"
    finally:
        opened.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["h264_start125.mkv", "mpeg4_mp3.avi", "h264_vfr.mp4", "h264_bframes_aac.mp4", "h264_mp2.ts"]),
    fraction=st.floats(0.0, 1.0),
    frames=st.integers(1, 6),
    step=st.sampled_from([1.0, 2.0, 0.5, 2.4, 3.0]),
)
def test_any_clip_of_a_tricky_video_is_the_whole_decode(name: str, fraction: float, frames: int, step: float) -> None:
    """Any clip that fits, anywhere: the whole decode's frames at its indices, never past the end."""
    item = by_name(name)
    span = round((frames - 1) * step) + 1
    opened = open_video(io.BytesIO(item.data))
    try:
        clip = decode_video_clip(opened, fraction, frames, step, None)
    finally:
        opened.close()
    indices = int(np.floor(fraction * (item.frames - span))) + np.round(np.arange(frames) * step).astype(int)
    assert indices[-1] < item.frames
    np.testing.assert_array_equal(clip.frames.transpose(0, 2, 3, 1), rgb(name)[indices])
    np.testing.assert_allclose(clip.timestamps, np.array(item.frame_times)[indices])
