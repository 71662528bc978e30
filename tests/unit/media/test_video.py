"""Video clips decoded from a file object are exactly the frames a whole-file decode gives."""

from __future__ import annotations

import dataclasses
import io
import pickle
import subprocess
import sys

import av
import numpy as np
import pytest

from lance_lightning.errors import BadMedia
from lance_lightning.media.containers import open_audio, open_video
from lance_lightning.media.synthetic import MOTION_CLASSES, encode_audio, encode_video, moving_shapes, tone
from lance_lightning.media.video import decode_video_clip, frame_step

FRAMES, HEIGHT, WIDTH, FPS, GOP = 120, 48, 64, 24, 12


@pytest.fixture(scope="module")
def video() -> bytes:
    return encode_video(moving_shapes(2, FRAMES, HEIGHT, WIDTH, seed=5), fps=FPS, gop=GOP)


@pytest.fixture(scope="module")
def reference(video: bytes) -> list[av.VideoFrame]:
    """Every frame of the video, decoded from its start by plain PyAV."""
    with av.open(io.BytesIO(video)) as container:
        return list(container.decode(video=0))


def expected_indices(fraction: float, frames: int, step: float, total: int = FRAMES) -> np.ndarray:
    offsets = np.round(np.arange(frames) * step).astype(int)
    return int(np.floor(fraction * (total - offsets[-1] - 1))) + offsets


def check_clip(clip, reference: list[av.VideoFrame], indices: np.ndarray, size: tuple[int, int] | None = None) -> None:
    """``clip`` holds ``reference``'s frames at ``indices`` (resized to ``size`` by PyAV, if given)."""
    height, width = size or (reference[0].height, reference[0].width)
    assert clip.frames.shape == (len(indices), 3, height, width) and clip.frames.dtype == np.uint8
    for position, index in enumerate(indices):
        frame = reference[index]
        resized = frame.reformat(width=width, height=height, format="rgb24") if size else frame
        expected = resized.to_ndarray(format="rgb24")
        np.testing.assert_array_equal(clip.frames[position].transpose(1, 2, 0), expected, err_msg=f"frame {index}")
    np.testing.assert_array_equal(clip.timestamps, [reference[index].time for index in indices])


@pytest.mark.parametrize("fraction", [0.0, 0.37, 0.5, 1.0])
@pytest.mark.parametrize("step", [1.0, 3.0, "10fps", 0.5])
def test_a_clip_is_the_full_decode_at_its_indices(video, reference, fraction, step) -> None:
    opened = open_video(io.BytesIO(video))
    step = frame_step(opened, None, 10.0) if step == "10fps" else step
    clip = decode_video_clip(opened, fraction, 8, step, None)
    indices = expected_indices(fraction, 8, step)
    check_clip(clip, reference, indices)
    assert np.all(np.diff(clip.timestamps) > 0) if step >= 1 else np.all(np.diff(clip.timestamps) >= 0)
    opened.close()


def test_one_open_video_serves_clips_in_any_order(video, reference) -> None:
    opened = open_video(io.BytesIO(video))
    for fraction, step in [(1.0, 2.0), (0.0, 1.0), (0.61, 2.4), (0.6, 1.0), (0.05, 7.0), (1.0, 1.0)]:
        check_clip(decode_video_clip(opened, fraction, 6, step, None), reference, expected_indices(fraction, 6, step))
    opened.close()


@pytest.mark.parametrize("container", ["matroska", "mpegts"])
def test_other_containers_give_the_full_decode_too(container) -> None:
    """MKV has no frame count (it comes from the duration); MPEG-TS starts at 2 frames' time and
    its demuxer lands after the asked time (``decode_from`` seeks again, earlier)."""
    data = encode_video(moving_shapes(3, 60, 32, 48, seed=2), container=container)
    with av.open(io.BytesIO(data)) as file:
        frames = list(file.decode(video=0))
    opened = open_video(io.BytesIO(data))
    assert opened.frames == 60 and opened.start_time == pytest.approx(frames[0].time)
    for fraction, step in [(0.0, 1.0), (0.0, 2.4), (0.4, 1.0), (1.0, 2.0)]:
        clip = decode_video_clip(opened, fraction, 6, step, None)
        check_clip(clip, frames, expected_indices(fraction, 6, step, total=60))
    opened.close()


