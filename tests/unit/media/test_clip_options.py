"""Issue #52: clip options in TorchCodec's vocabulary (``policy``, ``sampling_range_start/end``,
``seconds_between_clip_starts``, ``num_clips``/``num_frames_per_clip``/...), each checked against
a whole-stream PyAV decode of a corpus video (tests/media_corpus.py)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning import VideoClips
from lance_lightning.errors import BadMedia, ConfigError
from lance_lightning.media.decoders import ClipDecoder
from lance_lightning.plan.clips import start_fractions
from tests.media_corpus import by_name, whole_video_rgb

SHORT = by_name("h264.mp4")  # 36 frames at 24 fps, 64x48
SIZE = (48, 64)


def _clip(sampler: VideoClips, fraction: float, name: str = "h264.mp4") -> tuple[np.ndarray, np.ndarray]:
    decoder = ClipDecoder(sampler)
    opened = decoder.open(io.BytesIO(by_name(name).data))
    try:
        return decoder.decode(opened, fraction)
    finally:
        opened.close()


def _expected(indices: list[int], item=SHORT) -> tuple[np.ndarray, np.ndarray]:
    pixels = whole_video_rgb(item.data)[indices].transpose(0, 3, 1, 2)
    return pixels, np.array([item.frame_times[i] for i in indices])


# 8 frames every 2 from frame 30 of 36: frames 30, 32, 34, then past the end.
PAST_END = {"frames": 8, "frame_step": 2, "sampling_range_start": 30}


@pytest.mark.parametrize(
    ("policy", "indices"),
    [
        ("repeat_last", [30, 32, 34, 34, 34, 34, 34, 34]),  # TorchCodec: the last valid frame repeated
        ("wrap", [30, 32, 34, 30, 32, 34, 30, 32]),  # TorchCodec: the clip's own frames again
    ],
)
def test_a_clip_past_the_end_follows_its_policy(policy: str, indices: list[int]) -> None:
    pixels, times = _clip(VideoClips(**PAST_END, policy=policy), 0.0)
    expected_pixels, expected_times = _expected(indices)
    assert np.array_equal(pixels, expected_pixels) and np.array_equal(times, expected_times)


def test_a_clip_past_the_end_with_policy_error_is_bad_media_with_its_reason() -> None:
    with pytest.raises(BadMedia, match=r"from frame 30 reaches frame 44, past the video's 36 frames \(policy 'error'"):
        _clip(VideoClips(**PAST_END, policy="error"), 0.0)
    # The default is 'error', as before (a clip longer than the video is a bad row).
    with pytest.raises(BadMedia, match="spans 71 frames, the video has 36"):
        _clip(VideoClips(frames=36, frame_step=2), 0.5)
    # ... and repeat_last fills a video shorter than the clip, from its first frame.
    pixels, _ = _clip(VideoClips(frames=20, frame_step=2, policy="repeat_last"), 0.7)
    assert np.array_equal(pixels, _expected([*range(0, 36, 2), 34, 34])[0])  # the clip's last valid frame


@settings(max_examples=30, deadline=None)
@given(
    fraction=st.floats(0.0, 1.0),
    start=st.integers(-35, 30),
    length=st.integers(1, 40),
)
def test_a_clip_starts_within_its_sampling_range(fraction: float, start: int, length: int) -> None:
    """Clips start in ``[start, end)`` (negative: from the end), as TorchCodec's index samplers,
    and their frames are the whole decode's at those indices."""
    low = start + 36 if start < 0 else start
    end = low + length
    sampler = VideoClips(frames=3, frame_step=2, sampling_range_start=start, sampling_range_end=end, policy="wrap")
    pixels, times = _clip(sampler, fraction)
    first = SHORT.frame_times.index(times[0])
    assert low <= first <= min(end, 36) - 1
    assert first == low + math.floor(fraction * max(min(end, 36) - 1 - low, 0))
    indices = [first + 2 * i for i in range(3)]
    valid = [i for i in indices if i < 36]
    indices = (valid * 3)[:3]  # wrap
    assert np.array_equal(pixels, _expected(indices)[0])


