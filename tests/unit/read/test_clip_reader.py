"""The clip reader through the data module: each batch holds the clips the plan names, decoded
exactly, from blob or plain binary columns, with filters, mixtures and audio; what clips cannot
combine with is refused before reading."""

from __future__ import annotations

import io
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_lightning import (
    AudioClips,
    LanceDataModule,
    LanceMixture,
    LanceSource,
    ReplaceBadRow,
    RowShuffle,
    VideoClips,
)
from lance_lightning.errors import BadRowError, ConfigError
from lance_lightning.media.audio import decode_audio_clip
from lance_lightning.media.containers import open_audio, open_video
from lance_lightning.media.decoders import clip_decoder
from lance_lightning.media.video import decode_video_clip
from lance_lightning.plan.clips import start_fractions
from lance_lightning.plan.packing import TokenPacking
from tests.media_corpus import whole_audio, whole_video_rgb
from tests.videos import BLOB, _video, video_frames, write_audio, write_corpus_media, write_videos

CLIPS = VideoClips(frames=3, frame_step=2, clips_per_item=2, size=[16, 16], seed=4)


def batches(dm: LanceDataModule, split: str = "train") -> list[dict]:
    dm.setup("fit" if split == "train" else "predict")
    return list(getattr(dm, f"{split}_dataloader")())


def test_every_clip_is_the_one_its_unit_names(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "v.lance", 8, fragment_rows=3)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["id", "video", "label"]), batch_size=4, shuffle=RowShuffle(seed=2), clips=CLIPS
    )
    seen = []
    dataset = lance.dataset(uri)
    for batch in batches(dm):
        assert batch["video"].shape == (4, 3, 3, 16, 16) and batch["video"].dtype == torch.uint8
        for i, row in enumerate(batch["_clip_row"].tolist()):
            seen.append(row)
            blob = dataset.take_blobs("video", indices=[row])[0]
            opened = open_video(io.BytesIO(blob.read()))
            # the start: some unit of this row at epoch 0; the frames: that clip's
            candidates = [
                decode_video_clip(opened, float(f), 3, 2.0, (16, 16))
                for f in start_fractions(CLIPS, 0, np.array([2 * row, 2 * row + 1]))
            ]
            match = [c for c in candidates if np.array_equal(c.timestamps, batch["video_timestamps"][i].numpy())]
            assert match and np.array_equal(match[0].frames, batch["video"][i].numpy())
            assert batch["label"][i] == row % 3 and batch["id"][i] == row
    assert sorted(seen) == sorted(list(range(8)) * 2)


def test_a_plain_binary_column_gives_the_same_clips_as_a_blob_column(tmp_path: Path) -> None:
    def read(blob: bool) -> list[tuple]:
        uri = write_videos(tmp_path / f"{blob}.lance", 6, blob=blob)
        dm = LanceDataModule(train=LanceSource(uri, columns=["video", "label"]), batch_size=3, clips=CLIPS)
        return [
            (r, v.numpy().tobytes())
            for b in batches(dm)
            for r, v in zip(b["_clip_row"].tolist(), b["video"], strict=True)
        ]

    assert read(True) == read(False)


def test_a_filter_keeps_the_clips_of_matching_rows_only(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "v.lance", 9)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["video", "label"], filter="label = 1"),
        batch_size=2,
        clips=CLIPS,
        drop_last=False,
    )
    rows = [r for b in batches(dm) for r in b["_clip_row"].tolist()]
    assert sorted(rows) == [1, 1, 4, 4, 7, 7]
    explained = dm.explain("train")
    assert "3 media row(s) x 2 clip(s) = 6 clip(s)" in explained
    assert "decoder: PyAV " in explained and "TorchCodec video decoding" in explained  # which decoder, and why


def test_a_mixture_of_clip_sources_reads_clips_of_each(tmp_path: Path) -> None:
    uris = [write_videos(tmp_path / f"{name}.lance", 4) for name in "ab"]
    mixture = LanceMixture([LanceSource(uri, columns=["video", "label"]) for uri in uris], [1, 1], block=4)
    dm = LanceDataModule(train=mixture, batch_size=4, clips=CLIPS, shuffle=RowShuffle(seed=1))
    got = [(s, r) for b in batches(dm) for s, r in zip(b["source"].tolist(), b["_clip_row"].tolist(), strict=True)]
    assert len(got) == 16 and {s for s, _ in got} == {0, 1}
    assert all(0 <= r < 4 for _, r in got)


