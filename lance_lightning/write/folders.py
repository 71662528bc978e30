"""Class-folder formats: ``imagefolder``, ``videofolder``, ``audiofolder`` (``root/<class>/.../<file>``).

Guarantees:
- Classes are the sub-folders of the input that hold at least one file, in sorted order; ``label``
  is a class's position in that order, ``label_name`` its folder name. Files are read in
  `Input.files` order (a local folder, or a prefix of any store: `lance_lightning.write.input_fs`),
  so row ``id`` ``i`` is the ``i``-th file.
- Columns: ``id`` (int64), the media column (``image``, ``video`` or ``audio``: the file's bytes,
  unchanged), ``label`` (int64), ``label_name`` (string), ``path`` (the file relative to the input).
  Video and audio are stored with Lance's blob encoding (read back a window at a time, never
  loaded whole by a scan); images are plain binary, which reads faster for small files.
- ``videofolder`` and ``audiofolder`` add each file's stream facts as typed columns
  (`lance_lightning.media.probe`: ``video_frames``, ``video_fps``, ``width``, ...;
  ``audio_sample_rate``, ``audio_samples``, ...), counted by the clip decoder's own frame index.
- A file at the top level, or one whose extension is not the format's, is refused (`ConfigError`
  naming it) at survey time, before anything is written. A file that cannot be read, is empty,
  (for video/audio) does not open as media with a stream of its kind, or (for images) does not
  decode whole is skipped and listed, or refused, by ``on_bad_file``: every
  image is decoded fully (PIL ``verify()`` then ``load()``) and a PNG or GIF must keep its end
  marker, so an image cut short at any byte (a JPEG whose scan stops halfway included) is never
  kept as a good row.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lance_lightning.errors import ConfigError
from lance_lightning.media.probe import MEDIA_FIELDS, probe
from lance_lightning.write.input_fs import Input, open_input
from lance_lightning.write.units import Item, Skipped, Survey, Unit, empty_input, refuse_foreign, suffix, with_id

#: Lance's blob encoding for a large_binary field (stored out of line, read by ranges).
BLOB_METADATA = {"lance-encoding:blob": "true"}
#: Rows per record batch handed to the fragment writer.
BATCH_ROWS = 256


@dataclass(frozen=True)
class ClassFolder:
    """One class-folder format: its name, the media column, the extensions it reads, blob or not."""

    name: str
    column: str
    extensions: frozenset[str]
    blob: bool
    #: Video/audio: probe each file's streams into columns (`lance_lightning.media.probe`); False stores bytes only.
    probe: bool = True

    def survey(self, input_: str, on_bad_file: str, storage_options: dict[str, str] | None = None) -> Survey:
        source = open_input(input_, storage_options, file_ok=False)
        items: list[Item] = []
        classes: list[str] = []
        skipped: list[Skipped] = []
        for entry in source.files(skipped, on_bad_file):
            parts = entry.path.split("/")
            if len(parts) == 1:
                raise ConfigError(
                    "input",
                    entry.path,
                    f"is a file at the top level; --format {self.name} reads class sub-folders (root/<class>/<file>)",
                    "put every file in the folder of its class, or choose the --format of this file",
                )
            if suffix(entry.path) not in self.extensions:
                raise refuse_foreign(
                    entry.path, self.name, f"a {self.column} file ({', '.join(sorted(self.extensions))})"
                )
            if not classes or classes[-1] != parts[0]:
                classes.append(parts[0])
            items.append(Item(entry.path, entry.size, 1, len(classes) - 1, entry.mtime_ns))
        if not items:
            raise empty_input(source, self.name, f"{self.column} files in class sub-folders")
        media = pa.field(self.column, pa.large_binary(), metadata=BLOB_METADATA if self.blob else None)
        fields = [
            media,
            pa.field("label", pa.int64()),
            pa.field("label_name", pa.string()),
            pa.field("path", pa.string()),
            *(MEDIA_FIELDS.get(self.column, []) if self.probe else []),
        ]
        return Survey(source, items, with_id(fields), skipped, info={"classes": classes})

    def read(self, survey: Survey, unit: Unit, skipped: list[Skipped], on_bad_file: str) -> Iterator[pa.RecordBatch]:
        """Yield the unit's rows as record batches of at most `BATCH_ROWS` rows, in item order."""
        classes = survey.info["classes"]
        columns: dict[str, list] = {name: [] for name in survey.schema.names}
        for offset, item in enumerate(unit.items):
            loaded = self._load(survey.source, item, skipped, on_bad_file)
            if loaded is None:
                continue
            data, facts = loaded
            values = {"id": unit.first_id + offset, self.column: data, "label": item.label}
            values.update(label_name=classes[item.label], path=item.path, **facts)
            for name in survey.schema.names:
                columns[name].append(values[name])
            if len(columns["id"]) >= BATCH_ROWS:
                yield pa.RecordBatch.from_pydict(columns, schema=survey.schema)
                columns = {name: [] for name in survey.schema.names}
        if columns["id"]:
            yield pa.RecordBatch.from_pydict(columns, schema=survey.schema)

    def _load(self, source: Input, item: Item, skipped: list[Skipped], on_bad_file: str) -> tuple[bytes, dict] | None:
        """The file's bytes and its probed stream facts (video/audio: `lance_lightning.media.probe`), or None when
        it is skipped (``on_bad_file="skip"``)."""
        facts: dict = {}
        try:
            data = source.read_bytes(item.path)
            problem = "is empty" if not data else self._check(data)
            if problem is None and self.probe and self.column in MEDIA_FIELDS:
                problem, facts = probe(self.column, data)
        except OSError as error:
            if source.remote and not isinstance(error, FileNotFoundError):
                raise  # the store failed (network, credentials): the run stops, resumable; no file is skipped
            problem = f"cannot be read ({error.strerror or error})"
        if problem is None:
            return data, facts
        if on_bad_file == "error":
            raise ConfigError(
                "input", item.path, problem, "remove or replace the file, or pass --on-bad-file skip to leave it out"
            )
        skipped.append(Skipped(item.path, problem))
        return None

    def _check(self, data: bytes) -> str | None:
        """Why ``data`` is not a valid file of this format, or None. Images are decoded whole (PIL's
        ``load()``, after ``verify()`` checked the structure and checksums) and must end with their
        format's end marker: a file cut short anywhere is caught, as training would find it."""
        if self.column != "image":
            return None  # video/audio: opened and probed by `lance_lightning.media.probe` (`_load`)
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # raises on a truncated scan (LOAD_TRUNCATED_IMAGES is False unless a user set it)
                kind = image.format
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as error:
            return f"is not a readable image ({str(error).split(' <')[0]})"  # without the buffer's address
        if kind in _END_MARKERS and not _END_MARKERS[kind](data):
            return f"is not a readable image (a {kind} file cut short: its end marker is missing)"
        return None


#: Formats whose files end with a marker that a whole-image decode does not need: PNG's ``IEND``
#: chunk (with its checksum), GIF's trailer byte.
_END_MARKERS = {
    "PNG": lambda data: b"IEND\xaeB`\x82" in data,
    "GIF": lambda data: data.rstrip(b"\0").endswith(b";"),
}


IMAGE_FOLDER = ClassFolder(
    "imagefolder", "image", frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}), False
)
VIDEO_FOLDER = ClassFolder("videofolder", "video", frozenset({".mp4", ".mkv", ".webm", ".mov", ".avi", ".ts"}), True)
AUDIO_FOLDER = ClassFolder(
    "audiofolder", "audio", frozenset({".wav", ".flac", ".mp3", ".ogg", ".m4a", ".opus", ".mka", ".webm"}), True
)
