"""Synthetic, labelled media for tests and examples: moving squares and tones, encoded with PyAV.

Guarantees:
- `moving_shapes` and `tone` depend only on their arguments: the same ``(label, seed)`` gives the
  same array on every machine with the same NumPy (its PCG64 generator seeded ``[label, seed]``).
- A clip's class is visible: in `moving_shapes` it is the square's colour in every frame (red,
  green, blue, yellow) and its direction across frames (right, left, down, up), over a static
  texture with a little grain; in `tone` it is the pitch, ``220 * 2 ** (label / 4)`` Hz.
- `encode_video` writes H.264 (``libx264``, yuv420p) in MP4 by default, a keyframe exactly every
  ``gop`` frames (no scene-cut keyframes), frame ``i`` at ``i / fps`` seconds. The encoder runs on
  one thread and the muxer in bitexact mode, so the same frames give the same bytes with the same
  PyAV wheel (its bundled FFmpeg and x264), whatever the machine's core count.
- `encode_audio` writes 16-bit FLAC (the default) with a SEEKTABLE, a point every frame or few
  (FFmpeg's muxer writes none, and FFmpeg seeks a FLAC without one by a binary search over the
  file), or 16-bit PCM in WAV (``codec="pcm_s16le"``: a seek is byte arithmetic, no search). Sample
  ``i`` is at ``i / sample_rate`` seconds; the same samples give the same bytes.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import av
import numpy as np

#: `moving_shapes` by label: the square's direction ((rows, columns) per pixel of speed) and colour.
MOTIONS = ((0, 1), (0, -1), (1, 0), (-1, 0))
COLORS = ((230, 40, 40), (40, 200, 40), (60, 80, 240), (230, 210, 40))
MOTION_CLASSES = len(MOTIONS)
#: The container each audio codec is written in.
AUDIO_CONTAINERS = {"flac": "flac", "pcm_s16le": "wav"}


def _rng(label: int, seed: int) -> np.random.Generator:
    if label < 0 or seed < 0:
        raise ValueError(f"label and seed must be >= 0, got label={label}, seed={seed}")
    return np.random.default_rng([label, seed])


def moving_shapes(label: int, frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """uint8 ``[frames, height, width, 3]`` RGB: a square of the class's colour moving in the class's
    direction at a seeded speed, wrapping around the edges, over a seeded texture with grain."""
    if not 0 <= label < MOTION_CLASSES:
        raise ValueError(f"label must be in [0, {MOTION_CLASSES}), got {label}")
    if frames < 1 or height < 8 or width < 8:
        raise ValueError(f"need frames >= 1 and height, width >= 8, got {frames}, {height}, {width}")
    rng = _rng(label, seed)
    texture = rng.integers(60, 140, (height, width, 3), dtype=np.int16)
    side = max(4, min(height, width) // 5)
    color = np.clip(np.array(COLORS[label], np.int16) + rng.integers(-15, 16, 3, dtype=np.int16), 0, 255)
    speed = int(rng.integers(1, 4))
    row, column = int(rng.integers(0, height)), int(rng.integers(0, width))
    rows, columns = np.arange(height)[:, None], np.arange(width)[None, :]
    clip = np.empty((frames, height, width, 3), np.uint8)
    for t in range(frames):
        top = (row + MOTIONS[label][0] * speed * t) % height
        left = (column + MOTIONS[label][1] * speed * t) % width
        inside = ((rows - top) % height < side) & ((columns - left) % width < side)
        frame = texture + rng.integers(-4, 5, (height, width, 3), dtype=np.int16)
        frame[inside] = color
        clip[t] = np.clip(frame, 0, 255)
    return clip


def encode_video(
    frames: np.ndarray, fps: int = 24, codec: str = "libx264", container: str = "mp4", gop: int = 12
) -> bytes:
    """``frames`` (uint8 ``[T, H, W, 3]`` RGB, H and W even) encoded as one video stream."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {frames.shape}")
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs an even height and width, got {height}x{width}")
    options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "threads": "1"}
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container, container_options={"fflags": "+bitexact"}) as output:
        stream = output.add_stream(codec, rate=fps, options=options)
        stream.height, stream.width, stream.pix_fmt = height, width, "yuv420p"
        stream.codec_context.thread_count = 1  # one encoder thread: the same bytes under any load
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
    return buffer.getvalue()


