"""What a DataLoader worker process imports to decode images: not torchvision (#51).

The fork server that starts a loader's workers preloads the transform's module
(`lance_lightning.load.lean_start.worker_context`), and each worker unpickles the transform. Importing
torchvision imports all of it, ``torch._dynamo`` and SymPy included (3.6 s of CPU on a loaded 2-core
machine, as much as torch), though `DecodeImage`'s usual path (uint8 JPEGs to normalised float32)
never calls it: `lance_lightning.transforms.vision` imports it on first use. This test runs a
data module with a worker process in a fresh interpreter (the fork server is per process: in the
test process an earlier test's transform module may have been preloaded) and checks, in the worker
that decoded the images, which modules it had imported.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from PIL import Image

from lance_lightning.load.forked_server import ENV_SWITCH as FORKED_SERVER
from lance_lightning.load.handoff import ENV_SWITCH as HANDOFF
from lance_lightning.load.race import CHOICE_SWITCH

REPO_ROOT = Path(__file__).resolve().parents[3]
#: Modules whose import costs seconds of CPU and that decoding JPEGs does not need.
HEAVY = ("torchvision", "torch._dynamo", "sympy")

_SCRIPT = """
import json, os, sys
import lance_lightning as ll
from lance_lightning.transforms import Compose, DecodeImage
from tests.worker_probe import RecordImports

heavy = sys.argv[2].split(",")
dm = ll.LanceDataModule(train=ll.LanceSource(sys.argv[1], columns=["id", "image"]), batch_size=8,
                        shuffle=ll.RowShuffle(seed=0), num_workers=1,
                        transform=Compose([DecodeImage(mean=[0.5] * 3, std=[0.25] * 3), RecordImports(*heavy)]))
dm.setup("fit")
flags, pids, ids, shapes = set(), set(), [], set()
for batch in dm.train_dataloader():
    flags.update(map(tuple, batch["imported"].tolist()))
    pids.update(batch["pid"].tolist())
    ids += batch["id"].tolist()
    shapes.add((tuple(batch["image"].shape[1:]), str(batch["image"].dtype)))
print(json.dumps({"flags": sorted(flags), "pids": sorted(pids), "main": os.getpid(), "ids": sorted(ids),
                  "shapes": sorted(shapes)}))
"""


@pytest.fixture
def jpeg_uri(tmp_path: Path) -> str:
    blobs = []
    for i in range(32):
        out = io.BytesIO()
        Image.new("RGB", (12, 10), (8 * i, 255 - 8 * i, 90)).save(out, "JPEG")
        blobs.append(out.getvalue())
    table = pa.table({"id": pa.array(range(32), pa.int64()), "image": pa.array(blobs, pa.binary())})
    lance.write_dataset(table, str(tmp_path / "jpegs.lance"))
    return str(tmp_path / "jpegs.lance")


@pytest.mark.slow
@pytest.mark.parametrize("server", ["forked", "stock"])
def test_a_worker_decodes_jpegs_without_importing_torchvision(jpeg_uri: str, server: str) -> None:
    """A forked server's worker holds what the training process imported and imports nothing
    (`tests.worker_probe.imported_here`); the stock server's imports only what the transform needs."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env[HANDOFF], env[CHOICE_SWITCH] = "off", "workers"  # every batch from the worker
    env[FORKED_SERVER] = "on" if server == "forked" else "off"
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, jpeg_uri, ",".join(HEAVY)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["pids"]) == 1 and report["main"] not in report["pids"], "batches did not come from the worker"
    assert report["ids"] == list(range(32)), "every row once"
    assert report["shapes"] == [[[3, 10, 12], "torch.float32"]], "decoded and normalised"
    assert report["flags"] == [[0] * len(HEAVY)], f"the worker imported some of {HEAVY}: {report['flags']}"
