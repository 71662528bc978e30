"""The video example (examples/video.py, configs/video.yaml) works as its header says.

- ``prepare`` writes the same dataset twice (the same bytes for every video), with the documented
  columns, balanced labels and splits, the ``video`` column stored as a Lance blob, and videos of
  48 to 96 frames at 64x64 that PyAV decodes; an existing dataset is left alone.
- The two commands of the config's header, each in a subprocess as a user runs them (with the
  dataset, the run directory and the epoch count pointed at the test's temporary directory; forked
  from the test zygote, `tests.zygote`: the process a fresh start gives, less the imports), exit
  0, write a checkpoint whose data cursor counts the trained clip batches, and log ``train_loss``,
  ``val_loss`` and ``val_acc`` to TensorBoard.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import lance
import pytest
import torch

from tests import zygote
from tests.harness import REPO_ROOT, subprocess_env

CONFIG = REPO_ROOT / "configs" / "video.yaml"
EXAMPLE = REPO_ROOT / "examples" / "video.py"
TIMEOUT_S = 300


def _videos(uri: str) -> list[bytes]:
    dataset = lance.dataset(uri)
    return [blob.read() for blob in dataset.take_blobs("video", indices=list(range(dataset.count_rows())))]


def test_prepare_is_deterministic_blob_encoded_and_idempotent(tmp_path: Path) -> None:
    import av

    from examples.video import CLASSES, FPS, MAX_FRAMES, MIN_FRAMES, SIZE, prepare
    from lance_lightning.source import is_blob

    first = prepare(str(tmp_path / "a.lance"), videos_per_class=3)
    second = prepare(str(tmp_path / "b.lance"), videos_per_class=3)
    dataset = lance.dataset(first)
    assert is_blob(dataset.schema.field("video")), dataset.schema.field("video")
    videos = _videos(first)
    assert len(videos) == 3 * CLASSES and videos == _videos(second), "not the same bytes twice"
    table = dataset.to_table(columns=["id", "label", "split"])
    assert table.equals(lance.dataset(second).to_table(columns=["id", "label", "split"]))
    assert table["id"].to_pylist() == list(range(12))
    assert table["label"].to_pylist() == [row % CLASSES for row in range(12)]
    assert table["split"].to_pylist() == ["val" if row % 5 == 0 else "train" for row in range(12)]

    for data in videos[:3]:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            frames = list(container.decode(stream))
            assert MIN_FRAMES <= len(frames) <= MAX_FRAMES
            assert (frames[0].height, frames[0].width) == (SIZE, SIZE) and stream.average_rate == FPS

    version = dataset.version
    assert prepare(first) == first and lance.dataset(first).version == version  # left alone
    lance.write_dataset(table.select(["id"]), str(tmp_path / "other.lance"))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare(str(tmp_path / "other.lance"))


def _scalars(log_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _run(command: list[str], cwd: Path) -> str:
    """``command`` in a subprocess from ``cwd``, forked from the test zygote (`tests.zygote`); its output."""
    proc = zygote.run(command, cwd=cwd, env=subprocess_env(), text=True, timeout=TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{out[-6000:]}"
    return out


@pytest.mark.slow
def test_the_header_commands_write_the_dataset_and_train(tmp_path: Path) -> None:
    data = tmp_path / "clips.lance"
    runs = tmp_path / "runs" / "video"
    out = _run([sys.executable, str(EXAMPLE), str(data)], tmp_path)
    assert "rows: 96" in out and "train: 76" in out and "val: 20" in out, out

    script = Path(sys.executable).with_name("lance-lightning")
    cli = [str(script)] if script.is_file() else [sys.executable, "-m", "lance_lightning.cli"]
    out = _run(
        [
            *cli,
            "fit",
            "--config",
            str(CONFIG),
            f"--data.train.uri={data}",
            f"--data.val.uri={data}",
            "--trainer.max_epochs=2",
            f"--trainer.default_root_dir={runs}",
            f"--trainer.logger.init_args.save_dir={runs}",
            "--trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    log_dir = runs / "tensorboard" / "version_0"
    last = log_dir / "checkpoints" / "last.ckpt"
    assert last.is_file(), out[-6000:]
    assert "Data loading report" in out, "DataLoadingMonitor printed no report"

    checkpoint = torch.load(last, weights_only=True)
    steps_per_epoch = 76 * 2 // 16  # 76 train videos, 2 clips each, full batches of 16
    assert checkpoint["global_step"] == 2 * steps_per_epoch, checkpoint["global_step"]
    cursor = checkpoint["LanceDataModule"]["train_cursor"]
    assert (cursor["epoch"], cursor["epoch_steps"]) == (1, steps_per_epoch), cursor
    plan = cursor["plan"]
    assert plan["filter"] == "split = 'train'" and plan["rows"] == 76 * 2, plan  # the cursor counts clips
    assert plan["clips"]["kind"] == "VideoClips" and plan["clips"]["frames"] == 8, plan["clips"]

    scalars = _scalars(log_dir)
    assert scalars.get("train_loss") and all(v == v for v in scalars["train_loss"]), sorted(scalars)
    assert len(scalars.get("val_loss", [])) == 2 and len(scalars.get("val_acc", [])) == 2, sorted(scalars)
