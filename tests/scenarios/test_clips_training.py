"""Video clips through the user's path: ``Trainer.fit`` stopped mid-epoch and resumed with
``ckpt_path`` under another worker count and batch size, or on two DDP ranks, trains exactly the
clips (same videos, same frames) the uninterrupted run trained, in the resumed epoch and after it;
bad media is named, or replaced with every rank keeping its batch count."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lance_lightning.errors import BadRowError
from tests.clip_worker import fit_clips
from tests.harness import ckpt_file
from tests.helpers import run_ddp_script
from tests.media_corpus import whole_audio, whole_video_rgb
from tests.reliability.helpers import ONE_SCREEN_LINES, error_screen, run_command
from tests.videos import FPS, write_audio, write_corpus_media, write_videos

ROWS = 12
CLIPS = {"frames": 4, "frame_step": 3, "clips_per_item": 2, "size": [16, 16], "seed": 7}  # 24 clips an epoch
BATCH = 4
STOP = 2  # steps of epoch 0 before the checkpoint
EPOCHS = 3


def per_epoch(records: list[list[Any]]) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for epoch, *clip in records:
        out.setdefault(epoch, Counter())[tuple(clip)] += 1
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("clips")
    uri = write_videos(root / "videos.lance", ROWS, fragment_rows=5)
    base = {
        "uri": uri,
        "root": str(root),
        "shuffle": "row:5",
        "batch_size": BATCH,
        "max_epochs": EPOCHS,
        "clips": CLIPS,
    }
    _, whole, _ = fit_clips({**base, "name": "whole", "num_workers": 0})
    _, stopped, _ = fit_clips({**base, "name": "stop", "num_workers": 0, "max_steps": STOP, "ckpt_every": STOP})
    return {"base": base, "root": root, "whole": whole, "stopped": stopped}


def check_resumed(runs: dict[str, Any], resumed: list[list[Any]]) -> None:
    whole = per_epoch(runs["whole"])
    assert sorted(whole) == list(range(EPOCHS)) and all(sum(c.values()) == 2 * ROWS for c in whole.values())
    assert len({tuple(r) for r in runs["whole"]}) == len(runs["whole"]), "a clip drawn twice in one epoch"
    # every video gives its two clips each epoch, with new random starts each epoch
    assert all(Counter(clip[0] for clip in c.elements()) == dict.fromkeys(range(ROWS), 2) for c in whole.values())
    assert set(whole[0]) != set(whole[1])
    stopped = per_epoch(runs["stopped"])
    assert sum(stopped[0].values()) == STOP * BATCH
    combined = per_epoch(runs["stopped"] + resumed)
    assert combined == whole  # nothing lost, nothing repeated, the same frames, every epoch


def test_clips_are_the_frames_the_video_holds(runs: dict[str, Any]) -> None:
    for _, row, label, first, last, _ in runs["whole"]:
        assert label == row % 3
        assert last - first == pytest.approx((CLIPS["frames"] - 1) * CLIPS["frame_step"] / FPS)
        assert abs(first * FPS - round(first * FPS)) < 1e-4  # on the frame grid (times recorded to 1 us)


def test_resume_with_workers_and_another_batch_size_trains_the_same_clips(runs: dict[str, Any]) -> None:
    _, resumed, batches = fit_clips(
        {
            **runs["base"],
            "name": "resume_workers",
            "num_workers": 2,
            "batch_size": 2 * BATCH,
            "ckpt_path": str(ckpt_file(runs["root"], "stop", STOP)),
        }
    )
    check_resumed(runs, resumed)
    assert batches == {0: (2 * ROWS - STOP * BATCH) // (2 * BATCH), 1: 3, 2: 3}


@pytest.fixture(scope="module")
def ddp_fits(runs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """This file's two 2-rank fits (gloo, CPU), run in turn in one DDP launch (`tests.clip_worker`
    given a list: the same ranks fit one spec, then the next; a launch starts rank 1 afresh): each
    fit's ``{"records", "batches"}`` per rank, by name.

    - ``resume_ddp``: `runs`' stopped fit resumed from its checkpoint on 2 ranks.
    - ``replace``: 10 videos, rows 2 (truncated), 5 (garbage) and 7 (too short) bad, replaced
      (``ReplaceBadRow``), 2 epochs, batches of 5."""
    root: Path = runs["root"]
    resume = {
        **runs["base"],
        "name": "resume_ddp",
        "num_workers": 0,
        "devices": 2,
        "ckpt_path": str(ckpt_file(root, "stop", STOP)),
        "out": str(root / "ddp"),
    }
    bad = tmp_path_factory.mktemp("bad_media")
    replace = {
        "uri": write_videos(bad / "bad.lance", 10, truncated=(2,), garbage=(5,), short=(7,)),
        "root": str(bad),
        "name": "replace",
        "shuffle": "row:1",
        "batch_size": 5,
        "max_epochs": 2,
        "num_workers": 0,
        "devices": 2,
        "bad_rows": "replace",
        "clips": {"frames": 8, "frame_step": 1, "size": [16, 16]},
        "out": str(bad / "ddp"),
    }
    path = root / "ddp_specs.json"
    path.write_text(json.dumps([resume, replace]))
    run_ddp_script("tests/clip_worker.py", [str(path)], timeout=480)
    return {
        spec["name"]: [json.loads(Path(f"{spec['out']}.rank{rank}.json").read_text()) for rank in (0, 1)]
        for spec in (resume, replace)
    }


def test_resume_on_two_ranks_trains_the_same_clips_with_equal_batches(
    runs: dict[str, Any], ddp_fits: dict[str, list[dict[str, Any]]]
) -> None:
    ranks = ddp_fits["resume_ddp"]
    assert ranks[0]["batches"] == ranks[1]["batches"]
    check_resumed(runs, ranks[0]["records"] + ranks[1]["records"])


def test_a_bad_video_is_named_through_fit(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "bad.lance", 6, truncated=(4,))
    spec = {"uri": uri, "root": str(tmp_path), "name": "bad", "shuffle": "none", "batch_size": 3, "max_epochs": 1}
    with pytest.raises(BadRowError, match=r"dataset row 4 .*column 'video'") as error:
        fit_clips({**spec, "num_workers": 0, "clips": {"frames": 4, "size": [16, 16]}})
    assert error.value.position == 4


def test_bad_media_replaced_under_ddp_keeps_every_rank_s_batches(ddp_fits: dict[str, list[dict[str, Any]]]) -> None:
    ranks = ddp_fits["replace"]  # rows 2, 5 and 7 of 10 bad (`ddp_fits`), replaced
    assert ranks[0]["batches"] == ranks[1]["batches"] == {"0": 1, "1": 1}
    records = ranks[0]["records"] + ranks[1]["records"]
    assert len(records) == 2 * 10
    assert not {row for _, row, *_ in records} & {2, 5, 7}  # replaced by clips of good videos


def test_audio_windows_resume_with_workers_and_another_batch_size(tmp_path: Path) -> None:
    uri = write_audio(tmp_path / "audio.lance", 6, sample_rate=16000)
    clips = {"seconds": 0.25, "sample_rate": 8000, "clips_per_item": 2, "seed": 3}
    base = {"uri": uri, "root": str(tmp_path), "media": "audio", "clips": clips, "shuffle": "row:2", "max_epochs": 2}
    _, whole, _ = fit_clips({**base, "name": "whole", "batch_size": 4, "num_workers": 0})
    _, stopped, _ = fit_clips(
        {**base, "name": "stop", "batch_size": 4, "num_workers": 0, "max_steps": 1, "ckpt_every": 1}
    )
    _, resumed, _ = fit_clips(
        {**base, "name": "resumed", "batch_size": 2, "num_workers": 2, "ckpt_path": str(ckpt_file(tmp_path, "stop", 1))}
    )
    assert sum(per_epoch(whole)[0].values()) == 12 and len(per_epoch(whole)) == 2
    assert per_epoch(stopped + resumed) == per_epoch(whole)


# -- the media corpus through Trainer.fit and the CLI (#50) ------------------------------------------
def test_corpus_videos_train_the_frames_a_whole_decode_gives(tmp_path: Path) -> None:
    """``Trainer.fit`` over MP4, MOV, MKV, WebM, AVI and MPEG-TS videos (audio tracks longer and
    shorter, start offsets, B-frames, variable rate): every trained clip, the first, middle and
    last of each video, has the times and pixels of a whole-stream PyAV decode at its indices."""
    items = write_corpus_media(tmp_path / "corpus.lance", "video")
    frames, step, size = 4, 2, (32, 48)
    clips = {"frames": frames, "frame_step": step, "clips_per_item": 3, "starts": "even", "size": list(size)}
    spec = {"uri": str(tmp_path / "corpus.lance"), "root": str(tmp_path), "name": "corpus", "shuffle": "none"}
    _, records, _ = fit_clips(
        {**spec, "batch_size": 3, "max_epochs": 1, "num_workers": 0, "clips": clips}
    )  # 3 per video: no batch dropped
    assert len(records) == 3 * len(items)
    span = (frames - 1) * step + 1
    expected = []
    for row, item in enumerate(items):
        pixels = whole_video_rgb(item.data, size)
        for fraction in (0.0, 0.5, 1.0):
            indices = int(np.floor(fraction * (item.frames - span))) + np.arange(0, span, step)
            times = [round(item.frame_times[i], 6) for i in indices[[0, -1]]]
            expected.append([0, row, row, *times, int(pixels[indices].astype(np.int64).sum())])
    assert sorted(records) == sorted(expected)


def test_corpus_audio_trains_windows_at_the_whole_decode_s_samples(tmp_path: Path) -> None:
    """``Trainer.fit`` over WAV, FLAC, MP3, M4A and Ogg/Opus with ``AudioClips``: each window starts
    where the plan puts it on the whole-stream decode's sample grid, and its samples sum as the
    whole decode's do (exactly for WAV and FLAC, within the codec's tolerance per sample)."""
    items = write_corpus_media(tmp_path / "audio.lance", "audio")
    rate, seconds = 16000, 0.5
    clips = {"seconds": seconds, "sample_rate": rate, "clips_per_item": 3, "starts": "even"}
    spec = {"uri": str(tmp_path / "audio.lance"), "root": str(tmp_path), "name": "audio", "shuffle": "none"}
    _, records, _ = fit_clips(
        {**spec, "media": "audio", "batch_size": 3, "max_epochs": 1, "num_workers": 0, "clips": clips}
    )
    assert len(records) == 3 * len(items)
    count = round(seconds * rate)
    for row, item in enumerate(items):
        whole = whole_audio(item.data, rate, 1)[0]
        total = item.duration_samples * rate // item.sample_rate
        trained = sorted(r for r in records if r[1] == row)
        for fraction, (_, _, label, start, _, total_sum) in zip((0.0, 0.5, 1.0), trained, strict=True):
            first = round(fraction * (total - count))
            assert label == row and start == round(first / rate, 6)
            assert (
                abs(total_sum - float(whole[first : first + count].astype(np.float64).sum()))
                <= 1e-3 + item.tolerance * count
            )


def _fit_config(tmp_path: Path, uri: str, clips: str) -> Path:
    path = tmp_path / "clips.yaml"
    path.write_text(f"""\