def test_size_resizes_like_pyav_reformat(video, reference) -> None:
    opened = open_video(io.BytesIO(video))
    clip = decode_video_clip(opened, 0.5, 4, 2.0, (32, 40))
    check_clip(clip, reference, expected_indices(0.5, 4, 2.0), size=(32, 40))
    # Channels first, over one frame-major buffer (no copy per frame beyond the one out of PyAV).
    assert clip.frames.transpose(0, 2, 3, 1).flags.c_contiguous


def test_frame_step_from_a_step_or_a_target_rate(video) -> None:
    opened = open_video(io.BytesIO(video))
    assert (opened.fps, opened.frames, opened.height, opened.width) == (FPS, FRAMES, HEIGHT, WIDTH)
    assert frame_step(opened, None, None) == 1.0
    assert frame_step(opened, 3, None) == 3.0
    assert frame_step(opened, None, 10.0) == pytest.approx(2.4)
    for bad in [(2, 10.0), (0, None), (None, 0.0)]:
        with pytest.raises(ValueError):
            frame_step(opened, *bad)
    opened.close()


def test_a_clip_longer_than_the_video_is_bad_media(video) -> None:
    opened = open_video(io.BytesIO(video))
    with pytest.raises(BadMedia, match="clip of 41 frames every 3 frames spans 121 frames, the video has 120"):
        decode_video_clip(opened, 0.0, 41, 3.0, None)
    decode_video_clip(opened, 0.0, 40, 3.0, None)  # spans 118: fits
    opened.close()


def test_a_video_that_ends_before_its_header_says_is_bad_media(video) -> None:
    opened = open_video(io.BytesIO(video))
    step = int(opened.frame_pts[1] - opened.frame_pts[0])
    extra = opened.frame_pts[-1] + step * np.arange(1, 6)
    opened = dataclasses.replace(opened, frame_pts=np.concatenate([opened.frame_pts, extra]))
    with pytest.raises(BadMedia, match="ended before frame 121 "):
        decode_video_clip(opened, 1.0, 4, 1.0, None)
    opened.close()


def test_truncated_random_and_audio_only_files_are_bad_media(video) -> None:
    for data, reason in [
        (video[: len(video) // 2], "not a readable media file"),
        (np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes(), "not a readable media file"),
        (encode_audio(tone(0, 0.5, 8000, seed=0), 8000), "no video stream"),
    ]:
        with pytest.raises(BadMedia, match=reason) as raised:
            decode_video_clip(open_video(io.BytesIO(data)), 0.5, 4, 1.0, None)
        assert pickle.loads(pickle.dumps(raised.value)).reason == raised.value.reason
    with pytest.raises(BadMedia, match="no audio stream"):
        open_audio(io.BytesIO(video))


def test_synthetic_videos_are_deterministic_with_a_keyframe_every_gop(video, reference) -> None:
    # Fresh processes, as a rerun of the example is: in a long-lived process a library loaded later
    # (built with -ffast-math, which sets flush-to-zero) can change x264's floating-point decisions.
    code = (
        "import hashlib, sys; from lance_lightning.media.synthetic import encode_video, moving_shapes; "
        f"sys.stdout.write(hashlib.sha256(encode_video(moving_shapes(2, {FRAMES}, {HEIGHT}, {WIDTH}, seed=5), "
        f"fps={FPS}, gop={GOP})).hexdigest())"
    )
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout}
    digests.add(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert len(digests) == 1 and len(digests.pop()) == 64
    assert [i for i, frame in enumerate(reference) if frame.key_frame] == list(range(0, FRAMES, GOP))
    assert [frame.time for frame in reference] == pytest.approx(np.arange(FRAMES) / FPS)
    clips = [moving_shapes(label, 4, 32, 32, seed=1) for label in range(MOTION_CLASSES)]
    assert all(not np.array_equal(a, b) for i, a in enumerate(clips) for b in clips[i + 1 :])
    np.testing.assert_array_equal(moving_shapes(3, 4, 32, 32, seed=1), clips[3])
    assert not np.array_equal(moving_shapes(3, 4, 32, 32, seed=2), clips[3])
    with pytest.raises(ValueError):
        moving_shapes(MOTION_CLASSES, 4, 32, 32, seed=1)