def test_regular_timestamps_start_each_clip_every_given_seconds() -> None:
    """``seconds_between_clip_starts``: clip ``k`` starts at the first frame at or after
    ``start + k * seconds`` (the video's first frame's time when no range start: 1.25 s here)."""
    item = by_name("h264_start125.mkv")
    sampler = VideoClips(frames=3, clips_per_item=4, seconds_between_clip_starts=0.5)
    fractions = start_fractions(sampler, 7, np.arange(4))  # any epoch: regular starts do not move
    for k, fraction in enumerate(fractions):
        pixels, times = _clip(sampler, float(fraction), item.name)
        first = next(i for i, t in enumerate(item.frame_times) if t >= 1.25 + 0.5 * k - 1e-9)
        expected = _expected([first, first + 1, first + 2], item)
        assert np.array_equal(pixels, expected[0]) and np.array_equal(times, expected[1]), k
    # from a range start, in seconds; a start after the last frame is bad media naming it
    sampler = VideoClips(frames=2, clips_per_item=3, seconds_between_clip_starts=1.0, sampling_range_start=2.0)
    _, times = _clip(sampler, 0.0, item.name)
    assert times[0] == next(t for t in item.frame_times if t >= 2.0)
    with pytest.raises(BadMedia, match=r"regular start 4\.000s is at or after the end"):
        _clip(sampler, 1.0, item.name)


def test_torchcodec_names_are_aliases_and_old_configs_describe_as_before() -> None:
    old = VideoClips(frames=4, frame_step=2, clips_per_item=3, fps=None)
    new = VideoClips(num_frames_per_clip=4, num_indices_between_frames=2, num_clips=3)
    assert old.describe() == new.describe() and old == new
    # the description of an older config has exactly the keys it had (a saved cursor still fits)
    assert set(old.describe()) == {
        "kind",
        "column",
        "per_item",
        "starts",
        "seed",
        "frames",
        "frame_step",
        "fps",
        "size",
    }
    assert VideoClips(seconds_between_frames=0.125).fps == 8.0
    assert "policy" in VideoClips(policy="wrap").describe()


def test_a_sampler_made_with_torchcodec_names_is_rebuilt_from_its_saved_hyperparameters() -> None:
    """`LanceDataModule` saves a sampler as its constructor's arguments (`lance_lightning.hparams`)
    for ``load_from_checkpoint``: one made with the aliases must describe itself and rebuild equal
    (an alias without an attribute left the sampler out of the hyperparameters)."""
    from lance_lightning import AudioClips
    from lance_lightning.hparams import describe

    for sampler in (
        VideoClips(
            num_frames_per_clip=4, num_clips=2, seconds_between_frames=0.25, policy="wrap", sampling_range_start=-5
        ),
        VideoClips(frames=3, seconds_between_clip_starts=0.5, sampling_range_start=1.0),
        AudioClips(num_clips=3, seconds=0.5),
    ):
        saved = describe(sampler)
        assert type(sampler)(**saved["init_args"]) == sampler


@pytest.mark.parametrize(
    ("kwargs", "param", "fix"),
    [
        ({"frames": 4, "num_frames_per_clip": 8}, "VideoClips.num_frames_per_clip", "keep one of frames"),
        ({"clips_per_item": 2, "num_clips": 2}, "VideoClips.num_clips", "keep one of clips_per_item"),
        ({"fps": 8, "seconds_between_frames": 0.1}, "VideoClips.seconds_between_frames", "keep one of fps"),
        ({"policy": "pad"}, "VideoClips.policy", "repeat_last, wrap or error"),
        ({"sampling_range_start": 1.5}, "VideoClips.sampling_range_start", "seconds_between_clip_starts"),
        ({"sampling_range_start": 5, "sampling_range_end": 3}, "VideoClips.sampling_range_end", "later end"),
        ({"seconds_between_clip_starts": 0}, "VideoClips.seconds_between_clip_starts", "seconds_between_clip_starts"),
    ],
)
def test_bad_clip_options_name_the_parameter_and_the_fix(kwargs: dict, param: str, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        VideoClips(**kwargs)
    assert error.value.param == param and fix in error.value.fix
