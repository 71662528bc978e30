"""Getting data in: raw files (image, video and audio class folders, WebDataset shards, Parquet, a
Hugging Face ``save_to_disk`` folder) to a Lance dataset, in parallel, resumable and atomic.

Guarantees: every row gets a stable integer ``id`` (its position in the input, whatever the
workers or interruptions); a prepare killed at any moment never leaves a dataset that looks
complete (a reader refuses one that is not, unless its source sets ``allow_incomplete``), and
its rerun continues from what was committed to the same rows in the same order; every column of
every unit reads back as the input had it (blob columns too); bad input is a `ConfigError` naming
the file or the flag, before anything is written where it can be found by a survey, and an input
entry that is not a regular file (a FIFO, a dangling link) or a file that does not decode whole is
skipped and listed, never opened or kept. `prepare` (``lance-lightning prepare``) is the entry point; the data module
runs it for sources with a ``prepare`` spec in ``prepare_data`` (docs/getting-data-in.md).

Prepare reads the input formats (`folders`, `shards`, `tables`), cuts them into work units
(`units`), writes and commits them (`writer`, on the `pools`; what an output holds: `ledger`) and
reports (`report`); the data module and the command line call it. The prediction writer's modules
(`predictions`, ``predict_*``) share this stage and document themselves.
"""

from __future__ import annotations

from lance_lightning.write.prepare import FORMATS, prepare, prepare_sources
from lance_lightning.write.report import PrepareReport

__all__ = ["FORMATS", "PrepareReport", "prepare", "prepare_sources"]
