"""Render the scalars of a TensorBoard run to a PNG, laid out like TensorBoard's scalar panels.

Guarantees: every point drawn is a scalar read from the run's event files (TensorBoard's own
``EventAccumulator``), nothing is smoothed or computed; the figure title says it is a rendering of
logged scalars, not a screenshot. Used for ``docs/images/quickstart_scalars.png``.

Usage::

    python docs/render_scalars.py RUN_DIR OUT.png [TAG ...]
    python docs/render_scalars.py docs/images/quickstart_run docs/images/quickstart_scalars.png
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

#: The panels drawn when no tags are given: the model's curves, then the data loader's.
DEFAULT_TAGS = (
    "train/loss",
    "val/acc",
    "data/wait_fraction",
    "data/rows_per_s",
    "data/step_s",
    "data/decode_s",
    "data/io_wait_s",
    "data/prefetch_ready",
)


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Tag -> [(step, value)] for every scalar in the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def render(run_dir: str | Path, out: str | Path, tags: tuple[str, ...] = DEFAULT_TAGS) -> None:
    """Draw one panel per tag (in a grid of 4 columns) and save the PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = read_scalars(run_dir)
    missing = [tag for tag in tags if tag not in scalars]
    if missing:
        raise SystemExit(f"{run_dir} has no scalar(s) {missing}; it has {sorted(scalars)}")
    columns = min(4, len(tags))
    rows = math.ceil(len(tags) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.6 * rows), squeeze=False)
    for axis, tag in zip(axes.flat, tags):
        steps, values = zip(*scalars[tag])
        axis.plot(steps, values, color="#ff7043", marker="o", markersize=2.5, linewidth=1.2)
        axis.set_title(tag, fontsize=10, loc="left")
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(True, color="#e0e0e0", linewidth=0.6)
    for axis in list(axes.flat)[len(tags) :]:
        axis.set_visible(False)
    figure.suptitle(
        f"Scalars logged to TensorBoard by {Path(run_dir).name} (rendered from the event file, not a screenshot)",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__.split("Usage::")[1].strip())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    render(argv[0], argv[1], tuple(argv[2:]) or DEFAULT_TAGS)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
