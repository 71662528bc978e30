"""Issue #52, remote inputs: ``prepare`` reads image/media folders, tar shards and Parquet files from an
S3-compatible store (moto on loopback) with the guarantees of local inputs.

Oracles without the package: the input files' bytes (uploaded with boto3), their rows read with
pyarrow and tarfile, the frames and samples they were encoded with, and an uninterrupted run.
Credentials are looked for as bytes in everything a prepare leaves: the dataset's files, the report,
stderr and the config a fit saves.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_lightning.errors import ConfigError
from lance_lightning.media.synthetic import encode_audio, encode_video, tone
from lance_lightning.source import LanceSource, Prepare
from lance_lightning.write import prepare
from lance_lightning.write.input_fs import open_input, shown_uri
from lance_lightning.write.prepare import prepare_sources
from tests.helpers import run_cli_process, stop_prepare_after
from tests.s3_server import S3Server
from tests.scenarios.test_prepare_cli import _FIT_CONFIG as LOCAL_FIT_CONFIG
from tests.unit.write.inputs import CLASSES, hf_folder, image_folder, parquet_files, tar_shards

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLER = REPO_ROOT / "tests" / "prepare_kill.py"
BUCKET = "data"  # the session server's bucket (tests/conftest.py)


def _client(server: S3Server) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
    )


def upload(server: S3Server, folder: Path, *, extra: dict[str, bytes] | None = None) -> str:
    """Every file under ``folder`` put under a new prefix with boto3 (and ``extra`` keys as given:
    folder markers, hidden files); the prefix's URI."""
    prefix = f"raw-{uuid.uuid4().hex[:10]}"
    client = _client(server)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.put_object(
                Bucket=BUCKET, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes()
            )
    for key, body in (extra or {}).items():
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=body)
    return f"s3://{BUCKET}/{prefix}"


def read_back(out: Path) -> list[dict[str, Any]]:
    return lance.dataset(str(out)).to_table(blob_handling="all_binary").to_pylist()


