"""Issue #52: ``prepare --format videofolder|audiofolder`` probes each file's streams into typed
columns, counted as the clip decoder counts them (its frame index), and skips and lists a file
that is not media. The oracle is the media corpus's whole-stream decode (tests/media_corpus.py)."""

from __future__ import annotations

import math
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lance_lightning.errors import BadRowError
from tests.clip_worker import fit_clips
from tests.helpers import run_cli_process
from tests.media_corpus import MediaFile, corpus
from tests.reliability.helpers import ONE_SCREEN_LINES, error_screen

NOT_MEDIA = b"this is not a media file, only its name says so\n" * 40


def _prepared(tmp_path: Path, kind: str) -> tuple[list[MediaFile], str, str]:
    """The corpus files of ``kind`` in ``in/a/`` with a non-media ``in/b/x.<ext>``, prepared by the
    CLI in a subprocess: (items, dataset URI, the CLI's output)."""
    items = [item for item in corpus() if item.kind == kind]
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for item in items:
        (root / "a" / item.name).write_bytes(item.data)
    (root / "b" / ("x.mp4" if kind == "video" else "x.wav")).write_bytes(NOT_MEDIA)
    out = str(tmp_path / f"{kind}.lance")
    code, output = run_cli_process(
        ["prepare", "--format", f"{kind}folder", "--input", str(root), "--output", out], tmp_path
    )
    assert code == 0, output[-3000:]
    return items, out, output


def _by_path(uri: str) -> dict[str, dict]:
    table = lance.dataset(uri).to_table(columns=None, blob_handling="all_binary")
    return {row["path"]: row for row in table.to_pylist()}


@pytest.mark.slow
def test_videofolder_columns_equal_the_whole_stream_decode_and_a_non_video_is_skipped(tmp_path: Path) -> None:
    items, uri, output = _prepared(tmp_path, "video")
    assert "1 file skipped" in output and "b/x.mp4" in output, output
    rows = _by_path(uri)
    assert sorted(rows) == sorted(f"a/{item.name}" for item in items)  # x.mp4 is not a row
    schema = lance.dataset(uri).schema
    assert schema.field("video_frames").type == pa.int64() and schema.field("video_fps").type == pa.float64()
    for item in items:
        row = rows[f"a/{item.name}"]
        assert row["video_frames"] == item.frames, item.name  # the whole decode's count (AVI: not its header's)
        assert math.isclose(row["video_start"], item.start_time, abs_tol=1e-9), item.name
        assert (row["width"], row["height"], row["video_codec"]) == (item.width, item.height, item.codecs[0])
        assert math.isclose(row["video_duration"], row["video_frames"] / row["video_fps"])
        if "variable" not in item.note:  # a variable rate's average is not the encoder's nominal rate
            assert math.isclose(row["video_fps"], item.fps, rel_tol=1e-9), item.name
        assert row["video"] == item.data


@pytest.mark.slow
def test_audiofolder_columns_equal_the_whole_stream_decode_and_a_non_audio_is_skipped(tmp_path: Path) -> None:
    items, uri, output = _prepared(tmp_path, "audio")
    assert "1 file skipped" in output and "b/x.wav" in output, output
    rows = _by_path(uri)
    assert sorted(rows) == sorted(f"a/{item.name}" for item in items)
    for item in items:
        row = rows[f"a/{item.name}"]
        # The length clips are planned on (AAC: without the encoder's end padding the decode keeps).
        assert row["audio_samples"] == item.duration_samples, item.name
        assert (row["audio_sample_rate"], row["audio_channels"]) == (item.sample_rate, item.channels), item.name
        assert row["audio_codec"] == item.codecs[0] and math.isclose(row["audio_start"], item.start_time, abs_tol=1e-9)
        assert math.isclose(row["audio_duration"], item.duration_samples / item.sample_rate)


def test_a_video_with_no_video_stream_is_skipped_and_listed(tmp_path: Path) -> None:
    """An audio file named ``.mp4`` (an M4A: media, but no video stream) is not a video row."""
    m4a = next(item for item in corpus() if item.name == "stereo.m4a")
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "in" / "a" / "sound.mp4").write_bytes(m4a.data)
    (tmp_path / "in" / "a" / "ok.mp4").write_bytes(next(i for i in corpus() if i.name == "h264.mp4").data)
    out = str(tmp_path / "v.lance")
    code, output = run_cli_process(
        ["prepare", "--format", "videofolder", "--input", str(tmp_path / "in"), "--output", out], tmp_path
    )
    assert code == 0 and "1 file skipped" in output and "a/sound.mp4" in output and "no video stream" in output
    assert list(_by_path(out)) == ["a/ok.mp4"]
    # --on-bad-file error: refused before anything is written, on one screen naming the file
    again = str(tmp_path / "refused.lance")
    code, output = run_cli_process(
        ["prepare", "--format", "videofolder", "--input", str(tmp_path / "in"), "--output", again]
        + ["--on-bad-file", "error"],
        tmp_path,
    )
    screen = error_screen(output)
    assert code == 1 and "Traceback" not in output and len(screen) <= ONE_SCREEN_LINES, output
    assert "a/sound.mp4" in output and "is not a readable video file (the file has no video stream)" in output


