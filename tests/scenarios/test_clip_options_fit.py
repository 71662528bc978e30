"""Issue #52: TorchCodec's clip vocabulary through ``Trainer.fit`` (video clips and audio windows,
against a whole-stream PyAV decode; an audio resume through ``ckpt_path`` against the uninterrupted
run) and through a YAML config read by the CLI (a subprocess)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tests.clip_worker import fit_clips
from tests.harness import ckpt_file
from tests.helpers import run_cli_process
from tests.media_corpus import whole_audio, whole_video_rgb
from tests.reliability.helpers import ONE_SCREEN_LINES, error_screen
from tests.videos import write_corpus_media

NAMES = ("h264.mp4", "h264_start125.mkv")


def test_fit_trains_clips_at_regular_timestamps_with_repeat_last(tmp_path: Path) -> None:
    """``seconds_between_clip_starts: 0.6`` with ``num_clips: 3``: each video's clip ``k`` starts at
    the first frame at or after its start + 0.6 k s; the last clips (1.2 s in, 8 frames every 3)
    reach past the end and repeat the last frame (``policy: repeat_last``); pixels are the whole
    decode's."""
    items = write_corpus_media(tmp_path / "v.lance", "video", names=NAMES)
    clips = {
        "num_frames_per_clip": 8,
        "num_indices_between_frames": 3,
        "num_clips": 3,
        "seconds_between_clip_starts": 0.6,
        "policy": "repeat_last",
        "size": [48, 64],
    }
    spec = {"uri": str(tmp_path / "v.lance"), "root": str(tmp_path), "name": "regular", "shuffle": "none"}
    _, records, _ = fit_clips({**spec, "clips": clips, "batch_size": 2, "max_epochs": 1, "num_workers": 0})
    assert len(records) == 3 * len(items)
    expected, padded = [], 0
    for row, item in enumerate(items):
        pixels = whole_video_rgb(item.data)
        for k in range(3):
            first = next(i for i, t in enumerate(item.frame_times) if t >= item.start_time + 0.6 * k - 1e-9)
            valid = [i for i in (first + 3 * i for i in range(8)) if i < item.frames]
            indices = [*valid, *[valid[-1]] * (8 - len(valid))]
            padded += len(valid) < 8
            times = [round(item.frame_times[i], 6) for i in (indices[0], indices[-1])]
            expected.append([0, row, row, *times, int(pixels[indices].astype(np.int64).sum())])
    assert padded >= 2  # the policy is exercised: some clips reach past their video's last frame
    assert sorted(records) == sorted(expected)


AUDIO = ("pcm.wav", "mono.flac", "stereo.mp3")  # 2.3 s each: exact, exact, MP3 within 1e-3
RATE, SECONDS = 16000, 0.5


def _wrapped(first: int, count: int, total: int) -> np.ndarray:
    """TorchCodec's ``wrap`` on sample indices: the window's samples inside the audio, again and again."""
    valid = np.arange(first, min(first + count, total))
    return np.resize(valid, count)


def _epochs(records: list[list[Any]]) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for epoch, *clip in records:
        out.setdefault(epoch, Counter())[tuple(clip)] += 1
    return out


def test_fit_trains_audio_windows_of_a_sampling_range_wrapped_at_the_end_and_resumes_exactly(tmp_path: Path) -> None:
    """``AudioClips`` with ``sampling_range_start: 1.2``, ``sampling_range_end: 2.25`` (past the
    last start where 0.5 s fits, 1.8 s) and ``policy: wrap``: every trained window starts in the
    range, and its samples are the whole decode's at the wrapped indices; a fit stopped after one
    step and resumed through ``ckpt_path`` (another batch size, two workers) trains what the
    uninterrupted fit trains, epoch for epoch."""
    uri = str(tmp_path / "a.lance")
    items = write_corpus_media(uri, "audio", names=AUDIO)
    clips = {
        "seconds": SECONDS, "sample_rate": RATE, "num_clips": 4, "seed": 4, "policy": "wrap",
        "sampling_range_start": 1.2, "sampling_range_end": 2.25,
    }  # fmt: skip
    base = {"uri": uri, "root": str(tmp_path), "media": "audio", "clips": clips, "shuffle": "row:2", "max_epochs": 2}
    _, whole, _ = fit_clips({**base, "name": "whole", "batch_size": 4, "num_workers": 0})
    assert len(whole) == 2 * 4 * len(items)
    count, wrapped = round(SECONDS * RATE), 0
    for epoch, row, label, start, _, total_sum in whole:
        item = items[row]
        first, total = round(start * RATE), item.duration_samples * RATE // item.sample_rate
        assert label == row and start == round(first / RATE, 6) and 1.2 <= start < 2.25, (epoch, row, start)
        expected = whole_audio(item.data, RATE, 1)[0][_wrapped(first, count, total)]
        assert abs(total_sum - float(expected.astype(np.float64).sum())) <= 1e-3 + item.tolerance * count, (row, start)
        wrapped += first + count > total
    assert wrapped >= 2  # the policy is exercised
    _, stopped, _ = fit_clips(
        {**base, "name": "stop", "batch_size": 4, "num_workers": 0, "max_steps": 1, "ckpt_every": 1}
    )
    _, resumed, _ = fit_clips(
        {**base, "name": "resumed", "batch_size": 2, "num_workers": 2, "ckpt_path": str(ckpt_file(tmp_path, "stop", 1))}
    )
    assert _epochs(stopped + resumed) == _epochs(whole)