def tone(label: int, seconds: float, sample_rate: int, seed: int, channels: int = 1) -> np.ndarray:
    """float32 ``[channels, round(seconds * sample_rate)]`` in [-1, 1]: a sine at the class's pitch
    with a seeded amplitude and phase (each channel its own phase) and faint noise."""
    rng = _rng(label, seed)
    times = np.arange(round(seconds * sample_rate)) / sample_rate
    amplitude = rng.uniform(0.3, 0.6)
    phases = rng.uniform(0, 2 * np.pi, (channels, 1))
    pitch = 220.0 * 2 ** (label / 4)
    noise = rng.normal(0.0, 0.01, (channels, len(times)))
    return np.clip(amplitude * np.sin(2 * np.pi * pitch * times + phases) + noise, -1, 1).astype(np.float32)


def encode_audio(samples: np.ndarray, sample_rate: int, codec: str = "flac") -> bytes:
    """``samples`` (float ``[channels, S]`` in [-1, 1], 1 or 2 channels) as 16-bit audio: FLAC in
    a FLAC file with a SEEKTABLE, or ``"pcm_s16le"`` in WAV."""
    if codec not in AUDIO_CONTAINERS:
        raise ValueError(f"codec must be one of {sorted(AUDIO_CONTAINERS)}, got {codec!r}")
    if samples.ndim != 2 or samples.shape[0] not in (1, 2):
        raise ValueError(f"samples must be [channels, S] with 1 or 2 channels, got {samples.shape}")
    layout = "mono" if samples.shape[0] == 1 else "stereo"
    # Interleaved s16, the sample format both encoders take.
    pcm = np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16).T
    buffer = io.BytesIO()
    packets: list[tuple[int, int, int]] = []  # (first sample, bytes, samples) of each encoded frame
    with av.open(buffer, mode="w", format=AUDIO_CONTAINERS[codec], container_options={"fflags": "+bitexact"}) as output:
        stream = output.add_stream(codec, rate=sample_rate, layout=layout)
        frames = []
        for start in range(0, len(pcm), 4096):
            chunk = np.ascontiguousarray(pcm[start : start + 4096]).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = sample_rate, start, Fraction(1, sample_rate)
            frames.append(frame)
        for to_encode in [*frames, None]:  # None: flush the encoder
            for packet in stream.encode(to_encode):
                if packet.size:
                    packets.append((packet.pts, packet.size, packet.duration))
                output.mux(packet)
    data = buffer.getvalue()
    return _with_seektable(data, packets) if codec == "flac" else data


def _with_seektable(flac: bytes, packets: list[tuple[int, int, int]]) -> bytes:
    """``flac`` with FFmpeg's trailing PADDING block turned into a SEEKTABLE (a point every few
    frames) and a smaller PADDING of the same total size, so no frame moves. FFmpeg's muxer writes
    no seektable; its demuxer uses one (with ``fflags=+fastseek``) instead of a binary search."""
    position, blocks = 4, []  # after "fLaC": (offset, type, length) of each metadata block
    while True:
        header = flac[position]
        blocks.append((position, header & 0x7F, int.from_bytes(flac[position + 1 : position + 4], "big")))
        position += 4 + blocks[-1][2]
        if header & 0x80:
            break
    offset, kind, length = blocks[-1]
    if kind != 1 or position + sum(size for _, size, _ in packets) != len(flac):
        raise RuntimeError("FFmpeg's FLAC muxer no longer ends its metadata with padding before the frames")
    every = -(-len(packets) // ((length - 4) // 18))  # 18 bytes a point; keep 4 for the padding header
    frame_offsets = np.cumsum([0] + [size for _, size, _ in packets])
    points = b"".join(
        struct.pack(">QQH", packets[i][0], frame_offsets[i], packets[i][2]) for i in range(0, len(packets), every)
    )
    rest = length - 4 - len(points)
    table = bytes([3]) + len(points).to_bytes(3, "big") + points
    padding = bytes([0x80 | 1]) + rest.to_bytes(3, "big") + bytes(rest)
    return flac[:offset] + table + padding + flac[position:]
