"""The ``lance-lightning fit`` config of the race's CLI tests (issue #51:
tests/scenarios/test_race_as_shipped.py, tests/scenarios/test_race_retrials.py), built in one place.

`fit_config` writes the YAML a user would: a row shuffle over ``[id, x, vec]``, persistent workers,
the cursor and loading-monitor callbacks (the end-of-fit report is printed), a periodic
``ModelCheckpoint``, no logger, no sanity validation; each test picks the model that records its
steps, the transform and the sizes.
"""

from __future__ import annotations

from pathlib import Path


def fit_config(
    root: Path,
    uri: str,
    *,
    model: str,
    devices: int,
    epochs: int,
    batch: int,
    workers: int,
    transform: str,
    every: int,
    row_identity: bool | None = None,
) -> Path:
    """``root / "config.yaml"``: ``epochs`` epochs on ``devices`` CPU processes (DDP above one),
    ``model`` (a class path taking ``log``) writing under ``root / "rows"``, a checkpoint every
    ``every`` steps under ``root / "ckpt"``, batches of ``batch`` rows, ``workers`` workers,
    ``transform`` (a YAML flow value: ``null`` or a class_path mapping) and, unless None,
    ``row_identity``."""
    path = root / "config.yaml"
    identity = "" if row_identity is None else f"  row_identity: {str(row_identity).lower()}\n"
    path.write_text(f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: {devices}
  strategy: {"ddp" if devices > 1 else "auto"}
  max_epochs: {epochs}
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  default_root_dir: {root / "root"}
  callbacks:
    - class_path: lance_lightning.DataCursorCheckpoint
    - class_path: lance_lightning.DataLoadingMonitor
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root / "ckpt"}, filename: "{{step}}", every_n_train_steps: {every}, save_top_k: -1}}
model:
  class_path: {model}
  init_args: {{log: {root / "rows"}}}
data:
  train: {{uri: {uri}, columns: [id, x, vec]}}
  batch_size: {batch}
  shuffle: {{class_path: lance_lightning.RowShuffle, init_args: {{seed: 3}}}}
  num_workers: {workers}
  persistent_workers: true
  transform: {transform}
{identity}""")
    return path
