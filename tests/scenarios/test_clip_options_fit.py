"""Issue #52: TorchCodec's clip vocabulary through ``Trainer.fit`` and through a YAML config read
by the CLI (a subprocess)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.clip_worker import fit_clips
from tests.helpers import run_cli_process
from tests.media_corpus import whole_video_rgb
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


def _config(tmp_path: Path, uri: str, clips: str) -> Path:
    path = tmp_path / "clips.yaml"
    path.write_text(f"""\
trainer: {{accelerator: cpu, max_steps: 1, logger: false, enable_progress_bar: false, enable_model_summary: false,
  enable_checkpointing: false, default_root_dir: {tmp_path / "root"}}}
model: {{class_path: tests.clip_worker.ClipRecorder}}
data:
  train: {{uri: {uri}, columns: [video, label]}}
  batch_size: 2
  clips: {{class_path: lance_lightning.VideoClips, init_args: {clips}}}
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
