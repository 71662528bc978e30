"""Small shared test helpers: a real Lance dataset writer, a recording LightningModule,
``lance-lightning`` runners (in process, and in a subprocess) and the processes of a session (a
run started with ``start_new_session=True``).

Other test modules import these (``from tests.helpers import write_dataset, RecordingModel``);
keep the signatures stable.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lance
import lightning.pytorch as pl
import numpy as np
import psutil
import pyarrow as pa
import pytest
import torch
from torch import nn

VEC_DIM = 8


def torchcodec_imports() -> bool:
    """Whether TorchCodec imports here (a GPU image's torch may have no matching TorchCodec build)."""
    from lance_lightning.transforms import decoders

    return decoders._torchcodec() is not None


#: Both decoder backends as test parameters; TorchCodec's skips where it does not import.
DECODER_BACKENDS = [
    pytest.param(
        "torchcodec",
        marks=pytest.mark.skipif(not torchcodec_imports(), reason="TorchCodec does not import with this torch"),
    ),
    "torchvision",
]


def encode_image(image: torch.Tensor, fmt: str, quality: int = 95) -> bytes:
    """``image`` (uint8 C, H, W) as PNG or JPEG bytes: TorchCodec's encoders, or torchvision's where
    TorchCodec does not import (a GPU image whose torch has no matching TorchCodec build)."""
    try:
        from torchcodec.encoders import JpegEncoder, PngEncoder
    except (ImportError, OSError, RuntimeError):
        from torchvision.io import encode_jpeg, encode_png

        data = encode_png(image) if fmt == "png" else encode_jpeg(image, quality=quality)
    else:
        data = PngEncoder(image).to_tensor() if fmt == "png" else JpegEncoder(image).to_tensor(quality=quality)
    return bytes(data.numpy().tobytes())


def make_table(
    rows: int = 1000,
    *,
    start: int = 0,
    sorted_labels: bool = False,
    label_classes: int = 10,
    extra: Mapping[str, Any] | None = None,
) -> pa.Table:
    """The table `write_dataset` writes: ids ``start..start+rows-1`` (see `write_dataset`)."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    if sorted_labels:
        labels = (np.arange(rows, dtype=np.int64) * label_classes) // max(rows, 1)
    else:
        labels = ids % label_classes
    x = (ids.astype(np.float32) / max(start + rows, 1)).astype(np.float32)
    vec = (ids[:, None] * VEC_DIM + np.arange(VEC_DIM)[None, :]).astype(np.float32).reshape(-1)
    columns: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        "label": pa.array(labels, pa.int64()),
        "x": pa.array(x, pa.float32()),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec, pa.float32()), VEC_DIM),
    }
    for name, values in (extra or {}).items():
        columns[name] = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    return pa.table(columns)


def write_dataset(
    path: Any,
    rows: int = 1000,
    *,
    fragment_rows: int | None = None,
    sorted_labels: bool = False,
    label_classes: int = 10,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Write a Lance dataset at ``path`` and return its URI (``str(path)``).

    Columns: ``id`` int64 ``0..rows-1`` (storage order), ``label`` int64 (``id % label_classes``, or
    ``sorted_labels=True``: non-decreasing, ``id * label_classes // rows``), ``x`` float32
    (``id / rows``), ``vec`` fixed_size_list<float32>[8] (row ``i`` holds ``8i .. 8i+7``), plus
    ``extra``: column name -> pyarrow array or Python list of length ``rows``.
    ``fragment_rows`` sets Lance's ``max_rows_per_file`` (rows per fragment).
    """
    uri = os.fspath(path)
    table = make_table(rows, sorted_labels=sorted_labels, label_classes=label_classes, extra=extra)
    kwargs: dict[str, Any] = {"mode": "create"}
    if fragment_rows is not None:
        kwargs["max_rows_per_file"] = fragment_rows
        kwargs["max_rows_per_group"] = min(fragment_rows, 1024)
    lance.write_dataset(table, uri, **kwargs)
    return uri


def append_rows(uri: str, rows: int, *, label_classes: int = 10) -> int:
    """Append ``rows`` rows continuing the ids after the current last one; return the new version."""
    dataset = lance.dataset(uri)
    start = dataset.count_rows()
    table = make_table(rows, start=start, label_classes=label_classes)
    table = table.select(dataset.schema.names) if set(dataset.schema.names) <= set(table.column_names) else table
    return lance.write_dataset(table, uri, mode="append").version


class RecordingModel(pl.LightningModule):
    """A tiny linear model on ``batch['x']`` that records the ids it trains on.

    Attributes:
        seen: ids of each training step, in order (``batch['id'].tolist()``; ``[]`` if no id column).
        seen_epochs: ``trainer.current_epoch`` of each training step.
        val_seen / test_seen / predict_seen: ids per eval batch.
        estimated_stepping_batches: what ``configure_optimizers`` read (with
            ``read_estimated_stepping_batches=True``), else None.
    """

    def __init__(self, read_estimated_stepping_batches: bool = False) -> None:
        super().__init__()
        self.read_estimated_stepping_batches = read_estimated_stepping_batches
        self.layer = nn.Linear(1, 1)
        self.seen: list[list[int]] = []
        self.seen_epochs: list[int] = []
        self.val_seen: list[list[int]] = []
        self.test_seen: list[list[int]] = []
        self.predict_seen: list[list[int]] = []
        self.estimated_stepping_batches: int | float | None = None

    @staticmethod
    def _ids(batch: Mapping[str, Any]) -> list[int]:
        ids = batch.get("id")
        return [int(i) for i in ids.tolist()] if ids is not None else []

    def _loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        x = batch["x"].float().reshape(-1, 1)
        return (self.layer(x) - x).pow(2).mean()

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        self.seen.append(self._ids(batch))
        self.seen_epochs.append(int(self.current_epoch))
        return self._loss(batch)

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self.val_seen.append(self._ids(batch))
        self.log("val/loss", self._loss(batch), batch_size=len(batch["x"]))

    def test_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self.test_seen.append(self._ids(batch))

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int, dataloader_idx: int = 0) -> list[int]:
        ids = self._ids(batch)
        self.predict_seen.append(ids)
        return ids

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.read_estimated_stepping_batches:
            self.estimated_stepping_batches = self.trainer.estimated_stepping_batches
        return torch.optim.SGD(self.parameters(), lr=0.01)


