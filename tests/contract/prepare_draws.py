"""``prepare`` drawn (issue #50): every format, unit size against worker count, blob members, bad
files, a SIGKILL at every commit point and the rerun, checked against the input files themselves.

Guarantees:
- `Ingest` (a `tests.contract.scenario.Scenario`'s ``ingest``; JSON like every part of it) says
  what one prepare composes: the format (``imagefolder``, ``videofolder``, ``audiofolder``,
  ``webdataset``, ``parquet``), how many files (samples) in how many classes (shards), whether
  members average 1 MiB or more (a webdataset extension stored as a Lance blob), ``unit_files``
  against ``workers`` (often more than ``2 * workers`` units), a truncated JPEG among the images
  (``on_bad_file: skip``: it must be skipped and listed), where a first prepare is SIGKILLed
  (``commit:N``, ``write:N``, ``rename``: `tests/prepare_kill.py`) before the rerun, and where the
  input lies (issue #52, ``location``): the local folder, its ``file://`` URI (read through
  ``pyarrow.fs``), or an S3 prefix on a moto server on loopback that the files are uploaded to,
  read with ``--storage-option`` credentials (the ``AWS_*`` environment is never passed).
- `draw_ingest` draws one from its own random stream; `write_input` writes the raw files
  (deterministic from ``seed``: images encoded with PIL, videos and audio files of the media corpus,
  `tests.media_corpus`, in every container the format reads, so a prepare that probes media
  reads real files; webdataset members random bytes).
- `run_ingest` runs what the user runs: ``lance-lightning prepare`` in a subprocess (the killed one
  through `tests/prepare_kill.py`, then the same command again) and returns every failure. An S3
  input runs on the server it is given (the soak's) or on one it starts for the part.
- The oracle (`expected_rows`, `compare`) is computed without the package from the files on disk:
  every row's every column read back from the dataset (blob columns as bytes) equals the file's
  bytes, its class folder's position and name, its relative path (webdataset: the sample's key,
  shard and each member's bytes; parquet: the input's rows), ids the input positions, nothing
  more but the media columns a probe adds (frames, height, width, sample rate and channels
  compared with the corpus's whole-stream decode where the dataset has them; the rest not); a
  skipped file is named in the closing report; the rerun after a kill says resumed (already
  complete after ``rename``; after ``write:0`` no unit need have been committed, so it prepares,
  resuming only where a parallel unit committed) and leaves a complete dataset and no ``.partial``. The files on disk
  are the oracle wherever the input lies (the S3 objects are their uploaded bytes). From S3, the
  storage options' secret and access key are in no file the prepares leave (the dataset, its
  ``.partial``) and in none of their output (stdout and stderr, the killed one's too).
- With ``then``, the prepared dataset is trained one epoch and predicted with the prediction
  writer (`fit_and_predict`): every row trained once, every row's written value its own.
"""

from __future__ import annotations

import io
import random
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tests.s3_server import S3Server

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"
FORMATS = ("imagefolder", "videofolder", "audiofolder", "webdataset", "parquet")
#: Where the input lies (`Ingest.location`), with the share of draws of each.
LOCATIONS = {"local": 0.35, "file": 0.3, "s3": 0.35}
#: A member size at or above which the webdataset extension becomes a blob column (``shards.BLOB_BYTES``,
#: restated: the oracle does not import the package).
BIG = (1 << 20) + 4096
_EXTENSIONS = {"imagefolder": ("png", "jpg")}
#: The extensions ``videofolder`` and ``audiofolder`` read (docs/getting-data-in.md).
_VIDEO, _AUDIO = ("mp4", "mkv", "webm", "mov", "avi", "ts"), ("wav", "flac", "mp3", "ogg", "m4a", "opus")
#: What the closing report says of a skipped truncated image (the file's path is on the line).
SKIPPED = "skipped"


