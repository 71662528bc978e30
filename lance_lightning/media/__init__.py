"""Media clips for training: decode a short video clip or audio window from a seekable file object
(a ``lance.BlobFile``, an ``io.BytesIO``, an open file) with PyAV, reading only the bytes it needs.

Guarantees:
- `lance_lightning.media.video.decode_video_clip` gives exactly the frames a decode of the whole
  video stream gives at the clip's indices, counted and timed by the stream's own frame index
  (`lance_lightning.media.frame_index`), never the container's duration;
  `lance_lightning.media.audio.decode_audio_clip` gives the samples of the whole stream decoded
  and resampled, bit for bit for PCM and lossless codecs and within a stated per-codec tolerance
  for lossy ones (MP3, AAC, Opus: decoder pre-roll and encoder delay handled).
- `lance_lightning.media.containers` opens the file once (`open_video`, `open_audio`) and keeps
  it open across clips and epochs in a bounded, thread-safe `MediaPool`; a file that is not
  usable media raises `BadMedia` with a readable reason.
- `lance_lightning.media.synthetic` makes small, deterministic, labelled videos and tones for
  tests and examples.
"""