class WaitsForForkServer(pl.LightningModule):
    """A model mixin: its fit waits, before the first batch, for the fork server the data module
    started at ``setup`` (the loader's own `WorkerStart`: an empty process forked through it returns
    once its imports are done), so a race's gate that opens in the first epoch finds it ready."""

    def on_train_start(self) -> None:
        from lance_lightning.load.handoff import WorkerStart

        WorkerStart(self.trainer.train_dataloader.multiprocessing_context).start().wait()


def write_token_dataset(
    path: Any,
    documents: int = 200,
    *,
    max_len: int = 40,
    seed: int = 0,
    fragment_rows: int | None = None,
    first_token: int = 0,
) -> tuple[str, np.ndarray]:
    """A Lance dataset of ``documents`` token documents; return its URI and the token counts.

    Columns: ``id`` int64, ``tokens`` list<int32>, ``n_tokens`` int32, ``topic`` int64 (non-decreasing,
    ``id * 4 // documents``). Document ``i`` holds ``n_tokens[i]`` (0..``max_len``) tokens numbered by
    their place in the concatenation of all documents: token ``t`` of the stream has id
    ``first_token + t`` (distinct ``first_token`` values tell the sources of a mixture apart).
    """
    counts = np.random.default_rng(seed).integers(0, max_len + 1, documents)
    starts = np.concatenate([[0], np.cumsum(counts)])
    tokens = pa.ListArray.from_arrays(
        pa.array(starts, pa.int32()), pa.array(first_token + np.arange(starts[-1]), pa.int32())
    )
    table = pa.table(
        {
            "id": pa.array(np.arange(documents, dtype=np.int64)),
            "tokens": tokens,
            "n_tokens": pa.array(counts.astype(np.int32)),
            "topic": pa.array(np.arange(documents, dtype=np.int64) * 4 // documents),
        }
    )
    kwargs: dict[str, Any] = {"mode": "create"}
    if fragment_rows is not None:
        kwargs["max_rows_per_file"] = fragment_rows
    lance.write_dataset(table, os.fspath(path), **kwargs)
    return os.fspath(path), counts


class ImageRecordingModel(RecordingModel):
    """`RecordingModel` that also records each step's ``image`` tensor (on the CPU) in ``images``."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[torch.Tensor] = []

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        self.images.append(batch["image"].cpu())
        return super().training_step(batch, batch_idx)


class PackedRecordingModel(RecordingModel):
    """`RecordingModel` for packed batches: records each window's first token (with
    `write_token_dataset`, its stream index) in ``seen`` and every step's ``input_ids`` in ``tokens``."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[list[list[int]]] = []

    @staticmethod
    def _ids(batch: Mapping[str, Any]) -> list[int]:
        return [int(i) for i in batch["input_ids"][:, 0].tolist()]

    def _loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        x = batch["input_ids"].float().mean(dim=1, keepdim=True) / 1000
        return (self.layer(x) - x).pow(2).mean()

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        self.tokens.append(batch["input_ids"].tolist())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self.val_seen.append(self._ids(batch))
        self.log("val/loss", self._loss(batch), batch_size=len(batch["input_ids"]))