def test_audio_windows_are_resampled_float_windows(tmp_path: Path) -> None:
    uri = write_audio(tmp_path / "a.lance", 6, sample_rate=22050, channels=2)
    sampler = AudioClips(seconds=0.5, sample_rate=8000, channels=1, clips_per_item=2, seed=1)
    dm = LanceDataModule(train=LanceSource(uri, columns=["audio", "label"]), batch_size=4, clips=sampler)
    out = batches(dm)
    assert len(out) == 3
    dataset = lance.dataset(uri)
    for batch in out:
        assert batch["audio"].shape == (4, 1, 4000) and batch["audio"].dtype == torch.float32
        assert batch["audio_start"].shape == (4, 1)
        row, start = int(batch["_clip_row"][0]), float(batch["audio_start"][0, 0])
        opened = open_audio(io.BytesIO(dataset.take_blobs("audio", indices=[row])[0].read()))
        fraction = start / (opened.duration - 0.5)
        direct = decode_audio_clip(opened, fraction, 0.5, 8000, 1)
        assert direct.start == pytest.approx(start)
        np.testing.assert_allclose(direct.samples, batch["audio"][0].numpy(), atol=1e-6)


def test_open_media_stay_within_the_bound(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "v.lance", 10)
    sampler = VideoClips(frames=2, size=[16, 16], open_files=3, seed=9)
    dm = LanceDataModule(train=LanceSource(uri, columns=["video"]), batch_size=5, clips=sampler)
    for _ in range(2):
        batches(dm)
        assert len(clip_decoder(sampler).pool) <= 3


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"clips": CLIPS, "columns": ["label"]}, "clips.column"),
        ({"clips": VideoClips(column="label"), "columns": ["label"]}, "clips.column"),
        ({"clips": CLIPS, "packing": TokenPacking(column="label")}, "clips"),
        ({"clips": "video"}, "clips"),
        ({"clips": CLIPS, "row_identity": True}, "row_identity"),
    ],
)
def test_what_clips_cannot_read_is_refused_before_reading(tmp_path: Path, kwargs: dict, param: str) -> None:
    uri = write_videos(tmp_path / "v.lance", 3)
    columns = kwargs.pop("columns", ["video", "label"])
    with pytest.raises(ConfigError) as error:
        dm = LanceDataModule(train=LanceSource(uri, columns=columns), batch_size=2, **kwargs)
        dm.setup("fit")
        dm.train_dataloader()
    assert error.value.param == param


def test_a_video_shorter_than_every_clip_is_named(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "v.lance", 4, short=(2,))
    dm = LanceDataModule(train=LanceSource(uri, columns=["video"]), batch_size=4, clips=VideoClips(frames=8))
    with pytest.raises(Exception, match=r"dataset row 2 .* spans 8 frames, the video has 3"):
        batches(dm)


def test_validation_clips_are_the_same_every_pass(tmp_path: Path) -> None:
    uri = write_videos(tmp_path / "v.lance", 6)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["video"]), val=LanceSource(uri, columns=["video"]), batch_size=3, clips=CLIPS
    )
    dm.setup("fit")
    passes = [[b["video_timestamps"].tolist() for b in dm.val_dataloader()] for _ in range(3)]
    assert passes[0] == passes[1] == passes[2]
    starts = [t[0] for batch in passes[0] for t in batch]
    assert len(set(starts)) > 3  # random starts, drawn once


def test_decoding_is_timed_apart_from_storage_reads(tmp_path: Path) -> None:
    from lance_lightning.metrics.clock import StageClock
    from lance_lightning.plan.contract import SplitSettings
    from lance_lightning.plan.split import plan_split
    from lance_lightning.plan.strategies import FilterRead, NoShuffle
    from lance_lightning.read.factory import plan_reader

    uri = write_videos(tmp_path / "v.lance", 4)
    plan = plan_split(
        "train", LanceSource(uri, columns=["video"]), SplitSettings(NoShuffle(), FilterRead(), 4, False, clips=CLIPS)
    )
    reader = plan_reader(plan, 0, 1, 0, 0)
    clock = StageClock()
    for group in reader.groups(range(reader.layout.steps)):
        with clock.measure("read", rows=4):
            reader.read_group(group)
    totals = clock.drain()
    assert totals["decode_seconds"] > 0 and totals["decode_rows"] == 8
    assert totals["read_seconds"] >= 0