trainer: {{accelerator: cpu, max_steps: 2, logger: false, enable_progress_bar: false, enable_model_summary: false,
  enable_checkpointing: false, default_root_dir: {tmp_path / "root"}}}
model: {{class_path: tests.clip_worker.ClipRecorder}}
data:
  train: {{uri: {uri}, columns: [video, label]}}
  batch_size: 2
  clips: {{class_path: lance_lightning.VideoClips, init_args: {clips}}}
""")
    return path


@pytest.mark.slow
def test_videos_of_two_sizes_without_size_end_on_one_screen(tmp_path: Path) -> None:
    """Regression (#50): ``size: null`` over videos of two sizes ended ``lance-lightning fit`` in 106
    lines of numpy's "all input arrays must have the same shape"; now one screen naming
    ``VideoClips.size``, both sizes and the fix."""
    write_corpus_media(tmp_path / "two_sizes.lance", "video", names=("h264.mp4", "h264_60.mp4"))
    config = _fit_config(tmp_path, str(tmp_path / "two_sizes.lance"), "{frames: 2, size: null}")
    code, output = run_command(["fit", "--config", str(config)])
    screen = error_screen(output)
    assert code == 1 and "Traceback" not in output, output[-3000:]
    assert len(screen) <= ONE_SCREEN_LINES, "\n".join(screen)
    for fragment in ["VideoClips.size", "48x64", "32x48", "set size: ["]:
        assert fragment in "\n".join(screen), output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("fps", [".inf", ".nan"])
def test_a_non_finite_fps_in_the_config_ends_on_one_screen(tmp_path: Path, fps: str) -> None:
    """Regression (#50): ``fps: .inf`` in a config ended ``lance-lightning fit`` in "need frames >= 1
    and step > 0", naming neither ``fps`` nor a fix; now one screen naming the parameter, the value
    and the fix (the sampler refuses it when made: tests/unit/plan/test_clips.py)."""
    write_corpus_media(tmp_path / "videos.lance", "video", names=("h264.mp4", "h264_2997.mp4"))
    config = _fit_config(tmp_path, str(tmp_path / "videos.lance"), f"{{frames: 2, fps: {fps}}}")
    code, output = run_command(["fit", "--config", str(config)])
    screen = "\n".join(error_screen(output))
    assert code == 1 and "Traceback" not in output, output[-3000:]
    assert len(screen.splitlines()) <= ONE_SCREEN_LINES, screen
    for fragment in ["parameter: VideoClips.fps", f"value:     {fps[1:]}", "must be a finite number > 0", "fix:"]:
        assert fragment in screen, output[-3000:]