def assert_one_saved_cursor(ckpt: Mapping[str, Any]) -> None:
    """The data module's checkpoint state is the only copy of the train cursor: the callback and the
    loop's loader state hold none."""
    assert ckpt["LanceDataModule"]["train_cursor"], "the data module saved no cursor"
    assert "DataCursorCheckpoint" not in ckpt.get("callbacks", {}), ckpt["callbacks"]
    loaders = ckpt["loops"]["fit_loop"]["state_dict"].get("combined_loader", [])
    assert all(state == {} for state in loaders), loaders


def flat(seen: list[list[int]]) -> list[int]:
    """Concatenate per-step id lists."""
    return [i for step in seen for i in step]


def restorer(folder: Path, copy: Path) -> Callable[[], Path]:
    """Copies ``folder`` into ``copy`` now; the function returned puts ``folder`` back as it was
    then, at the same path (a run is named by its dataset's location), and returns it."""
    shutil.copytree(folder, copy, dirs_exist_ok=True)

    def restore() -> Path:
        shutil.rmtree(folder)
        shutil.copytree(copy, folder)
        return folder

    return restore


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """``lance-lightning ARGS`` in process: (exit status as a shell sees it, stdout, stderr)."""
    from lance_lightning.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    argv, sys.argv = sys.argv, ["lance-lightning"]  # LightningCLI warns when both are given
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def run_cli_process(args: list[str], cwd: Any, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """``lance-lightning ARGS`` in a subprocess run from ``cwd``, without this environment's ``AWS_*``
    variables but with ``env``: (exit status, stdout + stderr). The process is forked from the test
    zygote where it can be (`tests.zygote`: the same process a fresh start gives, less the imports)."""
    from pathlib import Path

    from tests import zygote

    variables = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    variables.update(env or {})
    variables["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    result = zygote.run(
        [sys.executable, "-m", "lance_lightning.cli", *args], cwd=cwd, env=variables, text=True, timeout=600
    )
    return result.returncode, result.stdout + result.stderr


def packages_imported_by(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """Which of ``packages`` a fresh interpreter has imported after importing ``modules``, sorted."""
    import json
    import subprocess

    code = (
        f"import json, sys, {', '.join(modules)}; "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(packages)!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def session_processes(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid`` (a zombie, whose parent is gone, counts as dead)."""
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def forkserver_processes(sid: int) -> list[psutil.Process]:
    """The processes of session ``sid`` running the forkserver's code: the server and its workers
    (the stock server's command, or the forked server's name: `lance_lightning.load.forked_server`)."""
    from lance_lightning.load.forked_server import SERVER_NAME

    processes, forked = session_processes(sid), set()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.name() == SERVER_NAME:  # its workers take their own name (torch's pt_data_worker)
                forked.add(process.pid)
    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.forkserver" in " ".join(process.cmdline()) or {process.pid, process.ppid()} & forked:
                found.append(process)
    return found


def wait_session_gone(sid: int, within_s: float) -> list[str]:
    """Wait up to ``within_s`` for session ``sid`` to end; kill what is left and describe it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not session_processes(sid):
            return []
        time.sleep(0.2)
    described = []
    for process in session_processes(sid):
        try:
            described.append(f"{process.pid}: {' '.join(process.cmdline())[:120]}")
            process.kill()
        except psutil.Error:
            continue
    return described


def plan_of(
    split: str,
    source: Any,
    strategy: Any = None,
    filter_read: Any = None,
    batch_size: int = 1,
    drop_last: bool = False,
) -> Any:
    """`plan_split` of a pinned ``source`` with the data module's defaults for what is ``None``."""
    from lance_lightning.plan.contract import SplitSettings
    from lance_lightning.plan.split import plan_split
    from lance_lightning.plan.strategies import FilterRead, NoShuffle

    settings = SplitSettings(strategy or NoShuffle(), filter_read or FilterRead(), batch_size, drop_last)
    return plan_split(split, source, settings)


def run_ddp_script(script: str, args: list[str], timeout: float) -> str:
    """Run ``python script args`` (``script`` from the repository root) in its own session (Lightning
    starts the other DDP ranks from it); see `run_in_own_session`."""
    return run_in_own_session([sys.executable, str(Path(__file__).resolve().parent.parent / script), *args], timeout)


def run_in_own_session(command: list[str], timeout: float, drop: tuple[str, ...] = (), spare: bool = True) -> str:
    """Run ``command`` from the repository root in its own session, without ``LOCAL_RANK`` and the
    variables in ``drop``; kill the session (every rank and worker) when it ends, and fail the test
    when it outlives ``timeout``. Returns the output (stdout and stderr); fails the test on a
    non-zero exit. Forked from the test zygote where it can be (`tests.zygote.run_in_session`: the
    process a fresh start gives, less the imports; DDP rank 1 from its ``spare``, further ranks fresh)."""
    from tests import zygote

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", *drop)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    done = zygote.run_in_session(command, cwd=root, env=env, timeout=timeout, spare=spare)
    if done.timed_out:
        pytest.fail(f"hung: {' '.join(command)[:300]}\n{done.output[-4000:]}")
    assert done.returncode == 0, done.output[-6000:]
    return done.output


def mixture_cli_config(tmp_path: Path, train: str, uri: str) -> Path:
    """A `lance-lightning fit` config (4 CPU steps of `RecordingModel`) whose ``data:`` holds the
    ``train`` YAML given, a val split read from ``uri`` and a row shuffle; a new file per call."""
    text = f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 4
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  num_sanity_val_steps: 0
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.helpers.RecordingModel
data:
{train}
  val: {{uri: {uri}, columns: [id, x]}}
  batch_size: 10
  shuffle: {{class_path: lance_lightning.RowShuffle, init_args: {{seed: 1}}}}
"""
    path = tmp_path / f"config_{len(list(tmp_path.glob('config_*')))}.yaml"
    path.write_text(text)
    return path


#: The kinds of damage `damage_cached_copy` does.
DAMAGE_KINDS = ("truncate", "flip", "replace", "delete")


def damage_cached_copy(where: Any, kind: str) -> list[Path]:
    """Damage local copies on disk as a disk, a person or another program would; return the files damaged.

    Where copies live: a `RemoteCache` keeps each copy at ``<directory>/<key>.lance`` (``directory``
    defaults to ``~/.cache/lance-lightning/remote``; `lance_lightning.materialize.cache.default_directory`),
    a `MaterializedView` at ``<cache_dir>/<key>.lance``. A copy is a Lance dataset whose rows are in
    ``<key>.lance/data/*.lance``; ``<key>.json`` beside it is the package's record of the copy (its
    files' sizes and SHA-256). ``where`` is one copy (a ``.lance`` directory) or such a directory,
    whose every copy is damaged (`ValueError` if it holds none). Neither ``<key>.json`` nor Lance's
    own manifests are touched, so Lance still opens the copy and its row count is unchanged.

    ``kind`` (`DAMAGE_KINDS`):
    - ``"truncate"``: the largest data file loses its second half.
    - ``"flip"``: three bits flipped in the largest data file's first quarter (its data pages, not
      its footer): the size and the mtime are kept, and Lance reads other values without an error.
    - ``"replace"``: each data file is rewritten in place with other rows of the same columns and
      count (neighbouring rows swapped, so every position holds another row; Lance's encoding then
      gives the same size), the mtime kept: Lance reads other rows without an error.
    - ``"delete"``: the largest data file is deleted.
    """
    import tempfile

    root = Path(where)
    copies = [root] if root.suffix == ".lance" else sorted(root.glob("*.lance"))
    if not copies or not all(copy.is_dir() for copy in copies):
        raise ValueError(f"no copy (a <key>.lance directory) at {root}")
    if kind not in DAMAGE_KINDS:
        raise ValueError(f"kind must be one of {DAMAGE_KINDS}, not {kind!r}")
    damaged: list[Path] = []
    for copy in copies:
        largest = max((copy / "data").glob("*.lance"), key=lambda path: path.stat().st_size)
        if kind == "delete":
            largest.unlink()
            damaged.append(largest)
            continue
        if kind == "truncate":
            os.truncate(largest, largest.stat().st_size // 2)
            damaged.append(largest)
            continue
        if kind == "flip":
            data = bytearray(largest.read_bytes())
            for offset in (len(data) // 16, len(data) // 8, len(data) // 5):
                data[offset] ^= 1 << (offset % 8)
            _rewrite_in_place(largest, bytes(data))
            damaged.append(largest)
            continue
        dataset = lance.dataset(str(copy))
        for fragment in dataset.get_fragments():
            files = fragment.metadata.files
            table = fragment.to_table()
            if len(files) != 1 or table.num_rows < 2:
                continue
            order = np.arange(table.num_rows)
            if table.num_rows % 2 == 0:
                order = order.reshape(-1, 2)[:, ::-1].reshape(-1)
            else:
                order = np.roll(order, 1)
            with tempfile.TemporaryDirectory() as scratch:
                lance.write_dataset(
                    table.take(pa.array(order)),
                    scratch,
                    mode="overwrite",
                    max_rows_per_file=table.num_rows,
                    data_storage_version=dataset.data_storage_version,
                )
                (written,) = (Path(scratch) / "data").glob("*.lance")
                target = copy / "data" / files[0].path
                _rewrite_in_place(target, written.read_bytes())
            damaged.append(target)
        if not damaged:
            raise ValueError(f"no fragment of {copy} has two rows to swap")
    return damaged


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` into ``path``'s own inode and set its times back (only the ctime changes)."""
    before = path.stat()
    with open(path, "r+b") as file:
        file.write(data)
        file.truncate(len(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def fit_recording(
    root: Path, datamodule: Any, *, ckpt_every: int = 0, ckpt: Path | None = None, **trainer_kwargs: Any
) -> RecordingModel:
    """``Trainer.fit`` of a fresh `RecordingModel` on CPU with `DataCursorCheckpoint` (and, with
    ``ckpt_every``, a checkpoint every that many steps in ``root/ckpt/step=N.ckpt``), resumed from
    ``ckpt`` when given; returns the model (its ``seen`` ids)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lance_lightning import DataCursorCheckpoint

    callbacks: list[Any] = [DataCursorCheckpoint()]
    if ckpt_every:
        callbacks.append(
            ModelCheckpoint(dirpath=root / "ckpt", filename="{step}", every_n_train_steps=ckpt_every, save_top_k=-1)
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(ckpt_every),
        default_root_dir=str(root),
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **trainer_kwargs,
    )
    model = RecordingModel()
    trainer.fit(model, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)
    return model


class _PrepareStopped(Exception):
    """Raised inside `stop_prepare_after`'s prepare, as a crash after its last allowed commit."""


def stop_prepare_after(
    monkeypatch: pytest.MonkeyPatch, spec: Any, out: str, commits: int, storage_options: Any = None
) -> None:
    """Run ``prepare(spec, out)`` and stop it (an exception) before its unit commit number
    ``commits + 1``: ``commits`` units are committed, as a process that died then leaves them."""
    from lance_lightning.write import prepare
    from lance_lightning.write.writer import DatasetWriter

    real, done = DatasetWriter.commit, []

    def commit(self: DatasetWriter, *args: Any) -> None:
        if len(done) == commits:
            raise _PrepareStopped
        real(self, *args)
        done.append(1)

    with monkeypatch.context() as patch:
        patch.setattr(DatasetWriter, "commit", commit)
        with pytest.raises(_PrepareStopped):
            prepare(spec, out, storage_options=storage_options, progress=False)


def sigint_as_at_a_terminal() -> None:
    """Give a child process SIGINT's default action, as a shell gives a command it runs in the
    foreground: a test run started in the background (``pytest ... &``, ``nohup``, some CI runners)
    ignores SIGINT, a child inherits that, and Python then installs no KeyboardInterrupt handler,
    so a test's Ctrl-C would never arrive (a prepare test waited 240 s and left the prepare
    running). Pass as ``preexec_fn``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