def test_a_missing_decoder_is_named_before_reading(tmp_path: Path) -> None:
    """With PyAV not importable, the package still imports and ``setup`` names ``clips.decoder`` and
    the fix, before any read. A process of its own, forked from the test zygote where it can be
    (`tests.zygote`: it has imported Lightning and ``lance_lightning.cli``, 10 s of CPU under load,
    and none of that tried to import ``av``, which the script checks before it blocks PyAV: blocking
    it then is blocking it at start-up, as the fresh process this test ran before did)."""
    import sys

    from tests import zygote

    uri = write_videos(tmp_path / "v.lance", 2)
    script = tmp_path / "no_av.py"
    script.write_text(
        "import sys\n"
        "print('av imported before the block:', 'av' in sys.modules)\n"
        "sys.modules['av'] = None  # PyAV cannot be imported\n"
        "from lance_lightning import LanceDataModule, LanceSource, VideoClips\n"
        "from lance_lightning.errors import ConfigError\n"
        f"dm = LanceDataModule(train=LanceSource({uri!r}, columns=['video']), batch_size=2, clips=VideoClips())\n"
        "try:\n    dm.setup('fit')\nexcept ConfigError as error:\n    print(error.param, '|', error)\n"
    )
    out = zygote.run([sys.executable, str(script)], cwd=tmp_path, env=zygote.zygote_env(), text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    first, _, rest = out.stdout.partition("\n")
    assert first == "av imported before the block: False", out.stdout
    assert rest.startswith("clips.decoder |") and "uv add av" in rest, out.stdout


# -- the media corpus through the reader (#50) ------------------------------------------------------
def by_row(dm: LanceDataModule, media: str) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Each dataset row's clips (media, times), in start order."""
    clips: dict[int, list] = {}
    for batch in batches(dm):
        for i, row in enumerate(batch["_clip_row"].tolist()):
            times = batch[f"{media}_timestamps" if media == "video" else f"{media}_start"][i].numpy()
            clips.setdefault(row, []).append((batch[media][i].numpy(), times))
    return {row: sorted(found, key=lambda clip: float(clip[1][0])) for row, found in clips.items()}


def test_corpus_videos_give_the_whole_decode_at_the_first_middle_and_last_clip(tmp_path: Path) -> None:
    """MP4, MOV, MKV, WebM, AVI and MPEG-TS (with longer and shorter audio tracks, start offsets,
    B-frames, 29.97/60 fps, variable rate) as Lance blobs: the first, middle and last possible
    clips equal a whole-stream PyAV decode (resized by PyAV) at their indices, and the last clip
    ends at the stream's last decoded frame (a container duration covering a longer audio track
    planned frames that do not exist, and an AVI clip at frame 0 failed to seek)."""
    items = write_corpus_media(tmp_path / "v.lance", "video")
    size, frames, step = (32, 48), 5, 2
    sampler = VideoClips(frames=frames, frame_step=step, clips_per_item=3, starts="even", size=list(size))
    # Under `ReplaceBadRow` a good clip wrongly refused was silently replaced by another row's.
    dm = LanceDataModule(
        train=LanceSource(str(tmp_path / "v.lance"), columns=["video", "name"]),
        batch_size=5,
        clips=sampler,
        drop_last=False,
        bad_rows=ReplaceBadRow(seed=0),
    )
    clips = by_row(dm, "video")
    assert sorted(clips) == list(range(len(items))) and all(len(found) == 3 for found in clips.values())
    span = (frames - 1) * step + 1
    for row, item in enumerate(items):
        expected = whole_video_rgb(item.data, size)
        assert len(expected) == item.frames
        for fraction, (pixels, times) in zip((0.0, 0.5, 1.0), clips[row], strict=True):
            first = int(np.floor(fraction * (item.frames - span)))
            indices = np.arange(first, first + span, step)
            np.testing.assert_array_equal(
                pixels.transpose(0, 2, 3, 1), expected[indices], err_msg=f"{item.name} {fraction}"
            )
            np.testing.assert_allclose(times, np.array(item.frame_times)[indices], err_msg=item.name)
        assert clips[row][-1][1][-1] == pytest.approx(item.frame_times[-1])  # the last clip ends at the last frame


def test_corpus_audio_windows_are_the_whole_decode_within_the_codec_tolerance(tmp_path: Path) -> None:
    """WAV, FLAC, MP3, M4A and Ogg/Opus as Lance blobs: windows at the start, middle and end equal
    the whole stream decoded and resampled by PyAV, exactly for WAV and FLAC, within the codec's
    stated tolerance for the lossy ones (MP3 windows were off by up to 0.38 from their start)."""
    items = write_corpus_media(tmp_path / "a.lance", "audio")
    rate, seconds = 16000, 0.5
    sampler = AudioClips(seconds=seconds, sample_rate=rate, clips_per_item=3, starts="even")
    dm = LanceDataModule(
        train=LanceSource(str(tmp_path / "a.lance"), columns=["audio"]), batch_size=4, clips=sampler, drop_last=False
    )
    windows = by_row(dm, "audio")
    count = round(seconds * rate)
    for row, item in enumerate(items):
        expected = whole_audio(item.data, rate, 1)
        total = item.duration_samples * rate // item.sample_rate
        assert total <= expected.shape[1]
        for fraction, (samples, start) in zip((0.0, 0.5, 1.0), windows[row], strict=True):
            first = round(fraction * (total - count))
            assert float(start[0]) == first / rate
            error = float(np.max(np.abs(samples[0] - expected[0, first : first + count])))
            assert error <= item.tolerance, f"{item.name} at {fraction}: off by {error:.4g}"


def test_videos_of_two_sizes_without_size_name_the_parameter(tmp_path: Path) -> None:
    """Regression (#50): `size: null` with videos of two sizes ended in 106 lines of numpy's "all
    input arrays must have the same shape"."""
    write_corpus_media(tmp_path / "v.lance", "video", names=("h264.mp4", "h264_60.mp4"))
    dm = LanceDataModule(
        train=LanceSource(str(tmp_path / "v.lance"), columns=["video"]),
        batch_size=2,
        clips=VideoClips(frames=2),
    )
    with pytest.raises(ConfigError) as error:
        batches(dm)
    assert error.value.param == "VideoClips.size"
    assert "48x64" in str(error.value) and "32x48" in str(error.value) and "set size: [" in str(error.value)


@pytest.mark.parametrize("blob", [True, False])
def test_a_null_media_value_is_a_bad_row_in_a_blob_column_as_in_a_binary_one(tmp_path: Path, blob: bool) -> None:
    """Regression (#52, found by the type checker): ``take_blobs`` gives ``None`` for a null blob, and
    the clip reader then failed with a raw ``AttributeError`` ('NoneType' object has no attribute
    'size'); a null in a plain binary column was already bad media for the bad-row policy."""
    videos = [None if row == 2 else _video(row, video_frames(row), 32) for row in range(4)]
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("video", pa.large_binary(), metadata=BLOB if blob else None)]
    )
    uri = str(tmp_path / "null.lance")
    lance.write_dataset(pa.table({"id": range(4), "video": videos}, schema=schema), uri)
    clips = VideoClips(frames=3, size=[16, 16])
    raising = LanceDataModule(train=LanceSource(uri, columns=["id", "video"]), batch_size=4, clips=clips)
    with pytest.raises(BadRowError, match=r"dataset row 2 .*column 'video'") as error:
        batches(raising)
    assert error.value.position == 2
    replacing = LanceDataModule(
        train=LanceSource(uri, columns=["id", "video"]), batch_size=4, clips=clips, bad_rows=ReplaceBadRow(seed=1)
    )
    rows = [row for batch in batches(replacing) for row in batch["_clip_row"].tolist()]
    assert len(rows) == 4 and 2 not in rows
