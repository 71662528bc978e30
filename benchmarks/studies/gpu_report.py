"""The gpu study's result file: the decode table, one table per fit with its two targets, the copy
lines.

Guarantees: every row and sentence comes from the figures it is given; a backend that does not
import reads "— (does not import)"; without copy figures (no CUDA) the copies read as skipped.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness import tables
from benchmarks.harness.study import Params
from benchmarks.studies.gpu_decode import BACKENDS, versions
from benchmarks.studies.gpu_fit import variant_label


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    return "CPU (smoke run, no GPU)"


def report(
    args: Params,
    device: torch.device,
    decode: list[dict[str, Any]],
    fit: dict[str, Any],
    copies: dict[str, float] | None,
    lap: dict[str, float] | None,
    seconds: float,
    fit2: dict[str, Any] | None = None,
) -> str:
    lines = [
        f"Device: {device_name(device)}; {versions()}.",
        "",
        "## Decode (images/s)",
        "",
        *decode_table(decode),
        *fit_section(fit),
    ]
    if fit2 is not None:
        lines += fit_section(fit2)
    if copies is not None and lap is not None:
        lines += [
            "",
            "## Host-to-device copies",
            "",
            f"- `DeviceTransfer` of a pinned {copies['megabytes']} MB batch: {copies['transfer_gbps']:.1f} GB/s; a plain "
            f"pinned `.to(device, non_blocking=True)` of the same bytes: {copies['plain_gbps']:.1f} GB/s; ratio "
            f"{copies['ratio']:.2f} (target ≥ 0.8: {'PASS' if copies['ratio'] >= 0.8 else 'FAIL'}). Best of "
            f"{args.reps}, CUDA events.",
            f"- Overlap (CUDA events): 20 matmuls 4096² alone {lap['compute_ms']:.1f} ms, a {lap['megabytes']} MB "
            f"`DeviceTransfer` copy alone {lap['copy_ms']:.1f} ms, both issued together {lap['both_ms']:.1f} ms: "
            f"{100 * lap['hidden']:.0f}% of the shorter one hidden behind the other (100% = fully overlapped).",
        ]
    else:
        lines += ["", "Copies: skipped (they need CUDA)."]
    lines += [
        "",
        "Notes: decode rows time `DecodeImage(normalize=False)` on batches of 256 JPEGs already in (pinned) "
        "memory, converted as the loader converts them; the device is synchronised after each batch. The fit "
        "rows time the steps after the warm-up on the host, synchronising the device only at the window's edges; "
        "'between steps' is the loop's time from the end of one `training_step` to the start of the next "
        "(fetching the next batch, copying it, decoding it on the device).",
        "",
    ]
    return "\n".join(lines)


def decode_table(decode: list[dict[str, Any]]) -> list[str]:
    """Images/s decoded on the CPU and by each device backend (None: the backend does not import)."""
    heads = "JPEG side | CPU, one thread per core | device, TorchCodec | device, torchvision | device / CPU (best)"
    rows = []
    for r in decode:
        best = max(r[b] for b in BACKENDS if r[b] is not None) / r["cpu"]
        cpu = f"{r['cpu']:,.0f} ({r['cores']} threads)"
        rows.append((f"{r['side']}x{r['side']}", cpu, *(r[b] for b in BACKENDS), f"{best:.2f}x"))
    return tables.table(heads, "> > >,.0f >,.0f >", rows, missing="— (does not import)")


def fit_section(fit: dict[str, Any]) -> list[str]:
    """The table of one fit: the Lance rows against the on-device baseline, each with its two targets."""
    ready = fit["ready"]

    def row(label: str, result: dict[str, float]) -> tuple:
        ratio, wait = result["step_ms"] / ready["step_ms"], result["wait_share"]
        ratio_text = f"{ratio:.3f}x ({'PASS' if ratio <= 1.05 else 'FAIL'})"
        wait_text = f"{100 * wait:.2f}% ({'PASS' if wait < 0.02 else 'FAIL'})"
        return label, f"{result['step_ms']:.1f} ms", ratio_text, wait_text, result["steps"]

    rows = [row("Lance (RowShuffle, decode on the device, `device_ahead=2`)", fit["lance"])]
    if "in_hooks" in fit:
        rows.append(row("Lance, copy and decode in the loop's hooks (`device_ahead=0`)", fit["in_hooks"]))
    rows += [row(variant_label(variant), variant) for variant in fit["variants"]]
    ready_wait = f"{100 * ready['wait_share']:.2f}%"
    rows.append(("batches already on the device", f"{ready['step_ms']:.1f} ms", "1x", ready_wait, ready["steps"]))
    heads = "fed from | step time | / on-device (target ≤ 1.05x) | between steps, waiting for data (target < 2%)"
    return [
        "",
        f"## ResNet-18 fit, bf16 mixed precision, batch {fit['batch']}, {fit['size']}x{fit['size']}",
        "",
        *tables.table(heads + " | steps timed", "< > > > >", rows),
        "",
        f"The train loader alone (read, convert, pin; no GPU work) delivers {fit['read']:,.0f} images/s; the "
        f"on-device fit consumes {1e3 * fit['batch'] / ready['step_ms']:,.0f} images/s.",
    ]
