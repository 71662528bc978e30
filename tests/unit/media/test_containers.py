"""Open media and their pool: bytes read per clip, reuse across clips, a bounded pool, freed memory."""

from __future__ import annotations

import gc
import io
import os
import threading

import lance
import numpy as np
import psutil
import pyarrow as pa
import pytest

from lance_lightning.errors import BadMedia
from lance_lightning.media.audio import decode_audio_clip
from lance_lightning.media.containers import CountingFile, MediaPool, open_audio, open_video
from lance_lightning.media.synthetic import encode_audio, encode_video, moving_shapes, tone
from lance_lightning.media.video import decode_video_clip


@pytest.fixture(scope="module")
def long_video() -> bytes:
    return encode_video(moving_shapes(0, 600, 128, 128, seed=11), fps=24, gop=12)


@pytest.fixture(scope="module")
def small_video() -> bytes:
    return encode_video(moving_shapes(1, 12, 16, 16, seed=1), fps=24, gop=6)


def test_a_middle_clip_reads_a_small_part_of_the_file_and_less_again_from_the_pool(long_video) -> None:
    pool = MediaPool(2)
    file = CountingFile(io.BytesIO(long_video))
    assert pool.checkout("video") is None
    opened = open_video(file)
    opening = (file.bytes_read, file.read_calls)
    decode_video_clip(opened, 0.5, 16, 1.0, None)
    first = (file.bytes_read, file.read_calls)
    pool.checkin("video", opened)

    again = pool.checkout("video")
    assert again is opened
    decode_video_clip(again, 0.3, 16, 1.0, None)
    second = (file.bytes_read - first[0], file.read_calls - first[1])
    pool.checkin("video", again)
    print(
        f"\n600-frame 128x128 video of {len(long_video)} bytes, 16-frame clip: first (open + clip) "
        f"{first[0]} bytes in {first[1]} reads ({first[0] / len(long_video):.1%}; headers {opening[0]} "
        f"bytes in {opening[1]} reads), second from the pool {second[0]} bytes in {second[1]} reads "
        f"({second[0] / len(long_video):.1%})"
    )
    assert first[0] < 0.35 * len(long_video)
    assert second[0] < first[0]
    pool.clear()
    assert file.closed


def test_a_middle_audio_window_reads_a_small_part_of_the_file() -> None:
    samples = tone(2, 20.0, 44100, seed=0)
    for codec in ["flac", "pcm_s16le"]:
        data = encode_audio(samples, 44100, codec)
        file = CountingFile(io.BytesIO(data))
        opened = open_audio(file)
        opening = file.bytes_read
        decode_audio_clip(opened, 0.5, 1.0, 16000, 1)
        window = file.bytes_read - opening
        print(f"\n20 s {codec} of {len(data)} bytes: open {opening} bytes, a 1 s window {window} bytes")
        assert file.bytes_read < 0.35 * len(data)
        opened.close()


def test_a_lance_blob_file_streams_a_clip(tmp_path, long_video) -> None:
    schema = pa.schema([pa.field("video", pa.large_binary(), metadata={"lance-encoding:blob": "true"})])
    dataset = lance.write_dataset(pa.table({"video": [long_video]}, schema=schema), tmp_path / "v.lance", schema=schema)
    # buffer_size=0: no read-ahead of the blob's own (512 KiB by default) past PyAV's 16 KiB reads.
    [blob] = dataset.take_blobs("video", indices=[0], buffer_size=0)
    dataset.io_stats_incremental()
    opened = open_video(blob)
    opening = dataset.io_stats_incremental()
    from_blob = decode_video_clip(opened, 0.5, 8, 2.0, (64, 64))
    clip = dataset.io_stats_incremental()
    print(
        f"\nfrom storage: open {opening.read_bytes} bytes in {opening.read_iops} reads, a clip "
        f"{clip.read_bytes} bytes in {clip.read_iops} reads, of {len(long_video)}"
    )
    assert opening.read_bytes + clip.read_bytes < 0.35 * len(long_video)
    from_bytes = decode_video_clip(open_video(io.BytesIO(long_video)), 0.5, 8, 2.0, (64, 64))
    np.testing.assert_array_equal(from_blob.frames, from_bytes.frames)
    np.testing.assert_array_equal(from_blob.timestamps, from_bytes.timestamps)
    opened.close()


