"""Audio windows decoded from a file object are bit for bit the whole stream decoded and resampled."""

from __future__ import annotations

import dataclasses
import functools
import io

import av
import numpy as np
import pytest

from lance_lightning.errors import BadMedia
from lance_lightning.media.audio import LAYOUTS, decode_audio_clip
from lance_lightning.media.containers import open_audio
from lance_lightning.media.synthetic import encode_audio, tone

SOURCE_RATE, SECONDS = 44100, 3.0


@functools.cache
def audio(codec: str) -> bytes:
    return encode_audio(tone(5, SECONDS, SOURCE_RATE, seed=3, channels=2), SOURCE_RATE, codec)


@functools.cache
def whole(codec: str, sample_rate: int, channels: int) -> np.ndarray:
    """The whole stream decoded and resampled by plain PyAV, flushed at the end."""
    resampler = av.AudioResampler(format="fltp", layout=LAYOUTS[channels], rate=sample_rate)
    with av.open(io.BytesIO(audio(codec))) as container:
        frames = [out for frame in container.decode(audio=0) for out in resampler.resample(frame)]
    frames += resampler.resample(None)
    return np.concatenate([frame.to_ndarray() for frame in frames], axis=1)


@pytest.mark.parametrize("codec", ["flac", "pcm_s16le"])
@pytest.mark.parametrize("sample_rate, channels", [(44100, 2), (16000, 1), (48000, 2), (22050, 1)])
def test_a_window_is_the_whole_resampled_stream_at_its_samples(codec, sample_rate, channels) -> None:
    expected = whole(codec, sample_rate, channels)
    count = round(0.75 * sample_rate)
    opened = open_audio(io.BytesIO(audio(codec)))
    assert (opened.sample_rate, opened.samples, opened.duration) == (SOURCE_RATE, SECONDS * SOURCE_RATE, SECONDS)
    # One open stream serves windows in any order (the end first, then the start).
    for fraction in [1.0, 0.0, 0.37, 0.5]:
        window = decode_audio_clip(opened, fraction, 0.75, sample_rate, channels)
        first = round(fraction * (expected.shape[1] - count))
        assert window.start == first / sample_rate
        assert window.samples.shape == (channels, count) and window.samples.dtype == np.float32
        # Exact, with no tolerance: decoding starts on a sample both rates share, early enough for
        # the resampling filter, so the resampler computes the same sums as over the whole stream.
        np.testing.assert_array_equal(window.samples, expected[:, first : first + count], err_msg=f"{fraction}")
    opened.close()


def test_a_window_longer_than_the_audio_is_bad_media() -> None:
    opened = open_audio(io.BytesIO(audio("flac")))
    with pytest.raises(BadMedia, match=r"a window of 3.5s is longer than the audio \(3.000s\)"):
        decode_audio_clip(opened, 0.0, 3.5, 16000, 1)
    assert decode_audio_clip(opened, 0.0, SECONDS, 16000, 1).samples.shape == (1, 48000)  # all of it fits
    opened.close()


@pytest.mark.parametrize("codec", ["flac", "pcm_s16le"])
def test_audio_that_ends_before_its_header_says_is_bad_media(codec) -> None:
    opened = open_audio(io.BytesIO(audio(codec)))
    opened = dataclasses.replace(opened, samples=opened.samples + SOURCE_RATE // 2)
    with pytest.raises(BadMedia, match="samples short of the window"):
        decode_audio_clip(opened, 1.0, 1.0, 16000, 2)
    opened.close()


def test_bad_arguments_and_bad_files() -> None:
    opened = open_audio(io.BytesIO(audio("pcm_s16le")))
    for fraction, seconds, rate, channels in [(1.5, 1.0, 16000, 1), (0.5, 0.0, 16000, 1), (0.5, 1.0, 16000, 3)]:
        with pytest.raises(ValueError):
            decode_audio_clip(opened, fraction, seconds, rate, channels)
    opened.close()
    flac = audio("flac")
    for data in [flac[: len(flac) // 3], b"RIFF" + bytes(2000)]:
        with pytest.raises(BadMedia):
            decode_audio_clip(open_audio(io.BytesIO(data)), 0.5, 0.5, 16000, 1)


def test_synthetic_audio_is_deterministic_and_flac_carries_a_seektable() -> None:
    samples = tone(5, SECONDS, SOURCE_RATE, seed=3, channels=2)
    np.testing.assert_array_equal(samples, tone(5, SECONDS, SOURCE_RATE, seed=3, channels=2))
    assert not np.array_equal(samples, tone(5, SECONDS, SOURCE_RATE, seed=4, channels=2))
    assert samples.shape == (2, SECONDS * SOURCE_RATE) and np.abs(samples).max() <= 1
    for codec in ["flac", "pcm_s16le"]:
        assert encode_audio(samples, SOURCE_RATE, codec) == audio(codec)
    # The seektable points at frame starts: FFmpeg indexes it (with +fastseek) and decodes the same.
    with av.open(io.BytesIO(audio("flac")), options={"fflags": "+fastseek"}) as container:
        assert len(container.streams.audio[0].index_entries) > 10
        decoded = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)
    pcm = np.round(samples * 32767).astype(np.int16)
    np.testing.assert_array_equal(decoded.reshape(-1, 2).T, pcm)
