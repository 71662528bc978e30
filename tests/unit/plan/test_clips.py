"""Clip units and starts (`lance_lightning.plan.clips`): a pure function of (seed, epoch, unit)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning import AudioClips, VideoClips
from lance_lightning.errors import ConfigError
from lance_lightning.plan.clips import ClipUnits, start_fractions


@given(seed=st.integers(0, 2**31), epoch=st.integers(0, 50), units=st.lists(st.integers(0, 10**9), max_size=64))
@settings(max_examples=50, deadline=None)
def test_random_starts_depend_only_on_seed_epoch_and_unit(seed: int, epoch: int, units: list[int]) -> None:
    sampler = VideoClips(seed=seed, clips_per_item=3)
    array = np.array(units, dtype=np.int64)
    together = start_fractions(sampler, epoch, array)
    one_by_one = np.array([start_fractions(sampler, epoch, np.array([u]))[0] for u in units])
    assert np.array_equal(together, one_by_one)  # no dependence on the batch it is drawn with
    assert ((together >= 0) & (together < 1)).all()
    assert np.array_equal(start_fractions(VideoClips(seed=seed, clips_per_item=3), epoch, array), together)


def test_random_starts_change_with_the_epoch_and_the_seed_and_spread_evenly() -> None:
    units = np.arange(20_000)
    first = start_fractions(VideoClips(seed=1), 0, units)
    assert not np.array_equal(first, start_fractions(VideoClips(seed=1), 1, units))
    assert not np.array_equal(first, start_fractions(VideoClips(seed=2), 0, units))
    counts, _ = np.histogram(first, bins=10, range=(0, 1))
    assert counts.min() > 1_700  # 2,000 expected per tenth


def test_random_starts_of_one_row_fall_in_its_own_part_each() -> None:
    sampler = VideoClips(clips_per_item=4, seed=3)
    for epoch in range(5):
        starts = start_fractions(sampler, epoch, np.arange(400)).reshape(100, 4)
        assert ((starts >= np.arange(4) / 4) & (starts < (np.arange(4) + 1) / 4)).all()


def test_even_starts_are_evenly_spaced_and_the_same_every_epoch() -> None:
    sampler = AudioClips(clips_per_item=3, starts="even")
    units = np.arange(6)
    assert start_fractions(sampler, 0, units).tolist() == [0.0, 0.5, 1.0, 0.0, 0.5, 1.0]
    assert np.array_equal(start_fractions(sampler, 7, units), start_fractions(sampler, 0, units))
    assert start_fractions(VideoClips(starts="even"), 3, np.arange(2)).tolist() == [0.5, 0.5]


def test_clip_units_map_each_clip_to_its_row() -> None:
    units = ClipUnits(VideoClips(clips_per_item=4), rows=5)
    assert units.clips == 20
    assert units.rows_of(np.arange(20)).tolist() == [r for r in range(5) for _ in range(4)]


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: VideoClips(frames=0), "VideoClips.frames"),
        (lambda: VideoClips(clips_per_item=0), "VideoClips.clips_per_item"),
        (lambda: VideoClips(starts="middle"), "VideoClips.starts"),
        (lambda: VideoClips(size=[64]), "VideoClips.size"),
        (lambda: VideoClips(fps=0), "VideoClips.fps"),
        (lambda: VideoClips(decoder="torchcodec"), "VideoClips.decoder"),
        (lambda: VideoClips(column=""), "VideoClips.column"),
        (lambda: AudioClips(seconds=0), "AudioClips.seconds"),
        # Regression (#50): `fps: .inf` passed and failed at decode, naming neither `fps` nor a fix.
        (lambda: VideoClips(fps=float("inf")), "VideoClips.fps"),
        (lambda: VideoClips(fps=float("nan")), "VideoClips.fps"),
        (lambda: VideoClips(fps=-2.0), "VideoClips.fps"),
        (lambda: VideoClips(fps="8"), "VideoClips.fps"),
        (lambda: AudioClips(seconds=float("inf")), "AudioClips.seconds"),
        (lambda: AudioClips(seconds=float("nan")), "AudioClips.seconds"),
        (lambda: AudioClips(channels=6), "AudioClips.channels"),
        (lambda: AudioClips(open_files=0), "AudioClips.open_files"),
    ],
)
def test_bad_sampler_arguments_name_the_parameter(make, param: str) -> None:
    with pytest.raises(ConfigError) as error:
        make()
    assert error.value.param == param
    assert "Fix:" in str(error.value) and f"`{param}`=" in str(error.value)
    if param in ("VideoClips.fps", "AudioClips.seconds"):
        assert "must be a finite number > 0" in str(error.value)


def test_samplers_describe_what_chooses_a_clip() -> None:
    sampler = VideoClips(frames=4, size=(32, 48), clips_per_item=2)
    described = sampler.describe()
    assert described["kind"] == "VideoClips" and described["size"] == (32, 48) and described["per_item"] == 2
    assert "open_files" not in described  # the pool's size does not change a clip
    assert sampler == VideoClips(frames=4, size=[32, 48], clips_per_item=2)
    assert hash(sampler) == hash(VideoClips(frames=4, size=[32, 48], clips_per_item=2))
