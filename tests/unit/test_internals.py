"""The internals of other libraries the package leans on keep the shape it relies on (docs/internals.md).

An upgrade changes these without notice: each test fails with one message naming the internal,
where the package uses it and what breaks, before a user meets the change as a wrong result.
"""

from __future__ import annotations

import inspect
import io
import sys
from multiprocessing import forkserver, popen_forkserver, spawn
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from PIL import Image

from lance_lightning.load import forked_server, lean_start
from lance_lightning.transforms import decoders
from tests.helpers import RecordingModel, write_dataset


def _changed(internal: str, used_by: str, effect: str) -> str:
    return f"{internal} changed shape: {used_by} relies on it ({effect}); see docs/internals.md"


@pytest.mark.skipif(sys.version_info[:2] not in lean_start.LEAN_PYTHONS, reason="lean start is off on this Python")
def test_cpython_forkserver_launch() -> None:
    stock = inspect.getsource(popen_forkserver.Popen._launch)
    mirrored = [
        "spawn.get_preparation_data(process_obj._name)",
        "reduction.dump(prep_data, buf)",
        "reduction.dump(process_obj, buf)",
        "forkserver.connect_to_new_process(self._fds)",
        "os.dup(w)",
        "util.Finalize(self, util.close_fds",
        "forkserver.read_signed(self.sentinel)",
    ]
    missing = [line for line in mirrored if line not in stock]
    keys = spawn.get_preparation_data("probe")
    message = _changed(
        "CPython's forkserver launch (multiprocessing.popen_forkserver.Popen._launch, spawn.get_preparation_data)",
        "lance_lightning.load.lean_start.LeanPopen, which mirrors it",
        "workers would start wrongly; set LANCE_LIGHTNING_LEAN_WORKERS=off until LeanPopen follows it",
    )
    assert not missing, f"{message}; no longer in the stock launch: {missing}"
    assert set(lean_start._MAIN_KEYS) & set(keys) or "sys_argv" in keys, f"{message}; preparation keys: {sorted(keys)}"


@pytest.mark.skipif(sys.version_info[:2] not in forked_server.FORKED_PYTHONS, reason="the forked server is off here")
def test_cpython_forkserver_state_and_loop() -> None:
    message = _changed(
        "CPython's fork server (multiprocessing.forkserver.main, ForkServer's private state)",
        "lance_lightning.load.forked_server.ForkedServer, which runs that loop in a fork of the training process",
        "workers would not start; set LANCE_LIGHTNING_FORKED_SERVER=off until ForkedServer follows it",
    )
    assert list(inspect.signature(forkserver.main).parameters)[:3] == ["listener_fd", "alive_r", "preload"], message
    state = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_lock")
    assert all(hasattr(forkserver._forkserver, name) for name in state), message
    used = inspect.getsource(forkserver.ForkServer.ensure_running) + inspect.getsource(
        forkserver.ForkServer.connect_to_new_process
    )
    expected = ["os.waitpid(self._forkserver_pid, os.WNOHANG)", "client.connect(self._forkserver_address)"]
    assert all(line in used for line in expected), f"{message}; missing: {[x for x in expected if x not in used]}"


def test_torch_jit_script_compiles_the_decode_loops() -> None:
    for backend in ("torchvision", "torchcodec"):
        loop = decoders.compiled_loop(backend)
        assert isinstance(loop, torch.jit.ScriptFunction), _changed(
            "torch.jit.script",
            f"lance_lightning.transforms.decoders.compiled_loop({backend!r})",
            "the image decode loop falls back to Python and holds the GIL per image: decoding slows down",
        )


def test_torchcodec_private_decode_ops() -> None:
    assert decoders._torchcodec() is not None, "torchcodec.decoders does not import: image decode falls back"
    schemas = {
        "decode_jpeg": "torchcodec_ns::decode_jpeg(Tensor input, int mode) -> Tensor",
        "decode_png": "torchcodec_ns::decode_png(Tensor input, int mode, int output_dtype=0) -> Tensor",
    }
    for name, schema in schemas.items():
        op = getattr(torch.ops.torchcodec_ns, name, None)
        shown = str(op.default._schema) if op is not None else "missing"
        assert shown == schema, _changed(
            f"TorchCodec's private op torch.ops.torchcodec_ns.{name} ({shown})",
            "lance_lightning.transforms.decoders._torchcodec_rows",
            "DecodeImage(backend='torchcodec') calls it directly",
        )
    image = Image.new("RGB", (8, 6), (200, 30, 60))
    for fmt in ("JPEG", "PNG"):
        encoded = io.BytesIO()
        image.save(encoded, fmt)
        data = torch.frombuffer(bytearray(encoded.getvalue()), dtype=torch.uint8)
        kinds = [0 if fmt == "JPEG" else 1]
        stacked, _ = decoders.compiled_loop("torchcodec")(data, [0, len(data)], kinds, 0)
        reference = torch.ops.image.decode_image(data, 0, False)
        assert stacked.shape == (1, 3, 6, 8) and torch.equal(stacked[0], reference), _changed(
            f"TorchCodec's torch.ops.torchcodec_ns.decode_{fmt.lower()}",
            "lance_lightning.transforms.decoders",
            "its output no longer equals torchvision's decode of the same bytes",
        )


def test_lightning_loop_counters(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "d.lance", 40, fragment_rows=20)
    from lance_lightning import LanceDataModule, LanceSource

    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(
        RecordingModel(), datamodule=LanceDataModule(train=LanceSource(uri, columns=["id", "x"]), batch_size=10)
    )
    checkpoint = trainer._checkpoint_connector.dump_checkpoint()
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    counters = ("ready", "started", "processed", "completed")
    message = _changed(
        "Lightning's fit loop counters (checkpoint['loops']['fit_loop'] epoch_progress, "
        "epoch_loop.batch_progress, epoch_loop.state_dict._batches_that_stepped; "
        "trainer.fit_loop.epoch_progress / epoch_loop.batch_progress; "
        "trainer._checkpoint_connector._loaded_checkpoint)",
        "lance_lightning.cursor.loop.normalize_loop_state, cursor.progress, callbacks.monitor",
        "a resume after a max_steps stop would lose or repeat an epoch's rest",
    )
    for name in ("epoch_progress", "epoch_loop.batch_progress"):
        for part in ("current", "total"):
            assert all(isinstance(fit.get(name, {}).get(part, {}).get(k), int) for k in counters), message
    assert isinstance(fit.get("epoch_loop.state_dict", {}).get("_batches_that_stepped"), int), message
    assert fit["epoch_loop.batch_progress"]["current"]["completed"] == 2, message
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == 2, message
    assert isinstance(trainer.fit_loop.epoch_progress.current.processed, int), message
    assert hasattr(trainer._checkpoint_connector, "_loaded_checkpoint"), message