def class_rows(folder: Path, column: str) -> list[dict[str, Any]]:
    """The rows of a class folder in walk order (classes sorted, files sorted): the files' bytes."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = [f for c in classes for f in sorted((folder / c).iterdir())]
    return [
        {"id": i, column: f.read_bytes(), "label": classes.index(f.parent.name), "path": f"{f.parent.name}/{f.name}"}
        for i, f in enumerate(files)
    ]


def test_imagefolder_from_s3_reads_back_as_its_files(tmp_path: Path, s3: S3Server) -> None:
    """Threads and spawned processes (which get the storage options, not an open file system); a
    hidden object and a folder marker are left out, a corrupt image is skipped and listed, as locally."""
    folder = image_folder(tmp_path / "in", per_class=3, bad=("dog/broken.jpg",))
    uri = upload(s3, folder, extra={"cat/.DS_Store": b"junk", "fox/": b""})
    expected = [row for row in class_rows(folder, "image") if row["path"] != "dog/broken.jpg"]
    local = prepare(Prepare("imagefolder", str(folder), unit_files=2), str(tmp_path / "local.lance"), progress=False)
    for pool in ("threads", "processes"):
        out = tmp_path / f"{pool}.lance"
        spec = Prepare("imagefolder", uri, unit_files=2, workers=2, pool=pool)
        report = prepare(spec, str(out), storage_options=s3.storage_options(), progress=False)
        got = read_back(out)
        assert [{k: r[k] for k in ("id", "image", "label", "path")} for r in got] == expected
        assert [r["label_name"] for r in got] == [CLASSES[r["label"]] for r in expected]
        assert [p for p, _ in report.skipped] == ["dog/broken.jpg"] and report.input == uri
        assert "is not a readable image" in report.skipped[0][1]
        assert lance.dataset(str(out)).to_table().equals(lance.dataset(str(tmp_path / "local.lance")).to_table())
    assert local.skipped == report.skipped


@pytest.mark.parametrize("fmt", ["videofolder", "audiofolder"])
def test_media_folders_from_s3_are_their_bytes_and_probed_streams(tmp_path: Path, s3: S3Server, fmt: str) -> None:
    """Each file's bytes, and the frames/samples it was encoded with (probed from the store's bytes);
    a file that is not media is skipped and listed."""
    folder, facts = tmp_path / "in", {}
    for k, name in enumerate(("a", "b")):
        (folder / name).mkdir(parents=True)
        for n in range(2):
            if fmt == "videofolder":
                frames = np.full((4 + n, 16, 16, 3), 40 * k + 10 * n, np.uint8)
                data, path = encode_video(frames, fps=8), f"{name}/{n}.mp4"
                facts[path] = {"video_frames": 4 + n, "width": 16, "height": 16}
            else:
                samples = tone(k, 0.25 + 0.25 * n, 8000, seed=n)
                data, path = encode_audio(samples, 8000, "flac"), f"{name}/{n}.flac"
                facts[path] = {"audio_samples": samples.shape[1], "audio_sample_rate": 8000}
            (folder / path).write_bytes(data)
    (folder / "b" / ("z.mp4" if fmt == "videofolder" else "z.flac")).write_bytes(b"not media at all")
    column = "video" if fmt == "videofolder" else "audio"
    expected = [r for r in class_rows(folder, column) if r["path"] in facts]
    out = tmp_path / "out.lance"
    report = prepare(Prepare(fmt, upload(s3, folder), unit_files=1), str(out), storage_options=s3.storage_options())
    got = read_back(out)
    assert [{k: r[k] for k in ("id", column, "label", "path")} for r in got] == expected
    for row in got:
        assert {k: row[k] for k in facts[row["path"]]} == facts[row["path"]]
    assert [p for p, _ in report.skipped] == ["b/z.mp4" if fmt == "videofolder" else "b/z.flac"]


def _shard_rows(folder: Path) -> list[dict[str, Any]]:
    """The samples of the shards (sorted), read with tarfile: key, shard, jpg bytes, cls as int."""
    rows = []
    for shard in sorted(folder.iterdir()):
        with tarfile.open(shard) as tar:
            samples: dict[str, dict[str, Any]] = {}
            for member in tar:
                key, ext = member.name.split(".", 1)
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                sample = samples.setdefault(key, {"key": key, "shard": shard.name, "seg_png": None})
                sample[ext.replace(".", "_")] = int(data) if ext == "cls" else data
            rows += samples.values()
    return [{"id": i, **row} for i, row in enumerate(rows)]


def test_webdataset_shards_from_s3_are_their_members(tmp_path: Path, s3: S3Server) -> None:
    """A folder of shards (one gzipped) and one shard given as the input file."""
    folder = tar_shards(tmp_path / "in", shards=3, per_shard=4)
    with tarfile.open(folder / "shard-01.tar") as plain, tarfile.open(folder / "shard-01.tar.gz", "w:gz") as gz:
        for member in plain:
            gz.addfile(member, plain.extractfile(member))
    (folder / "shard-01.tar").unlink()
    expected = _shard_rows(folder)
    uri = upload(s3, folder)
    out = tmp_path / "out.lance"
    prepare(Prepare("webdataset", uri, unit_files=1, workers=2), str(out), storage_options=s3.storage_options())
    assert [{k: r[k] for k in expected[0]} for r in read_back(out)] == expected
    one = tmp_path / "one.lance"
    report = prepare(Prepare("webdataset", f"{uri}/shard-02.tar"), str(one), storage_options=s3.storage_options())
    assert [{k: r[k] for k in expected[0] if k != "id"} for r in read_back(one)] == [
        {k: v for k, v in r.items() if k != "id"} for r in expected if r["shard"] == "shard-02.tar"
    ]
    assert report.input == f"{uri}/shard-02.tar"


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_tables_from_s3_are_their_rows(tmp_path: Path, s3: S3Server, fmt: str) -> None:
    if fmt == "parquet":
        folder = parquet_files(tmp_path / "in", files=3, rows=5)
        whole = pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob("*.parquet")))
    else:
        folder = hf_folder(tmp_path / "in", files=2, rows=6)
        tables = []
        for name in sorted(folder.glob("*.arrow")):
            with pa.OSFile(str(name)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        whole = pa.concat_tables(tables).replace_schema_metadata(None)
    uri = upload(s3, folder)
    out = tmp_path / "out.lance"
    prepare(Prepare(fmt, uri, unit_files=1), str(out), storage_options=s3.storage_options())
    got = lance.dataset(str(out)).to_table()
    assert got.column("id").to_pylist() == list(range(whole.num_rows))
    assert got.drop(["id"]).replace_schema_metadata(None).equals(whole)
    if fmt == "parquet":  # one file as the input
        one = tmp_path / "one.lance"
        prepare(Prepare(fmt, f"{uri}/part-1.parquet"), str(one), storage_options=s3.storage_options())
        assert lance.dataset(str(one)).to_table().drop(["id"]).equals(pq.read_table(folder / "part-1.parquet"))


def test_an_input_is_pickled_with_its_options_never_an_open_file_system(tmp_path: Path, s3: S3Server) -> None:
    source = open_input(upload(s3, image_folder(tmp_path / "in", per_class=1)), s3.storage_options(), file_ok=False)
    assert source._fs is not None
    again = pickle.loads(pickle.dumps(source))
    assert again._fs is None and again.storage_options == s3.storage_options()
    assert [e.path for e in again.files([], "skip")] == [e.path for e in source.files([], "skip")]


def _cli_args(uri: str, out: Path, options: dict[str, str], *extra: str) -> list[str]:
    settings = [f"--storage-option={key}={value}" for key, value in options.items()]
    return ["--format", "imagefolder", "--input", uri, "--output", str(out), *settings, *extra]


@pytest.fixture(scope="module")
def killed_input(tmp_path_factory: pytest.TempPathFactory, s3: S3Server) -> tuple[Path, str, Path]:
    """The SIGKILL tests' image folder, its upload and the oracle: an uninterrupted CLI prepare from the
    store (one for both moments; each test reads the prefix and writes its own output)."""
    root = tmp_path_factory.mktemp("killed_input")
    folder = image_folder(root / "in", per_class=4, bad=("fox/zz.png",))
    uri = upload(s3, folder)
    code, output = run_cli_process(
        ["prepare", *_cli_args(uri, root / "whole.lance", s3.storage_options(), "--quiet")], root
    )
    assert code == 0, output
    return folder, uri, root / "whole.lance"


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "pool"), [("commit:2", "processes"), ("write:1", "threads")])
def test_a_sigkilled_cli_prepare_from_s3_rerun_completes_exactly_once(
    tmp_path: Path, s3: S3Server, killed_input: tuple[Path, str, Path], moment: str, pool: str
) -> None:
    folder, uri, whole_out = killed_input
    args = _cli_args(uri, tmp_path / "out.lance", s3.storage_options(), "--unit-files", "2", "--workers", "2")
    args += ["--pool", pool, "--quiet"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"PYTHONPATH": str(REPO_ROOT)}
    with (tmp_path / "killed.log").open("wb") as log:  # a file, not a pipe: a leftover worker cannot hang this
        killed = subprocess.Popen(
            [sys.executable, str(KILLER), moment, "cli", *args], env=env, stdout=log, stderr=log, start_new_session=True
        )
        assert killed.wait(timeout=300) == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    assert _group_ends(killed.pid), "a spawned worker outlived the SIGKILLed prepare"
    assert not (tmp_path / "out.lance").exists()
    code, output = run_cli_process(["prepare", *args], tmp_path)
    assert code == 0 and "resumed after" in output, output
    resumed, whole = (lance.dataset(str(path)).to_table() for path in (tmp_path / "out.lance", whole_out))
    assert resumed.equals(whole)
    expected = [r for r in class_rows(folder, "image") if r["path"] != "fox/zz.png"]
    assert [{k: r[k] for k in ("id", "image", "label", "path")} for r in resumed.to_pylist()] == expected


def _group_ends(group: int, timeout: float = 120.0) -> bool:
    """Whether every process of the process group ``group`` ends within ``timeout`` s (those left are killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)
    return False


