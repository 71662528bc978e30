"""Media clips for training: decode a short video clip or audio window from a seekable file object
(a ``lance.BlobFile``, an ``io.BytesIO``, an open file) with PyAV, reading only the bytes it needs.

Guarantees:
- `lance_lightning.media.video.decode_video_clip` and `lance_lightning.media.audio.decode_audio_clip`
  give exactly the frames / samples a decode of the whole file gives at the clip's positions.
- `lance_lightning.media.containers` opens the file once (`open_video`, `open_audio`) and keeps
  it open across clips and epochs in a bounded, thread-safe `MediaPool`; a file that is not
  usable media raises `BadMedia` with a readable reason.
- `lance_lightning.media.synthetic` makes small, deterministic, labelled videos and tones for
  tests and examples.
"""