@dataclass(frozen=True)
class Ingest:
    """One prepare of raw files, killed and rerun where drawn."""

    format: Literal["imagefolder", "videofolder", "audiofolder", "webdataset", "parquet"] = "imagefolder"
    #: Files (folders: media files; webdataset: samples; parquet: files of ``rows_per_file`` rows).
    files: int = 6
    #: Class folders (folders) or samples per shard (webdataset).
    group: int = 2
    #: Webdataset ``bin`` members of about 1 MiB (a blob column; folders' media columns always are).
    big: bool = False
    unit_files: int = 1
    workers: int = 1
    #: A first prepare SIGKILLed at this moment before the rerun (None: one uninterrupted prepare).
    kill: str | None = None
    #: One JPEG cut short among the images (imagefolder only).
    truncated: bool = False
    seed: int = 0
    #: Then one epoch of ``Trainer.fit`` (a row shuffle) and a ``predict`` with the prediction writer
    #: on the prepared dataset (`fit_and_predict`).
    then: bool = False
    #: Where ``--input`` points (issue #52): ``local`` (the folder's path), ``file`` (its ``file://``
    #: URI) or ``s3`` (a prefix on a moto server holding the same files); absent from the JSON at ``local``.
    location: Literal["local", "file", "s3"] = "local"