@pytest.mark.slow
def test_fit_on_the_prepared_dataset_trains_the_clips_of_the_unprobed_one(tmp_path: Path) -> None:
    """``Trainer.fit`` with ``VideoClips`` over the prepared corpus trains the clips it trains over
    the same videos written without probed columns (planning never opened a file: clip starts are
    fractions; the probed count is checked against the frame index when a file opens)."""
    from tests.videos import write_corpus_media

    items, uri, _ = _prepared(tmp_path, "video")
    write_corpus_media(tmp_path / "plain.lance", "video")
    clips = {"frames": 3, "frame_step": 2, "clips_per_item": 2, "starts": "even", "size": [32, 48]}
    runs = {}
    for name, source in (("probed", uri), ("plain", str(tmp_path / "plain.lance"))):
        spec = {"uri": source, "root": str(tmp_path), "name": name, "shuffle": "none", "clips": clips}
        _, records, _ = fit_clips({**spec, "batch_size": 2, "max_epochs": 1, "num_workers": 0})
        runs[name] = sorted((r[3], r[4], r[5]) for r in records)  # first/last time, pixel sum
    assert len(runs["probed"]) == 2 * len(items) and runs["probed"] == runs["plain"]


def test_a_probed_count_the_file_disagrees_with_is_a_bad_row_with_its_reason(tmp_path: Path) -> None:
    """A dataset whose ``video_frames`` says 35 for a 36-frame video: clips of it are a bad row
    naming both counts (never a clip cut from the wrong length)."""
    items, uri, _ = _prepared_small(tmp_path)
    table = lance.dataset(uri).to_table(blob_handling="all_binary")
    frames = table["video_frames"].to_pylist()
    frames[0] -= 1
    table = table.set_column(table.schema.get_field_index("video_frames"), "video_frames", pa.array(frames))
    blob = pa.field("video", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    table = table.cast(table.schema.set(table.schema.get_field_index("video"), blob))
    lance.write_dataset(table, str(tmp_path / "changed.lance"))
    clips = {"frames": 2, "clips_per_item": 1, "starts": "even", "size": [32, 48]}
    spec = {"uri": str(tmp_path / "changed.lance"), "root": str(tmp_path), "name": "bad", "shuffle": "none"}
    with pytest.raises(BadRowError, match=r"holds 36 frames but prepare probed 35 \(column 'video_frames'\)"):
        fit_clips({**spec, "clips": clips, "batch_size": 1, "max_epochs": 1, "num_workers": 0})


def test_replace_bad_row_replaces_a_changed_video_and_never_picks_one(tmp_path: Path) -> None:
    """Under ``ReplaceBadRow`` the clips of two videos whose probed counts disagree are replaced by
    clips of the third (never by clips of the other changed one)."""
    _, uri, _ = _prepared_small(tmp_path, ("h264.mp4", "h264_cut.mp4", "h264_bframes_aac.mp4"))
    table = lance.dataset(uri).to_table(blob_handling="all_binary")
    frames = table["video_frames"].to_pylist()
    frames[0] += 2
    frames[1] -= 1
    table = table.set_column(table.schema.get_field_index("video_frames"), "video_frames", pa.array(frames))
    blob = pa.field("video", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    lance.write_dataset(table.cast(table.schema.set(table.schema.get_field_index("video"), blob)), str(tmp_path / "c"))
    clips = {"frames": 2, "clips_per_item": 3, "starts": "even", "size": [32, 48]}
    spec = {"uri": str(tmp_path / "c"), "root": str(tmp_path), "name": "replaced", "shuffle": "none"}
    _, records, _ = fit_clips(
        {**spec, "clips": clips, "batch_size": 3, "max_epochs": 1, "num_workers": 0, "bad_rows": "replace"}
    )
    assert len(records) == 9 and {r[1] for r in records} == {2}, records


def _prepared_small(tmp_path: Path, names: tuple[str, ...] = ("h264.mp4",)) -> tuple[list[MediaFile], str, str]:
    (tmp_path / "in" / "a").mkdir(parents=True)
    for name in names:
        (tmp_path / "in" / "a" / name).write_bytes(next(i for i in corpus() if i.name == name).data)
    item = next(i for i in corpus() if i.name == names[0])
    out = str(tmp_path / "small.lance")
    code, output = run_cli_process(
        ["prepare", "--format", "videofolder", "--input", str(tmp_path / "in"), "--output", out], tmp_path
    )
    assert code == 0, output
    return [item], out, output