def test_an_os_error_of_the_file_passes_through_unchanged(long_video) -> None:
    class FailingFile(CountingFile):
        failing = False

        def read(self, size: int = -1) -> bytes:
            if self.failing:
                raise OSError("connection reset")
            return super().read(size)

    file = FailingFile(io.BytesIO(long_video))
    opened = open_video(file)
    file.failing = True
    with pytest.raises(OSError, match="connection reset") as raised:
        decode_video_clip(opened, 0.5, 8, 1.0, None)
    assert not isinstance(raised.value, BadMedia)


def test_the_pool_keeps_the_most_recent_and_closes_the_rest(small_video) -> None:
    pool = MediaPool(2)
    opened = {key: open_video(io.BytesIO(small_video)) for key in "abcde"}
    for key in "abc":
        pool.checkin(key, opened[key])
    assert len(pool) == 2 and opened["a"].file.closed and not opened["b"].file.closed
    # A checkout removes it: nobody else gets it until it is checked in again, as the most recent.
    assert pool.checkout("b") is opened["b"] and pool.checkout("b") is None and len(pool) == 1
    pool.checkin("b", opened["b"])
    pool.checkin("d", opened["d"])
    assert opened["c"].file.closed and not opened["b"].file.closed
    assert pool.checkout("c") is None
    # One per key: a second media checked in under a key replaces (and closes) the first.
    pool.checkin("d", opened["e"])
    assert opened["d"].file.closed and pool.checkout("d") is opened["e"]
    pool.checkin("d", opened["e"])
    pool.checkin("d", opened["e"])  # checked in twice: kept, not closed
    assert not opened["e"].file.closed and len(pool) == 2
    pool.clear()
    assert len(pool) == 0 and opened["b"].file.closed and opened["e"].file.closed
    opened["e"].close()  # closing twice is harmless
    with pytest.raises(ValueError):
        MediaPool(-1)


def test_threads_sharing_a_pool_never_hold_the_same_media_at_once(small_video) -> None:
    pool = MediaPool(3)
    holders: dict[int, int] = {}
    lock = threading.Lock()
    clashes: list[int] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            key = int(rng.integers(0, 5))
            opened = pool.checkout(key) or open_video(io.BytesIO(small_video))
            with lock:
                if id(opened) in holders:
                    clashes.append(key)
                holders[id(opened)] = seed
            decode_video_clip(opened, float(rng.random()), 4, 1.0, None)
            with lock:
                del holders[id(opened)]
            pool.checkin(key, opened)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clashes == [] and len(pool) <= 3
    pool.clear()


@pytest.mark.slow
def test_closed_media_release_their_memory(small_video) -> None:
    """2,000 videos opened and decoded through a pool of 4: resident memory stays flat.

    A video left open holds ~0.9 MiB (its decoder's frames), so a leak would add hundreds of MiB.
    glibc's dynamic mmap threshold grows the heap by up to ~9 MiB over the first ~1,300 opens,
    then stops (with ``MALLOC_MMAP_THRESHOLD_`` fixed it stays under 1 MiB): the bounds allow it."""
    pool = MediaPool(4)
    process = psutil.Process(os.getpid())

    def resident_after(first: int, last: int) -> int:
        for number in range(first, last):
            key = ("uri", 1, "video", number % 50)
            opened = pool.checkout(key) or open_video(io.BytesIO(small_video))
            decode_video_clip(opened, (number % 7) / 6, 3, 2.0, (8, 8))
            pool.checkin(key, opened)
        gc.collect()
        return process.memory_info().rss

    settled, middle, end = resident_after(0, 200), resident_after(200, 1100), resident_after(1100, 2000)
    print(
        f"\nresident memory after 200, 1,100, 2,000 videos: +{(middle - settled) / 2**20:.2f} MiB, then "
        f"+{(end - middle) / 2**20:.2f} MiB"
    )
    assert end - middle < 4 * 2**20 and end - settled < 16 * 2**20
    assert len(pool) == 4
    pool.clear()
