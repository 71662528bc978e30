"""What a seeded `DeviceAugment` costs per image on the CPU, against the same augment unseeded.

`DeviceAugment(seed=...)` runs each image's transforms on their own (one call per image) under
`lance_lightning.transforms.augment.DrawsFrom`, a torch function mode that hands torch's random
functions the image's own generator. This probe times, in one process and interleaved (the median
of ``--rounds`` rounds), a batch of 3x64x64 float images through a horizontal flip and a random
resized crop to 56x56: batch-wise unseeded, per image unseeded (``per_sample=True``: the same
calls without the mode) and seeded.

Usage::

    python benchmarks/probes/probe_seeded_augment.py [--batch 256] [--rounds 15] [--out FILE]   # writes results/seeded_augment.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROBE_DIR = Path(__file__).resolve().parent
BENCH_DIR = PROBE_DIR.parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(BENCH_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

RESULT = BENCH_DIR / "results" / "seeded_augment.md"


def main() -> None:
    import common
    import torch
    from torchvision.transforms import v2

    from lance_lightning.transforms import DeviceAugment
    from lance_lightning.vocabulary import EPOCH, EPOCH_POSITION

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batch = {
        "image": torch.rand(args.batch, 3, 64, 64),
        EPOCH_POSITION: torch.arange(args.batch, dtype=torch.int64),
        EPOCH: torch.zeros(args.batch, dtype=torch.int64),
    }

    def transforms() -> list[torch.nn.Module]:
        return [v2.RandomHorizontalFlip(), v2.RandomResizedCrop(56, antialias=True)]

    augments = {
        "batch-wise, unseeded": DeviceAugment(transforms()),
        "per image, unseeded": DeviceAugment(transforms(), per_sample=True),
        "per image, seeded": DeviceAugment(transforms(), seed=0),
    }
    load = common.load_average()
    ms = common.interleaved_median_ms({name: (lambda a=a: a(batch)) for name, a in augments.items()}, args.rounds)
    per_image = ms["per image, unseeded"]
    lines = [
        "# A seeded DeviceAugment against the same augment unseeded (CPU, one thread)",
        "",
        f"`{common.command_line()}` on {common.stamp()}; {common.machine()}; load average {load} at the start.",
        "",
        f"A batch of {args.batch} 3x64x64 float images, a horizontal flip and a random resized crop to 56x56; the "
        f"median of {args.rounds} interleaved rounds.",
        "",
        "| augment | ms a batch | us an image | against per image, unseeded |",
        "|---|---:|---:|---:|",
    ]
    for name, value in ms.items():
        lines.append(f"| {name} | {value:.2f} | {1000 * value / args.batch:.1f} | {value / per_image:.2f}x |")
    common.write_result(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