def test_fit_trains_audio_windows_at_regular_timestamps_repeating_the_last_sample(tmp_path: Path) -> None:
    """``seconds_between_clip_starts: 0.8`` from ``sampling_range_start: 0.3`` with ``num_clips: 3``
    and stereo (``num_channels: 2``): windows at 0.3, 1.1 and 1.9 s of every file, the last reaching
    past the end (2.3 s) and repeating the last sample (``policy: repeat_last``)."""
    uri = str(tmp_path / "a.lance")
    items = write_corpus_media(uri, "audio", names=AUDIO)
    clips = {
        "seconds": 0.6, "sample_rate": RATE, "num_channels": 2, "num_clips": 3, "policy": "repeat_last",
        "seconds_between_clip_starts": 0.8, "sampling_range_start": 0.3,
    }  # fmt: skip
    spec = {"uri": uri, "root": str(tmp_path), "name": "regular", "media": "audio", "shuffle": "none"}
    _, records, _ = fit_clips({**spec, "clips": clips, "batch_size": 3, "max_epochs": 1, "num_workers": 0})
    count = round(0.6 * RATE)
    expected: list[tuple[int, float]] = []
    for row, item in enumerate(items):
        decoded = whole_audio(item.data, RATE, 2).astype(np.float64)
        total = item.duration_samples * RATE // item.sample_rate
        for k in range(3):
            first = round((0.3 + 0.8 * k) * RATE)
            indices = np.minimum(np.arange(first, first + count), total - 1)  # repeat_last
            expected.append((row, round(first / RATE, 6)))
            (got,) = [r for r in records if r[1] == row and r[3] == round(first / RATE, 6)]
            assert abs(got[5] - float(decoded[:, indices].sum())) <= 1e-3 + item.tolerance * 2 * count, (row, k)
    assert sorted((r[1], r[3]) for r in records) == sorted(expected)


def _config(tmp_path: Path, uri: str, clips: str, kind: str = "video") -> Path:
    path = tmp_path / "clips.yaml"
    sampler = "VideoClips" if kind == "video" else "AudioClips"
    path.write_text(f"""\
trainer: {{accelerator: cpu, max_steps: 1, logger: false, enable_progress_bar: false, enable_model_summary: false,
  enable_checkpointing: false, default_root_dir: {tmp_path / "root"}}}
model: {{class_path: tests.clip_worker.ClipRecorder}}
data:
  train: {{uri: {uri}, columns: [{kind}, label]}}
  batch_size: 2
  clips: {{class_path: lance_lightning.{sampler}, init_args: {clips}}}
""")
    return path


def test_yaml_takes_torchcodec_names_and_refuses_both_names_of_one_option(tmp_path: Path) -> None:
    uri = str(tmp_path / "v.lance")
    write_corpus_media(uri, "video", names=NAMES)
    clips = "{num_frames_per_clip: 4, num_indices_between_frames: 2, num_clips: 3, policy: wrap, size: [48, 64]}"
    code, out = run_cli_process(["explain", "--config", str(_config(tmp_path, uri, clips))], tmp_path)
    assert code == 0, out
    assert "2 media row(s) x 3 clip(s) = 6 clip(s)" in out, out
    assert "clip: 4 frame(s) every 2 frame(s), past the last frame: wrap, 48x64" in out, out

    clips = "{frames: 4, num_frames_per_clip: 8}"
    code, out = run_cli_process(["explain", "--config", str(_config(tmp_path, uri, clips))], tmp_path)
    screen = error_screen(out)
    assert code == 1 and "Traceback" not in out and len(screen) <= ONE_SCREEN_LINES, out
    assert "VideoClips.num_frames_per_clip" in out and "keep one of frames and num_frames_per_clip" in out, out


def test_yaml_takes_audio_clips_in_torchcodec_s_vocabulary_and_refuses_a_bad_range(tmp_path: Path) -> None:
    uri = str(tmp_path / "a.lance")
    write_corpus_media(uri, "audio", names=AUDIO)
    clips = (
        "{seconds: 0.5, num_clips: 2, num_channels: 2, sampling_range_start: 0.5, sampling_range_end: 2.0, "
        "policy: repeat_last}"
    )
    code, out = run_cli_process(["explain", "--config", str(_config(tmp_path, uri, clips, "audio"))], tmp_path)
    assert code == 0, out
    assert "3 media row(s) x 2 clip(s) = 6 clip(s)" in out, out
    assert "0.5 s at 16000 Hz, 2 channel(s), sampling range [0.5, 2.0) s, past the end: repeat_last" in out, out

    clips = "{seconds: 0.5, sampling_range_start: -1.0}"
    code, out = run_cli_process(["explain", "--config", str(_config(tmp_path, uri, clips, "audio"))], tmp_path)
    screen = error_screen(out)
    assert code == 1 and "Traceback" not in out and len(screen) <= ONE_SCREEN_LINES, out
    assert "AudioClips.sampling_range_start" in out and "set sampling_range_start: 0.0 or more" in out, out