def _rewrite(s3: S3Server, uri: str, key: str, body: bytes) -> None:
    """Put ``body`` at ``key`` under ``uri`` with a modification time other than the object's
    (S3 keeps whole seconds: put again until the store's time has moved on)."""
    client, bucket, prefix = _client(s3), *uri.removeprefix("s3://").split("/", 1)
    before = client.head_object(Bucket=bucket, Key=f"{prefix}/{key}")["LastModified"]
    for _ in range(100):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
        if client.head_object(Bucket=bucket, Key=f"{prefix}/{key}")["LastModified"] != before:
            return
        time.sleep(0.1)
    raise AssertionError("the store kept the object's modification time")


@pytest.mark.parametrize("change", ["same_size", "other_size"])
def test_an_input_object_changed_after_an_interrupted_run_is_refused_then_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: S3Server, change: str
) -> None:
    """A committed unit's object rewritten in place (same size: same fingerprint, another
    modification time; or another size: another fingerprint) is refused naming the input and the
    fix; after deleting the partial output the rerun holds the new bytes. Locally alike."""
    folder = image_folder(tmp_path / "in", per_class=2)
    uri, options = upload(s3, folder), s3.storage_options()
    changed = folder / "cat" / "000.png"
    new = changed.read_bytes()[::-1] if change == "same_size" else changed.read_bytes() + b"\0"
    for source, out in ((uri, tmp_path / "remote.lance"), (str(folder), tmp_path / "local.lance")):
        spec = Prepare("imagefolder", source, unit_files=1, workers=1, on_bad_file="skip")
        stop_prepare_after(monkeypatch, spec, str(out), 2, options)
        if source == uri:
            _rewrite(s3, uri, "cat/000.png", new)
        else:
            before = changed.stat().st_mtime_ns
            changed.write_bytes(new)
            os.utime(changed, ns=(before + 10**9, before + 10**9))  # as a copy made a second later
        with pytest.raises(ConfigError) as error:
            prepare(spec, str(out), storage_options=options, progress=False)
        assert error.value.param == ("input" if change == "same_size" else "output"), str(error.value)
        text = str(error.value)
        assert ("changed since the interrupted prepare" if change == "same_size" else "fingerprint differs") in text
        assert "delete" in text and f"{out}.partial" in text
        shutil.rmtree(f"{out}.partial")
        report = prepare(spec, str(out), storage_options=options, progress=False)
        assert report.status == "prepared"
        rows = {r["path"]: r["image"] for r in read_back(out)}
        if change == "same_size":  # the reversed bytes are no image: read now, and skipped
            assert [path for path, _ in report.skipped] == ["cat/000.png"] and "cat/000.png" not in rows
        else:
            assert rows["cat/000.png"] == new


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.slow
def test_credentials_never_reach_the_dataset_the_report_stderr_or_a_saved_config(tmp_path: Path, s3: S3Server) -> None:
    """Given as storage options, and in the input URI itself (``s3://KEY:SECRET@bucket/...``)."""
    folder = image_folder(tmp_path / "in", per_class=2)
    uri = upload(s3, folder)
    secrets = (s3.secret_key.encode(), s3.access_key.encode())
    code, output = run_cli_process(["prepare", *_cli_args(uri, tmp_path / "a.lance", s3.storage_options())], tmp_path)
    assert code == 0 and "prepared from imagefolder" in output, output
    host = s3.endpoint.removeprefix("http://")
    userinfo = f"{s3.access_key}:{quote(s3.secret_key, safe='')}"  # as a URI must write it
    inline = uri.replace("s3://", f"s3://{userinfo}@") + f"?endpoint_override={host}&scheme=http"
    args = ["prepare", "--format", "imagefolder", "--input", inline, "--output", str(tmp_path / "b.lance")]
    code, inline_output = run_cli_process(args, tmp_path)
    assert code == 0 and f"prepared from imagefolder {uri}:" in inline_output, inline_output
    config = tmp_path / "fit.yaml"
    config.write_text(_FIT_CONFIG.format(root=tmp_path / "run", out=tmp_path / "c.lance", images=uri, **_options(s3)))
    code, fit_output = run_cli_process(["fit", "--config", str(config)], REPO_ROOT)
    assert code == 0 and "c.lance prepared from imagefolder" in fit_output, fit_output[-3000:]
    saved = list((tmp_path / "run").rglob("config.yaml"))
    assert saved, "the fit saved no config"
    config.unlink()  # the user's own file holds the secret; nothing the run wrote may
    for name in ("a.lance", "b.lance", "c.lance"):
        assert lance.dataset(str(tmp_path / name)).count_rows() == 6
    left = _all_bytes(tmp_path) + (output + inline_output + fit_output).encode()
    for secret in (*secrets, quote(s3.secret_key, safe="").encode()):
        assert secret not in left