def units(ingest: Ingest) -> int:
    """How many work units the input makes (one per ``unit_files`` input files; no unit is over
    ``unit_bytes``' default of 256 MiB here)."""
    inputs = ingest.files
    if ingest.format == "webdataset":
        inputs = -(-ingest.files // ingest.group)
    elif ingest.format == "parquet":
        inputs = ingest.files
    return -(-inputs // ingest.unit_files)


def draw_ingest(rng: random.Random) -> Ingest:
    fmt = rng.choice(FORMATS)
    big = fmt == "webdataset" and rng.random() < 0.5
    files = rng.randint(3, 7) if big else rng.randint(4, 14)
    group = rng.randint(1, 3) if fmt == "webdataset" else rng.randint(1, 3)
    workers = rng.choice([1, 1, 2, 3])
    ingest = Ingest(fmt, files, group, big, rng.choice([1, 1, 2, 3]), workers, None, False, rng.randrange(1000))
    if fmt == "imagefolder" and rng.random() < 0.4:
        ingest = Ingest(**{**ingest.__dict__, "truncated": True})
    ingest = Ingest(**{**ingest.__dict__, "then": rng.random() < 0.5})
    n = units(ingest)
    if rng.random() < 0.6:
        moments = [f"write:{rng.randrange(n)}", "rename"] + ([f"commit:{rng.randint(1, n - 1)}"] * 2 if n > 1 else [])
        ingest = Ingest(**{**ingest.__dict__, "kill": rng.choice(moments)})
    # Drawn last, so that every draw above stays as it was for a seed.
    location = rng.choices(list(LOCATIONS), weights=list(LOCATIONS.values()))[0]
    return Ingest(**{**ingest.__dict__, "location": location})


# -- the input --------------------------------------------------------------------------------------
def _image(i: int, jpeg: bool) -> bytes:
    """A small noisy image (its JPEG's scan data is most of the file)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(i).integers(0, 256, (24, 20 + i % 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG" if jpeg else "PNG")
    return out.getvalue()


def decodes(data: bytes) -> bool:
    """Whether PIL decodes the whole image (the oracle's test of a good image: every pixel)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (OSError, SyntaxError, ValueError):
        return False
    return True


def write_input(ingest: Ingest, root: Path) -> Path:
    """The raw files of ``ingest`` under ``root/raw`` (written once)."""
    folder = root / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(ingest.seed)
    if ingest.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for k in range(ingest.files):
            rows = rng.randint(1, 9)
            x = [rng.randrange(1 << 40) for _ in range(rows)]
            pq.write_table(pa.table({"x": x, "text": [f"f{k}-{v}" for v in x]}), folder / f"part-{k:03d}.parquet")
        return folder
    if ingest.format == "webdataset":
        for shard in range(-(-ingest.files // ingest.group)):
            with tarfile.open(folder / f"shard-{shard:03d}.tar", "w") as tar:
                for n in range(min(ingest.group, ingest.files - shard * ingest.group)):
                    size = BIG + rng.randrange(4096) if ingest.big else rng.randint(10, 3000)
                    members = {
                        "bin": rng.randbytes(size),
                        "cls": str(rng.randrange(5)).encode(),
                        "txt": rng.randbytes(9),
                    }
                    for ext, data in members.items():
                        info = tarfile.TarInfo(f"s{shard}-{n:02d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        return folder
    extensions = _EXTENSIONS.get(ingest.format, ("", ""))
    for i in range(ingest.files):
        name = f"class{i % ingest.group}"
        (folder / name).mkdir(exist_ok=True)
        ext = extensions[i % 2]
        if ingest.format == "imagefolder":
            data = _image(i + ingest.seed, ext == "jpg")
            if ingest.truncated and i == ingest.files // 2:  # headers whole, the scan cut short
                whole = _image(i + ingest.seed, True)
                ext, data = "jpg", whole[: len(whole) * 3 // 4]
        else:
            item = _media(ingest.format)[(i + ingest.seed) % len(_media(ingest.format))]
            ext, data = item.name.rsplit(".", 1)[1], item.data
        (folder / name / f"{i:03d}.{ext}").write_bytes(data)
    return folder


def _media(fmt: str) -> list[Any]:
    """The corpus files a media folder format reads (by extension)."""
    from tests.media_corpus import corpus

    kind, accepted = {"videofolder": ("video", _VIDEO), "audiofolder": ("audio", _AUDIO)}[fmt]
    return [item for item in corpus() if item.kind == kind and item.name.rsplit(".", 1)[1] in accepted]


def _probed(fmt: str, data: bytes) -> dict[str, Any]:
    """The media columns a prepare that probes files adds, as the corpus's whole-stream decode
    states them (only those it states: sizes, frame and sample counts, rates)."""
    if fmt == "imagefolder":
        return {}
    item = next(item for item in _media(fmt) if item.data == data)
    if fmt == "videofolder":
        return {"video_frames": item.frames, "height": item.height, "width": item.width}
    return {"audio_sample_rate": item.sample_rate, "audio_channels": item.channels}


#: Columns a media probe adds that the oracle states (`_probed`): compared when the dataset has them.
PROBED = frozenset({"video_frames", "height", "width", "audio_sample_rate", "audio_channels"})
#: Columns a media probe adds that the oracle does not state (their values are not compared).
PROBE_COLUMNS = frozenset(
    {"video_codec", "video_duration", "video_fps", "video_start", "audio_codec", "audio_duration", "audio_samples",
     "audio_start"}
)  # fmt: skip


def truncated_file(ingest: Ingest) -> str | None:
    """The relative path of the truncated JPEG (None: there is none)."""
    if not ingest.truncated or ingest.format != "imagefolder":
        return None
    i = ingest.files // 2
    return f"class{i % ingest.group}/{i:03d}.jpg"


# -- the oracle (no package) ------------------------------------------------------------------------
def _walk(root: Path) -> list[Path]:
    """Files in the documented order: folders sorted, a folder's files (sorted) before its sub-folders'."""
    import os

    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(folder) / name for name in sorted(files) if not name.startswith(".")]
    return found


def expected_rows(ingest: Ingest, folder: Path) -> dict[int, dict[str, Any]]:
    """id -> every column's value, from the files on disk."""
    rows: dict[int, dict[str, Any]] = {}
    files = _walk(folder)
    if ingest.format == "parquet":
        import pyarrow.parquet as pq

        for row in [r for path in files for r in pq.read_table(path).to_pylist()]:
            rows[len(rows)] = row
        return rows
    if ingest.format == "webdataset":
        for path in files:
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    key, _, ext = member.name.partition(".")
                    if not rows or rows[len(rows) - 1]["key"] != key:
                        rows[len(rows)] = {"key": key, "shard": path.name}
                    rows[len(rows) - 1][ext.replace(".", "_")] = tar.extractfile(member).read()
        return _as_webdataset_decodes(rows)
    column = {"imagefolder": "image", "videofolder": "video", "audiofolder": "audio"}[ingest.format]
    classes = sorted({path.parent.name for path in files})
    for i, path in enumerate(files):
        relative = path.relative_to(folder).as_posix()
        if column != "image" or decodes(path.read_bytes()):
            label = classes.index(path.parent.name)
            rows[i] = {column: path.read_bytes(), "label": label, "label_name": path.parent.name, "path": relative}
            rows[i].update(_probed(ingest.format, rows[i][column]))
    return rows


def _as_webdataset_decodes(rows: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``.cls`` as int, ``.txt`` as UTF-8 text (webdataset.autodecode's basichandlers); a column
    with a member that does not decode stays bytes (prepare's documented fallback)."""
    for column, decode in (("cls", int), ("txt", lambda data: data.decode("utf-8"))):
        try:
            decoded = {i: decode(row[column]) for i, row in rows.items() if column in row}
        except (ValueError, UnicodeDecodeError):
            continue
        for i, value in decoded.items():
            rows[i][column] = value
    return rows


def read_back(uri: str) -> dict[int, dict[str, Any]]:
    """Every row of the dataset at ``uri``, blob columns as bytes, keyed by ``id`` (pylance only)."""
    import lance

    dataset = lance.dataset(uri)
    table = dataset.to_table(blob_handling="all_binary")
    rows: dict[int, dict[str, Any]] = {}
    for row in table.to_pylist():
        rows.setdefault(row.pop("id"), row)
    if len(rows) != table.num_rows:
        rows[-1] = {"duplicate ids": table.num_rows - len(rows)}
    return rows


def compare(want: dict[int, dict[str, Any]], got: dict[int, dict[str, Any]]) -> list[str]:
    """Where the dataset's rows differ from the input's (the first few)."""
    problems: list[str] = []
    if sorted(got) != sorted(want):
        problems.append(f"prepare: ids {sorted(got)[:20]}, the input has {sorted(want)[:20]} ({len(want)} rows)")
    for i in sorted(set(want) & set(got)):
        for name, value in want[i].items():
            if got[i].get(name, value if name in PROBED else None) != value:  # probed: when probed
                shown = got[i].get(name)
                shown = f"{len(shown)} bytes" if isinstance(shown, bytes) else repr(shown)[:60]
                wanted = f"{len(value)} bytes" if isinstance(value, bytes) else repr(value)[:60]
                problems.append(f"prepare: row {i} column {name}: {shown}, the input has {wanted}")
        extra = set(got[i]) - set(want[i]) - PROBE_COLUMNS
        if extra and not problems:
            problems.append(f"prepare: row {i} has columns {sorted(extra)} the input does not")
        if len(problems) >= 6:
            break
    return problems


# -- the run ----------------------------------------------------------------------------------------
def _args(ingest: Ingest, source: str, out: str) -> list[str]:
    return [
        "--format", ingest.format, "--input", source, "--output", out,
        "--unit-files", str(ingest.unit_files), "--workers", str(ingest.workers),
    ]  # fmt: skip


def _env() -> dict[str, str]:
    import os

    return {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "PYTHONPATH": str(REPO_ROOT)}


def upload(server: S3Server, folder: Path) -> str:
    """Every file under ``folder`` put under a new key prefix with boto3; the prefix's URI."""
    import uuid

    import boto3

    from tests.contract.store import bucket

    client = boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key, region_name="us-east-1",
    )  # fmt: skip
    prefix = f"ingest-{uuid.uuid4().hex[:12]}"
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket(server), Key=key, Body=path.read_bytes())
    return f"s3://{bucket(server)}/{prefix}"


def run_ingest(ingest: Ingest, root: Path, s3: S3Server | None = None) -> list[str]:
    """Prepare ``ingest``'s input as a user does (killed and rerun where drawn); every failure. An
    S3 input is uploaded to ``s3`` (a started server whose bucket `tests.contract.store.bucket`
    exists), or to a server started for this part."""
    if ingest.location != "s3" or s3 is not None:
        return _run_ingest(ingest, root, s3)
    from tests.contract.store import bucket
    from tests.s3_server import S3Server

    with S3Server.serving() as server:
        server.create_bucket(bucket(server))
        return _run_ingest(ingest, root, server)


def _run_ingest(ingest: Ingest, root: Path, s3: S3Server | None) -> list[str]:
    folder = write_input(ingest, root)
    out = str(root / "prepared.lance")
    source, options, secrets = str(folder), [], []
    if ingest.location == "file":
        source = folder.as_uri()
    elif ingest.location == "s3":
        assert s3 is not None
        source = upload(s3, folder)
        options = [f"--storage-option={key}={value}" for key, value in s3.storage_options().items()]
        secrets = [s3.secret_key, s3.access_key]
    args = [*_args(ingest, source, out), *options]
    problems: list[str] = []
    said = ""  # everything the prepares printed
    if ingest.kill is not None:
        killed = subprocess.run(
            [sys.executable, str(KILLER), ingest.kill, "cli", *args],
            cwd=root, env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        said += killed.stdout + killed.stderr
        if killed.returncode != -signal.SIGKILL:
            problems.append(f"prepare: the prepare to kill at {ingest.kill} exited {killed.returncode}")
            problems.append(_hide(killed.stderr[-1500:], secrets))
        if Path(out).exists():
            problems.append(f"prepare: killed at {ingest.kill}, the output already looked complete")
    done = subprocess.run(
        [sys.executable, "-m", "lance_lightning.cli", "prepare", *args],
        cwd=root, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    said += output
    problems += _leaked(secrets, said, root, folder)
    if done.returncode != 0:
        return [*problems, f"prepare: exited {done.returncode}:\n{_hide(output, secrets)[-2000:]}"]
    if ingest.kill is not None:
        want = {"rename": "already complete", "write:0": "prepared from"}.get(ingest.kill, "resumed after")
        if want not in output or (ingest.kill == "write:0" and "already complete" in output):
            problems.append(f"prepare: the rerun after a kill at {ingest.kill} said {output.strip()[-300:]!r}")
    skipped = truncated_file(ingest)
    if skipped is not None and ingest.kill != "rename" and skipped not in output:
        problems.append(f"prepare: the truncated {skipped} is not named in the report: {output.strip()[-300:]!r}")
    if Path(f"{out}.partial").exists():
        problems.append("prepare: a .partial is left after the rerun")
    if not Path(out).exists():
        return [*problems, "prepare: no dataset after the rerun"]
    try:
        got = read_back(out)
    except Exception as error:  # noqa: BLE001 - a dataset that does not read is the finding
        return [*problems, f"prepare: the dataset does not read back: {type(error).__name__}: {str(error)[:300]}"]
    want = expected_rows(ingest, folder)
    problems += compare(want, got)
    if ingest.then and not problems:
        problems += fit_and_predict(out, sorted(want), root)
    return problems


def _leaked(secrets: list[str], said: str, root: Path, folder: Path) -> list[str]:
    """Where a credential of the storage options shows (docs/getting-data-in.md, "Remote inputs"):
    the prepares' output, or a file they left under ``root`` (the dataset, a ``.partial``; not the input)."""
    problems = []
    for secret in secrets:
        name = "secret" if secret == secrets[0] else "access key"
        if secret in said:
            problems.append(f"prepare: the storage options' {name} is in the CLI's output")
        for path in sorted(root.rglob("*")):
            if path.is_file() and folder not in path.parents and secret.encode() in path.read_bytes():
                problems.append(f"prepare: the storage options' {name} is in {path.relative_to(root)}")
    return problems


def _hide(text: str, secrets: list[str]) -> str:
    """``text`` with the credentials masked (a failure is printed, and kept in a case)."""
    for secret in secrets:
        text = text.replace(secret, "<credential>")
    return text


def fit_and_predict(uri: str, ids: list[int], root: Path) -> list[str]:
    """One epoch of a real ``Trainer.fit`` over the prepared dataset (row shuffle, batch 3), then
    ``trainer.predict`` with `LancePredictionWriter` writing ``pred = 3 * id + 1``: every row
    trained once, every row's ``pred`` that value (read back with pylance)."""
    import lance
    import lightning.pytorch as pl
    import torch

    from lance_lightning import LanceDataModule, LanceSource, RowShuffle
    from lance_lightning.write.predictions import LancePredictionWriter

    trained: list[int] = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            trained.extend(batch["id"].tolist())
            return self.layer(batch["id"].float()[:, None]).sum() * 0

        def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, torch.Tensor]:
            return {"pred": batch["id"].double() * 3 + 1}

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    source = LanceSource(uri, columns=["id"])
    dm = LanceDataModule(train=source, predict=source, batch_size=3, shuffle=RowShuffle(seed=1), drop_last=False)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=str(root), callbacks=[LancePredictionWriter(columns=["pred"])],
    )  # fmt: skip
    model = Model()
    try:
        trainer.fit(model, datamodule=dm)
        trainer.predict(model, datamodule=dm, return_predictions=False)
        table = lance.dataset(uri).to_table(columns=["id", "pred"]).to_pylist()
    except Exception as error:  # noqa: BLE001 - the oracle reports it
        return [f"prepare, then fit and predict: {type(error).__name__}: {str(error)[:500]}"]
    problems = []
    if sorted(trained) != ids:
        problems.append(f"prepare, then fit: trained ids {sorted(trained)[:20]}, the dataset has {ids[:20]}")
    wrong = [row for row in table if row["pred"] != 3 * row["id"] + 1]
    if wrong or len(table) != len(ids):
        problems.append(f"prepare, then predict: {len(wrong)} of {len(table)} rows hold another pred: {wrong[:3]}")
    return problems
