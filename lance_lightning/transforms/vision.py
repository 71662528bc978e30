"""torchvision for the image transforms, imported on first use, never when a transform module is.

Guarantees:
- Importing `lance_lightning.transforms` (or any of its modules) does not import torchvision:
  `functional`, `v2` and `image_ops` import it the first time a transform needs it (a resize, a
  non-uint8 image's scaling and normalisation, `DeviceAugment`'s pipeline, the torchvision decoder
  backend), and the calls are torchvision's own, so the results are the same as with an import at
  the top.
- Why: importing torchvision imports all of it (its ``models`` and ``ops``, and through them
  ``torch._dynamo`` and SymPy): about 1.1-1.9 s of the fork server's 4.75-5.41 s of CPU to start on a
  loaded 2-core machine (`benchmarks/probes/probe_worker_cpu.py --warm 60`, forced workers).
  The fork server that starts DataLoader workers preloads the transform's module
  (`lance_lightning.load.lean_start.worker_context`) and the training process imports the package,
  so every job with worker processes paid it once more, though a JPEG decode to uint8 or to
  normalised float32 (`DecodeImage`'s usual path, TorchCodec's decoder) never calls torchvision (#51).
"""

from __future__ import annotations

from types import ModuleType


def functional() -> ModuleType:
    """``torchvision.transforms.v2.functional`` (imported on the first call)."""
    from torchvision.transforms.v2 import functional as F

    return F


def image_ops() -> None:
    """Register torchvision's image decoders as ``torch.ops.image`` (imports ``torchvision.io``)."""
    import torchvision.io  # noqa: F401 - its import registers the ops


def v2() -> ModuleType:
    """``torchvision.transforms.v2`` (imported on the first call)."""
    from torchvision.transforms import v2 as transforms

    return transforms
