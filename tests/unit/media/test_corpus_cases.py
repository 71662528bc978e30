"""The media corpus holds every case issue #50 names ("the lever"), measured from the files' bytes
with plain PyAV (no code of this package), not taken from the notes the corpus gives its files:

- video in MP4, MOV, MKV, WebM, AVI and MPEG-TS, with and without an audio track, the audio track
  longer and shorter than the video, a non-zero start time, B-frames, 29.97 and 60 fps, a variable
  frame rate;
- audio in WAV, FLAC, MP3, M4A (AAC) and Ogg/Opus.

A file dropped from the corpus, or one whose encoder settings stop making the case it was made for
(an encoder that no longer writes B-frames, a muxer that drops the start offset), fails here, so the
corpus tests (`test_corpus.py`) and the checker's media draws cannot lose a case without a word.
(Images cut at any byte, the corpus's third part, are made and checked in
tests/unit/write/test_prepare_truncated.py.)
"""

from __future__ import annotations

import io

import av
import numpy as np

from tests.media_corpus import MediaFile, corpus

#: What issue #50 asks the corpus to hold.
VIDEO_CASES = {
    "container mp4",
    "container mov",
    "container mkv",
    "container webm",
    "container avi",
    "container ts",
    "with audio",
    "without audio",
    "audio longer than video",
    "audio shorter than video",
    "non-zero start",
    "B-frames",
    "29.97 fps",
    "60 fps",
    "variable frame rate",
}
AUDIO_CASES = {"wav pcm", "flac flac", "mp3 mp3", "m4a aac", "opus opus"}
#: PyAV's demuxer names of each extension's container (FFmpeg groups MP4/MOV and MKV/WebM).
FAMILIES = {
    "mp4": "mov,mp4",
    "mov": "mov,mp4",
    "mkv": "matroska",
    "webm": "matroska",
    "avi": "avi",
    "ts": "mpegts",
    "wav": "wav",
    "flac": "flac",
    "mp3": "mp3",
    "m4a": "mov,mp4",
    "opus": "ogg",
    "mka": "matroska",
}
#: The usual name of a decoder FFmpeg names otherwise.
DECODERS = {"pcm_s16le": "pcm", "mp3float": "mp3"}


def _ends(container: av.container.InputContainer) -> tuple[list[float], int, float | None]:
    """The decoded video frames' times, how many are B-frames, and the audio track's end (s)."""
    times, b_frames = [], 0
    for frame in container.decode(video=0):
        times.append(float(frame.time))
        b_frames += frame.pict_type == av.video.frame.PictureType.B
    audio_end = None
    if container.streams.audio:
        container.seek(0)
        for frame in container.decode(audio=0):
            audio_end = float(frame.time) + frame.samples / frame.sample_rate
    return times, b_frames, audio_end


def cases_of(item: MediaFile) -> set[str]:
    """The issue's cases one corpus file makes, measured from its bytes."""
    ext = item.name.rsplit(".", 1)[1]
    with av.open(io.BytesIO(item.data)) as container:
        assert container.format.name.startswith(FAMILIES[ext]), (item.name, container.format.name)
        if item.kind == "audio":
            codec = container.streams.audio[0].codec_context.name
            return {f"{ext} {DECODERS.get(codec, codec)}"}
        times, b_frames, audio_end = _ends(container)
    gaps = np.diff(times)
    video_end = times[-1] + float(np.median(gaps))
    cases = {f"container {ext}", "with audio" if audio_end is not None else "without audio"}
    if audio_end is not None and abs(audio_end - video_end) > 0.1:
        cases.add("audio longer than video" if audio_end > video_end else "audio shorter than video")
    if times[0] > 0.5:
        cases.add("non-zero start")
    if b_frames:
        cases.add("B-frames")
    rate = (len(times) - 1) / (times[-1] - times[0])
    median = float(np.median(gaps))
    # Matroska's millisecond times vary a constant rate by 1 ms; AVI's first gap is two frames long
    # (its header counts a frame the decoder does not give): a variable rate changes again and again.
    if np.count_nonzero(np.abs(gaps - median) > median / 2) >= 3:
        cases.add("variable frame rate")
    elif abs(rate - 30000 / 1001) < 0.01:
        cases.add("29.97 fps")
    elif abs(rate - 60) < 0.01:
        cases.add("60 fps")
    return cases


def test_the_corpus_holds_every_case_the_issue_names() -> None:
    videos, audios = set(), set()
    for item in corpus():
        (videos if item.kind == "video" else audios).update(cases_of(item))
    assert VIDEO_CASES - videos == set(), "cases no corpus video makes"
    assert AUDIO_CASES - audios == set(), "cases no corpus audio file makes"


def test_each_tricky_video_is_the_case_it_was_made_for() -> None:
    """The files the corpus tests and the replayed ``issue50-clips-outside`` case rely on."""
    by_name = {item.name: cases_of(item) for item in corpus() if item.kind == "video"}
    expected = {
        "h264_bframes_aac.mp4": {"B-frames", "audio longer than video"},
        "h264_aac_short.mov": {"audio shorter than video"},
        "h264_aac.mkv": {"audio longer than video"},  # issue #50 (6): 49 frames counted for 48
        "vp9_opus.webm": {"audio longer than video"},  # 55 for 48
        "h264_start125.mkv": {"non-zero start"},  # 78 for 48
        "h264_mp2.ts": {"non-zero start", "audio longer than video"},
        "h264_vfr.mkv": {"variable frame rate"},
        "h264_vfr.mp4": {"variable frame rate"},
        "h264_2997.mp4": {"29.97 fps"},
        "h264_60.mp4": {"60 fps"},
        "mpeg4_mp3.avi": {"container avi", "with audio"},  # issue #50 (6): a clip at frame 0
    }
    for name, cases in expected.items():
        assert cases <= by_name[name], (name, by_name[name])