#: The local one-command fit's config (test_prepare_cli) with the store's storage options.
_FIT_CONFIG = LOCAL_FIT_CONFIG.replace(
    "    prepare: {{format: imagefolder, input: {images}}}\n",
    "    prepare: {{format: imagefolder, input: {images}}}\n"
    "    storage_options: {{aws_access_key_id: {key}, aws_secret_access_key: {secret}, aws_region: us-east-1,\n"
    "      aws_endpoint: '{endpoint}', allow_http: 'true'}}\n",
)


def _options(s3: S3Server) -> dict[str, str]:
    return {"key": s3.access_key, "secret": s3.secret_key, "endpoint": s3.endpoint}


@pytest.mark.slow
def test_wrong_credentials_a_missing_prefix_or_a_dead_store_end_on_one_screen_before_writing(
    tmp_path: Path, s3: S3Server
) -> None:
    uri = upload(s3, image_folder(tmp_path / "in", per_class=1))
    wrong = s3.storage_options(secret="not-the-secret-0123456789")
    dead = {**s3.storage_options(), "aws_endpoint": "http://127.0.0.1:9"}  # the discard port: refused
    cases = [(uri, wrong, "cannot be read from its store"), (f"{uri}-missing", s3.storage_options(), "does not exist")]
    cases.append((uri, dead, "cannot be read from its store"))
    # credentials in the URI, the secret's "/" not escaped: pyarrow cannot parse it, and quotes it
    cases.append((uri.replace("s3://", "s3://AKIDINURI:not-the/secret+0123@"), {}, "cannot be read from its store"))
    for given, options, problem in cases:
        out = tmp_path / "out.lance"
        code, output = run_cli_process(["prepare", *_cli_args(given, out, options)], tmp_path)
        assert code == 1, output
        assert problem in output and "parameter: --input" in output and shown_uri(given) in output, output
        assert "Traceback" not in output and len(output.strip().splitlines()) <= 8, output
        for secret in ("not-the-secret-0123456789", s3.secret_key, "not-the/secret+0123", "AKIDINURI"):
            assert secret not in output
        assert not out.exists() and not Path(f"{out}.partial").exists()
    source = LanceSource(str(tmp_path / "d.lance"), prepare=Prepare("imagefolder", uri), storage_options=wrong)
    with pytest.raises(ConfigError) as error:
        prepare_sources([source], progress=False)
    assert error.value.param == "prepare.input" and error.value.value == uri
    assert not (tmp_path / "d.lance").exists()


