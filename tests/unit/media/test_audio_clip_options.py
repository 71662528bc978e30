"""Issue #52: `AudioClips` in TorchCodec's vocabulary (``sampling_range_start``/``_end`` in seconds,
``policy`` for windows past the end, ``seconds_between_clip_starts``, ``num_clips``/``num_channels``),
each window checked against a whole-stream PyAV decode of a corpus file (tests/media_corpus.py) at
indices computed here from the documented rule, and the placement's invariants with Hypothesis."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning import AudioClips
from lance_lightning.errors import BadMedia, ConfigError
from lance_lightning.media.audio import window_indices
from lance_lightning.media.decoders import ClipDecoder
from lance_lightning.media.place import ClipPlace, place_of
from lance_lightning.plan.clips import start_fractions
from tests.media_corpus import by_name, whole_audio

RATE = 16000  # every corpus audio file is 2.3 s: 36,800 samples at this rate
TOTAL = 36800


@functools.cache
def _whole(name: str, rate: int, channels: int) -> np.ndarray:
    return whole_audio(by_name(name).data, rate, channels)


def _window(sampler: AudioClips, fraction: float, name: str) -> tuple[np.ndarray, float]:
    decoder = ClipDecoder(sampler)
    opened = decoder.open(io.BytesIO(by_name(name).data))
    try:
        samples, start = decoder.decode(opened, fraction)
    finally:
        opened.close()
    return samples, float(start[0])


def _filled(first: int, count: int, total: int, policy: str) -> np.ndarray:
    """TorchCodec's policies on sample indices, written out: the window's samples inside the
    audio, then the last one repeated or the window's own samples again from its first."""
    valid = list(range(first, min(first + count, total)))
    if policy == "repeat_last":
        return np.array(valid + [valid[-1]] * (count - len(valid)))
    return np.array((valid * (count // len(valid) + 1))[:count])


def _assert_whole_decode_at(samples: np.ndarray, name: str, rate: int, channels: int, indices: np.ndarray) -> None:
    expected = _whole(name, rate, channels)[:, indices]
    assert samples.shape == expected.shape
    error = float(np.max(np.abs(samples - expected)))
    assert error <= by_name(name).tolerance, f"{name}: off by {error:.4g}"


@pytest.mark.parametrize("name", ["pcm.wav", "mono.flac", "stereo.mp3", "stereo.opus"])
@pytest.mark.parametrize("policy", ["repeat_last", "wrap"])
def test_a_window_past_the_end_follows_its_policy_as_the_whole_decode(name: str, policy: str) -> None:
    """0.5 s from 2.0 s of 2.3 s audio: 0.3 s of audio, then its last sample repeated
    (``repeat_last``) or the window's own samples again (``wrap``), at 16 kHz and the file's own rate."""
    item = by_name(name)
    for rate in (RATE, item.sample_rate):
        sampler = AudioClips(seconds=0.5, sample_rate=rate, sampling_range_start=2.0, policy=policy)
        samples, start = _window(sampler, 0.7, name)  # the range leaves one start: 2.0 s
        total = item.duration_samples * rate // item.sample_rate
        assert start == round(2.0 * rate) / rate
        _assert_whole_decode_at(samples, name, rate, 1, _filled(round(2.0 * rate), round(0.5 * rate), total, policy))


def test_a_window_past_the_end_with_policy_error_is_bad_media_and_a_long_window_fills_from_the_start() -> None:
    with pytest.raises(BadMedia, match=r"from 2\.000s to 2\.500s reaches past the audio's end \(2\.300s; policy"):
        _window(AudioClips(seconds=0.5, sample_rate=RATE, sampling_range_start=2.0), 0.0, "pcm.wav")
    # The default stays 'error' (a window longer than the audio is a bad row, as before) ...
    with pytest.raises(BadMedia, match=r"a window of 3s is longer than the audio \(2\.300s\)"):
        _window(AudioClips(seconds=3.0, sample_rate=RATE), 0.5, "pcm.wav")
    # ... and repeat_last / wrap fill one from the audio's first sample (TorchCodec's start when none fits).
    for policy in ("repeat_last", "wrap"):
        samples, start = _window(AudioClips(seconds=3.0, sample_rate=RATE, policy=policy), 0.5, "mono.flac")
        assert start == 0.0
        _assert_whole_decode_at(samples, "mono.flac", RATE, 1, _filled(0, 3 * RATE, TOTAL, policy))


@settings(max_examples=25, deadline=None)
@given(
    fraction=st.floats(0.0, 1.0),
    start=st.integers(0, 2200),  # milliseconds
    length=st.integers(1, 1500),
    seconds=st.sampled_from([0.05, 0.3, 0.8]),
)
def test_a_window_starts_within_its_sampling_range_and_is_the_whole_decode(
    fraction: float, start: int, length: int, seconds: float
) -> None:
    """Windows start in ``[start, end)`` seconds (an end past the audio: the audio's end) at
    ``low + round(fraction * (high - 1 - low))``; samples past the end wrap (FLAC: bit-exact)."""
    low, end = start / 1000, (start + length) / 1000
    sampler = AudioClips(
        seconds=seconds, sample_rate=RATE, sampling_range_start=low, sampling_range_end=end, policy="wrap"
    )
    samples, first_seconds = _window(sampler, fraction, "mono.flac")
    first = round(first_seconds * RATE)
    high = min(round(end * RATE), TOTAL)
    assert round(low * RATE) <= first < high and low - 1 / RATE < first_seconds < end
    assert first == round(low * RATE) + round(fraction * (high - 1 - round(low * RATE)))
    _assert_whole_decode_at(samples, "mono.flac", RATE, 1, _filled(first, round(seconds * RATE), TOTAL, "wrap"))


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(1, 50_000),
    count=st.integers(1, 60_000),
    rate=st.sampled_from([8000, 16000, 44100]),
    start=st.none() | st.floats(0.0, 6.0),
    length=st.none() | st.floats(0.001, 6.0),
    fraction=st.floats(0.0, 1.0),
    policy=st.sampled_from(["repeat_last", "wrap", "error"]),
)
def test_window_placement_invariants(
    total: int, count: int, rate: int, start: float | None, length: float | None, fraction: float, policy: str
) -> None:
    """Every window has ``count`` samples, all inside the audio; it starts inside the sampling
    range; its samples inside the audio are consecutive from its start and the rest follow the
    policy; ``error`` refuses exactly the windows reaching past the end."""
    end = None if length is None else (start or 0.0) + length
    low = 0 if start is None else round(start * rate)
    place = ClipPlace(policy, start, end)
    if low >= total:
        with pytest.raises(BadMedia, match="sampling_range_start"):
            window_indices(total, count, rate, fraction, place)
        return
    high = max(total - count + 1 if end is None else min(round(end * rate), total), low + 1)
    first = low + round(fraction * (high - 1 - low))
    if policy == "error" and first + count > total:
        with pytest.raises(BadMedia, match="longer than the audio|reaches past the audio's end"):
            window_indices(total, count, rate, fraction, place)
        return
    indices = window_indices(total, count, rate, fraction, place)
    assert len(indices) == count and indices[0] == first and low <= first < high
    assert indices.min() >= 0 and indices.max() < total
    assert np.array_equal(indices, _filled(first, count, total, policy if policy != "error" else "wrap"))
    if end is None and count <= total - low:  # the default end: the window always fits
        assert first + count <= total


@settings(max_examples=50, deadline=None)
@given(
    per_item=st.integers(1, 6),
    every=st.floats(0.01, 3.0),
    start=st.none() | st.floats(0.0, 5.0),
    epoch=st.integers(0, 5),
    rows=st.integers(1, 4),
)
def test_regular_timestamps_space_windows_every_given_seconds(
    per_item: int, every: float, start: float | None, epoch: int, rows: int
) -> None:
    """Window ``k`` of each row starts at ``round((start + k * every) * rate)`` every epoch (the
    planned fractions are ``k / (K - 1)``; ``starts`` is ignored), or is bad media at or after the end."""
    sampler = AudioClips(
        seconds=0.1, sample_rate=RATE, clips_per_item=per_item, seconds_between_clip_starts=every,
        sampling_range_start=start, starts="random", policy="wrap",
    )  # fmt: skip
    units = np.arange(rows * per_item)
    for unit, fraction in zip(units, start_fractions(sampler, epoch, units), strict=True):
        k = int(unit) % per_item
        place = place_of(sampler, 0.0, float(fraction))
        at = (start or 0.0) + k * every
        assert place.at_seconds == pytest.approx(at, abs=1e-9)
        if round(at * RATE) >= TOTAL:
            with pytest.raises(BadMedia, match="regular start"):
                window_indices(TOTAL, 1600, RATE, float(fraction), place)
            continue
        assert window_indices(TOTAL, 1600, RATE, float(fraction), place)[0] == round(place.at_seconds * RATE)


def test_regular_windows_are_the_whole_decode_at_their_starts() -> None:
    """``seconds_between_clip_starts: 0.7`` from 0.2 s: windows at 0.2, 0.9, 1.6 and 2.3 s; the
    third reaches past the end (``repeat_last``), the fourth starts at the end: bad media."""
    sampler = AudioClips(
        seconds=0.8, sample_rate=RATE, channels=2, num_clips=4, seconds_between_clip_starts=0.7,
        sampling_range_start=0.2, policy="repeat_last",
    )  # fmt: skip
    fractions = start_fractions(sampler, 3, np.arange(4))
    for k, fraction in enumerate(fractions[:3]):
        samples, start = _window(sampler, float(fraction), "pcm.wav")
        first = round((0.2 + 0.7 * k) * RATE)
        assert start == first / RATE
        _assert_whole_decode_at(samples, "pcm.wav", RATE, 2, _filled(first, round(0.8 * RATE), TOTAL, "repeat_last"))
    with pytest.raises(BadMedia, match=r"regular start 2\.300s is at or after the end \(2\.300s\)"):
        _window(sampler, float(fractions[3]), "pcm.wav")


def test_torchcodec_names_are_aliases_and_old_configs_describe_as_before() -> None:
    from lance_lightning.hparams import describe

    old = AudioClips(seconds=0.5, channels=2, clips_per_item=3)
    assert old == AudioClips(seconds=0.5, num_channels=2, num_clips=3)
    # the description of an older config has exactly the keys it had (a saved cursor still fits)
    keys = {"kind", "column", "per_item", "starts", "seed", "seconds", "sample_rate", "channels"}
    assert set(old.describe()) == keys
    placed = AudioClips(seconds=0.5, sampling_range_start=0.25, sampling_range_end=2, policy="wrap")
    assert set(placed.describe()) == keys | {"policy", "sampling_range_start", "sampling_range_end"}
    assert placed.sampling_range_end == 2.0 and placed != AudioClips(seconds=0.5)
    for sampler in (placed, AudioClips(num_channels=2, seconds_between_clip_starts=0.5, num_clips=2)):
        assert type(sampler)(**describe(sampler)["init_args"]) == sampler
    assert AudioClips(seconds=0.5, seconds_between_clip_starts=0.25, policy="wrap").shape_line() == (
        "0.5 s at 16000 Hz, 1 channel(s), windows every 0.25 s, past the end: wrap, "
        "float32 [B, 1, 8000] + 'audio_start'"
    )


@pytest.mark.parametrize(
    ("kwargs", "param", "fix"),
    [
        ({"channels": 2, "num_channels": 2}, "AudioClips.num_channels", "keep one of channels and num_channels"),
        ({"clips_per_item": 2, "num_clips": 2}, "AudioClips.num_clips", "keep one of clips_per_item"),
        ({"num_channels": 3}, "AudioClips.channels", "set channels: 1"),
        ({"policy": "pad"}, "AudioClips.policy", "repeat_last, wrap or error"),
        ({"sampling_range_start": -1.0}, "AudioClips.sampling_range_start", "0.0 or more"),
        ({"sampling_range_end": float("inf")}, "AudioClips.sampling_range_end", "set sampling_range_end: 0.0"),
        ({"sampling_range_start": "1s"}, "AudioClips.sampling_range_start", "set sampling_range_start"),
        ({"sampling_range_start": 2.0, "sampling_range_end": 1.5}, "AudioClips.sampling_range_end", "later end"),
        ({"seconds_between_clip_starts": 0}, "AudioClips.seconds_between_clip_starts", "seconds_between_clip"),
        ({"seconds_between_clip_starts": float("nan")}, "AudioClips.seconds_between_clip_starts", "or null"),
    ],
)
def test_bad_audio_clip_options_name_the_parameter_and_the_fix(kwargs: dict, param: str, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        AudioClips(**kwargs)
    assert error.value.param == param and fix in error.value.fix