@pytest.mark.slow
def test_ray_tasks_read_an_s3_input_with_the_options_they_are_given(tmp_path: Path, s3: S3Server) -> None:
    """``pool="ray"``: each task unpickles the input with its storage options and opens the store
    itself; the dataset equals the thread pool's, row for row."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as tests/scenarios/test_ray.py
    ray = pytest.importorskip("ray", reason="needs the ray extra: uv sync --extra ray")
    uri = upload(s3, parquet_files(tmp_path / "in", files=4, rows=6))
    threads = tmp_path / "threads.lance"
    prepare(Prepare("parquet", uri, unit_files=1), str(threads), storage_options=s3.storage_options())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = tmp_path / "ray.lance"
        spec = Prepare("parquet", uri, unit_files=1, workers=2, pool="ray")
        report = prepare(spec, str(out), storage_options=s3.storage_options(), progress=False)
    finally:
        ray.shutdown()
    assert report.rows == 24 and report.pool == "ray"
    assert lance.dataset(str(out)).to_table().equals(lance.dataset(str(threads)).to_table())


def test_an_output_inside_a_remote_input_is_refused_before_writing(tmp_path: Path, s3: S3Server) -> None:
    uri = upload(s3, image_folder(tmp_path / "in", per_class=1))
    with pytest.raises(ConfigError, match="is inside the input") as error:
        prepare(Prepare("imagefolder", uri), f"{uri}/out.lance", storage_options=s3.storage_options())
    assert error.value.param == "output"
    listed = _client(s3).list_objects_v2(Bucket=BUCKET, Prefix=uri.removeprefix(f"s3://{BUCKET}/") + "/out.lance")
    assert listed["KeyCount"] == 0  # nothing written


def test_the_report_of_an_s3_output_counts_its_blob_files(tmp_path: Path, s3: S3Server) -> None:
    """Blob columns' values live in files beside the data files; in a store they are listed with the
    output's storage options (without them the report counted none of them)."""
    (tmp_path / "in").mkdir()
    with tarfile.open(tmp_path / "in" / "a.tar", "w") as tar:
        for n in range(3):
            for ext, data in (("mp4", bytes([n]) * ((1 << 20) + n)), ("cls", b"%d" % n)):
                info = tarfile.TarInfo(f"clip{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = s3.fresh_uri(BUCKET, "blobs")
    report = prepare(Prepare("webdataset", str(tmp_path / "in")), out, storage_options=s3.storage_options())
    prefix = out.split(f"s3://{BUCKET}/", 1)[1]
    listed = _client(s3).list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/data/")["Contents"]
    on_store = sum(item["Size"] for item in listed)
    assert on_store > 3 << 20 and report.bytes_out == on_store, (report.bytes_out, on_store)


@pytest.mark.parametrize("fmt", ["imagefolder", "webdataset", "parquet"])
def test_a_file_uri_is_read_through_pyarrow_fs_as_its_folder_is_read(tmp_path: Path, fmt: str) -> None:
    """A URI of another file system pyarrow opens (``file://``: no credentials, no server) takes the
    remote path (listing, survey, reading through `pyarrow.fs`) and gives the local prepare's dataset."""
    make = {
        "imagefolder": lambda: image_folder(tmp_path / "in", per_class=2),
        "webdataset": lambda: tar_shards(tmp_path / "in", shards=2, per_shard=3),
        "parquet": lambda: parquet_files(tmp_path / "in"),
    }
    folder = make[fmt]()
    local = tmp_path / "local.lance"
    prepare(Prepare(fmt, str(folder), unit_files=1), str(local), progress=False)
    through = tmp_path / "uri.lance"
    report = prepare(Prepare(fmt, folder.as_uri(), unit_files=1, workers=2), str(through), progress=False)
    assert report.input == folder.as_uri() and report.rows == lance.dataset(str(local)).count_rows() > 0
    assert lance.dataset(str(through)).to_table().equals(lance.dataset(str(local)).to_table())
