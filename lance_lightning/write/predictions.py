"""`LancePredictionWriter`: a ``predict_step``'s outputs written back as new columns of the dataset
predicted on, exactly once under DDP, resumable after a kill, committed as one version.

Guarantees (docs/writing-predictions.md):
- Each output row goes to the row named by the batch's ``_rowaddr`` (`lance_lightning.vocabulary.
  ROW_ADDRESS`, the pinned version's row address the data module adds to predict batches): no
  order, rank or batch size assumption. Every row of the predict split gets exactly one value;
  the other rows of the dataset (outside the filter, deleted) get nulls.
- Each rank keeps its rows of a fragment until it has read past the fragment (the predict split is
  read in storage order), then stores them as a piece (`lance_lightning.write.predict_store`). The
  fragment's owner rank (its position modulo the world size) writes the fragment's column file(s)
  and record as soon as the pieces of every rank hold all its rows; at the end, after a barrier,
  owners finish what is left and rank zero commits every fragment as **one** version
  (`lance_lightning.write.predict_commit.commit`) and writes the marker.
- A run killed at any moment and rerun with the same command reads only the fragments not yet
  finished, at the first run's read version (held by a Lance tag until the commit), with the
  epoch positions (``_position``) of the uninterrupted run, so per-row randomness draws the same,
  and ends with the same column values as an uninterrupted run; a rerun after the commit (also a
  second ``trainer.predict`` of the same ``Trainer``) predicts nothing and says which version
  holds the columns. A run that read only some fragments (the unfinished ones, or the ones its
  filter matches rows of) gives the data module its own predict split back at teardown (planned
  again at the same version), so the next ``predict`` finds this run. A twin run of the same
  command that committed first is reported as such.
- A rerun checks that the run's pieces still belong: a dataset deleted and written again at the
  same path (its read version's files differ, or the version is gone) starts the run over, said in
  one line; another model (class, hyperparameters, ``predict_step``/``forward`` source, weights)
  than the one that predicted the stored pieces is a `ConfigError` naming what changed, both
  values and the fix (rerun with the first model, or delete the run folder to start over).
- A bad row the bad-row policy replaced (`ReplaceBadRow`) gets nulls, never its replacement's
  outputs; the report counts it in ``bad_rows``, not in ``rows``.
- With ``table``, the outputs go to a separate Lance table instead (keyed by the rows' Lance row
  ids, stable when the dataset has stable row ids), created in one version; the same pieces, kill
  and rerun rules hold, and the predicted dataset is not changed.
- Bad input (an existing column, a column name with a dot, a run folder that cannot be written,
  outputs that change type or size or have no values, a row count that is not the batch's, a
  non-tensor output, a batch without row addresses) is a `ConfigError` before any commit: the
  names and the folder before any batch, outputs at the first batch that shows them. An error
  raised after the run started says that its run folder and hold tag are kept for a rerun, and
  how to release them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from lance_lightning.errors import ConfigError
from lance_lightning.produce.badrows import ReplaceBadRow
from lance_lightning.source import PinnedSource
from lance_lightning.vocabulary import EPOCH_POSITION, IDENTITY_KEYS, ROW_ADDRESS, ROW_ID
from lance_lightning.write import predict_checks as checks
from lance_lightning.write import predict_commit as commits
from lance_lightning.write import predict_run as runs
from lance_lightning.write.predict_outputs import OutputColumns, read_types, types_json
from lance_lightning.write.predict_store import BAD, ROW_IDS, RunFolder, split_addresses


class LancePredictionWriter(BasePredictionWriter):
    """Write each predicted row's outputs as new column(s) of the predict split's dataset.

    Args:
        columns: The new column's name (a ``predict_step`` returning one tensor or list), or the
            names of a dict output's keys (one column each).
        run_name: Tells apart runs writing the same columns of the same dataset and filter (a
            rerun with the same name continues, or finds the commit, of the earlier run).
        run_dir: Where the run keeps its pieces, records and marker; default
            ``<dataset>/_lance_lightning/predict/<run id>``.
        overwrite: Replace the data of output columns the dataset already has (same types; one
            ``DataReplacement`` commit); without it an existing column is a `ConfigError`.
        flush_rows: Rows of one fragment a rank keeps in memory before storing them as a piece.
        table: Write the outputs to a separate Lance table at this URI instead (one row per
            predicted row: ``row_id``, the row's Lance row id, stable when the dataset has stable
            row ids; ``row_address`` in the read version; the output columns), created in one
            version (replaced with ``overwrite``); the predicted dataset is not changed.
    """

    def __init__(
        self,
        columns: str | list[str] = "prediction",
        run_name: str = "",
        run_dir: str | None = None,
        overwrite: bool = False,
        flush_rows: int = 65536,
        table: str | None = None,
    ) -> None:
        super().__init__(write_interval="batch")
        names = [columns] if isinstance(columns, str) else list(columns)
        if not names or not all(isinstance(name, str) and name for name in names) or len(set(names)) < len(names):
            raise ConfigError(
                "columns", columns, "must be a column name or a list of distinct names", "columns: embedding"
            )
        for name in names:
            if "." in name or name in _RESERVED or name.strip() != name:
                raise ConfigError(
                    "LancePredictionWriter.columns",
                    name,
                    f"Lance reads a dot as a nested field path, the names {sorted(_RESERVED)} are Lance's or the "
                    "row identity keys', and a blank around a name is a typo",
                    f"name the column without dots or blanks, e.g. {_plain(name)!r}",
                )
        if not isinstance(flush_rows, int) or flush_rows < 1:
            raise ConfigError("flush_rows", flush_rows, "must be an integer >= 1", "flush_rows: 65536")
        self.names, self.run_name, self.run_dir = names, run_name, run_dir
        self.overwrite, self.flush_rows, self.table = overwrite, flush_rows, table
        #: What the last run did: rows, bytes, the committed version (None until committed).
        self.report: dict[str, Any] = {}
        #: The plan `setup` put in place of the predict split's for this run, and the source it replaced.
        self.planned_instead: tuple[Any, PinnedSource] | None = None

    # -- setup: find the run, skip what is finished ----------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if getattr(stage, "value", stage) != "predict":
            return
        limit = trainer.limit_predict_batches
        if limit is not None and not (isinstance(limit, float) and limit == 1.0):  # an int 1 is one batch
            raise ConfigError(
                "trainer.limit_predict_batches",
                limit,
                "the prediction writer gives every row a value; a limit leaves rows without one, and the run "
                "could not commit",
                "remove limit_predict_batches, or choose the rows with a filter on data.predict",
            )
        self._give_back_plan(trainer)  # an earlier predict that raised did not tear down
        source = runs.predict_source(trainer.datamodule)
        self.rank, self.report, self.skipped_limit = trainer.global_rank, {}, None
        self.run = commits.run_id(
            source.location, source.filter, self.names, self.run_name, self.overwrite, self.table or ""
        )
        self.where = self.run_dir or f"{source.location.rstrip('/')}/_lance_lightning/predict/{self.run}"
        self.folder = RunFolder(self.where, source.storage_options)
        runs.together(trainer, lambda: self._check_folders(source) if trainer.global_rank == 0 else None)
        fresh = self.folder.read_json("run.json") is None and self.folder.read_json("marker.json") is None
        if fresh and self.table:
            commits.check_table(self.table, source.storage_options, self.overwrite)
        elif fresh:
            commits.check_new_columns(source.open().schema, self.names, self.overwrite)
        saved = self.folder.read_json("model.json")
        self._check_model(saved, checks.model_identity(pl_module, weights=False), source)
        runs.together(trainer, lambda: self._prepare(source) if trainer.global_rank == 0 else None)
        self.state = self.folder.written_json("run.json")
        marker = self.folder.read_json("marker.json")
        if marker is not None:
            self._skip(trainer)
            self.report = marker
            where = self.table or source.uri
            rank_zero_info(
                f"prediction writer: nothing to write: column(s) {', '.join(self.names)} of {where} are in version "
                f"{marker['version']} (run {self.run}, committed earlier)"
            )
            return
        self.source = replace(source, version=self.state["version"])
        #: Whether the run replaces existing columns' data (``overwrite`` of columns its read version has).
        self.replacing = self.state["replacing"]
        self.expected = {int(k): v for k, v in self.state["expected"].items()}
        self.order = {fragment: i for i, fragment in enumerate(self.state["order"])}
        self.outputs = OutputColumns(self.names, read_types(self.folder.read_json("columns.json")))
        self.finished = self.folder.recorded() | {f for f, n in self.expected.items() if self.folder.piece_rows(f) == n}
        self.buffers: dict[int, list[tuple[np.ndarray, dict[str, pa.Array]]]] = {}
        self.owned = {f for f, i in self.order.items() if i % trainer.world_size == trainer.global_rank}
        self.done_through = -1  # ordinal of the last fragment this rank has read past
        replacing_rows = isinstance(getattr(trainer.datamodule, "bad_rows", None), ReplaceBadRow)
        #: The slot address of each epoch position, with a policy that replaces bad rows (else None).
        self.slots = runs.Slots(self.source, self.state["order"], self.expected) if replacing_rows else None
        unfinished = [f for f in self.state["order"] if f not in self.finished]
        reading = runs.fragments_to_read(self.state["order"], self.expected, unfinished, trainer.world_size)
        #: Finished fragments read again only so that every rank has a row: their outputs are dropped.
        self.again = set(reading) - set(unfinished)
        if not unfinished:
            self._skip(trainer)
            self._end(trainer)
        elif len(reading) < len(self.order) or self.source.version != source.version:
            shifts = runs.position_shifts(self.state["order"], self.expected, reading)
            restricted = runs.restricted(source, self.source.version, reading)
            trainer.datamodule.plan_instead("predict", restricted, shifts)
            self.planned_instead = (trainer.datamodule.plans["predict"], source)  # given back at teardown

    def _skip(self, trainer: Any) -> None:
        """Read nothing this ``predict`` (the trainer's limit is given back at teardown; the loop's
        batch counts of an earlier ``predict`` of the same trainer are cleared, so it skips)."""
        self.skipped_limit = trainer.limit_predict_batches
        trainer.limit_predict_batches = 0
        trainer.predict_loop.max_batches = []

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if getattr(stage, "value", stage) != "predict":
            return
        if getattr(self, "skipped_limit", None) is not None:
            trainer.limit_predict_batches, self.skipped_limit = self.skipped_limit, None
        self._give_back_plan(trainer)

    def _give_back_plan(self, trainer: Any) -> None:
        """Plan the predict split from its own source again (at its pinned version) where `setup`
        planned it from the run's unfinished fragments: the restricted source has another filter,
        so the next ``predict`` of the same trainer would name another run (whose commit it is not)."""
        if self.planned_instead is None:
            return
        (planned, source), self.planned_instead = self.planned_instead, None
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and datamodule.plans.get("predict") is planned:
            datamodule.plan_instead("predict", runs.unpinned(source))

    def _check_folders(self, source: PinnedSource) -> None:
        """Rank zero, before any batch: the run folder (and the dataset's data folder) can be written;
        a stale run is discarded (`_discard_stale`)."""
        self.folder.check_writable(None if self.table else source.location)
        self._discard_stale(source)

    def _discard_stale(self, source: PinnedSource) -> None:
        """Rank zero: start the run over when the dataset at the path is not the one its pieces (or
        its commit) were computed from (`predict_checks.stale`)."""
        why = checks.stale(self.folder, source, self.run, self.table, self.names)
        if why is None:
            return
        self.folder.drop_all()
        rank_zero_info(
            f"prediction writer: the dataset at {source.uri} is not the one run {self.run} predicted from ({why}; "
            "it was deleted and written again): starting the run over, its stored pieces dropped"
        )

    def _check_model(self, saved: dict[str, str] | None, current: dict[str, str], source: PinnedSource) -> None:
        error = checks.model_refusal(self.folder, self.names, self.run, self.where, self.table, source, saved, current)
        if error is not None:
            raise error

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        """The loaded model (a checkpoint is restored after ``setup``) against the one the run's
        pieces came from: all ranks read the same record, so all refuse together."""
        current = checks.model_identity(pl_module, trainer)
        saved = self.folder.read_json("model.json")
        self._check_model(saved, current, self.source)
        if trainer.global_rank == 0 and saved != current:
            self.folder.write_json("model.json", current)

    def _prepare(self, source: PinnedSource) -> None:
        """Rank zero: write ``run.json`` (fresh run), the marker (a commit without one), drop the
        pieces of fragments a killed run left unfinished, hold the read version."""
        if self.folder.read_json("marker.json") is not None:
            return
        state = self.folder.read_json("run.json")
        if state is None:
            expected = commits.expected_rows(source.open(), source.filter)
            state = {"run": self.run, "uri": source.uri, "version": source.version, "filter": source.filter}
            replacing = not self.table and self.overwrite and set(self.names) <= set(source.open().schema.names)
            state.update(
                replacing=replacing,
                columns=self.names,
                files=commits.fingerprint(source.open()),
                expected={str(k): v for k, v in expected.items()},
                order=list(expected),
            )
            self.folder.write_json("run.json", state)
        pinned = replace(source, version=state["version"])
        version = (
            commits.committed_version(self.table, source.storage_options, 0, self.run)
            if self.table
            else commits.committed_version(source.location, source.storage_options, pinned.version, self.run)
        )
        if version is not None:
            self._mark(pinned, version)
            return
        recorded = self.folder.recorded()
        for fragment, rows in state["expected"].items():
            if int(fragment) not in recorded and self.folder.piece_rows(int(fragment)) != rows:
                self.folder.drop_pieces(int(fragment))
        commits.hold(pinned, self.run)

    # -- batches ----------------------------------------------------------------------------------
    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not isinstance(batch, dict) or ROW_ADDRESS not in batch:
            raise ConfigError(
                "predict batch",
                type(batch).__name__ if not isinstance(batch, dict) else sorted(batch),
                f"has no '{ROW_ADDRESS}' key: the writer cannot tell which rows the outputs belong to",
                "keep row identity on for the predict split (row_identity: null or [predict]) and return a dict "
                f"with '{ROW_ADDRESS}' from any transform",
            )
        try:
            self._write_batch(prediction, batch, batch_idx)
        except ConfigError as error:
            raise self._kept(error) from None

    def _write_batch(self, prediction: Any, batch: dict[str, Any], batch_idx: int) -> None:
        addresses = batch[ROW_ADDRESS].detach().cpu().numpy().astype(np.int64)
        columns = self.outputs.convert(prediction, len(addresses), batch_idx)
        ids = batch[ROW_ID].detach().cpu().numpy() if ROW_ID in batch else addresses
        bad = np.zeros(len(addresses), dtype=bool)
        if self.slots is not None and EPOCH_POSITION in batch:
            # A replaced bad row: its slot's row gets nulls (flagged bad), the replacement's outputs
            # are dropped (the replacement row gets its own from its own slot).
            slots = self.slots.addresses(batch[EPOCH_POSITION].detach().cpu().numpy().astype(np.int64))
            bad = slots != addresses
            if bad.any():
                take = pa.array(np.arange(len(addresses)), mask=bad)
                columns = {name: array.take(take) for name, array in columns.items()}
                addresses, ids = slots, np.where(bad, slots, ids)
        columns[ROW_IDS] = pa.array(ids.astype(np.int64))
        columns[BAD] = pa.array(bad)
        if self.replacing and batch_idx == 0:
            commits.check_replaced_types(self.source.open().schema, self.outputs.types)
        fragments, offsets = split_addresses(addresses)
        for fragment in set(np.unique(fragments).tolist()) - self.again:
            rows = np.flatnonzero(fragments == fragment)
            self.buffers.setdefault(fragment, []).append((offsets[rows], {k: v.take(rows) for k, v in columns.items()}))
        self.done_through = max(self.done_through, min(self.order[f] for f in fragments.tolist()) - 1)
        for fragment in list(self.buffers):
            if self.order[fragment] <= self.done_through or _rows(self.buffers[fragment]) >= self.flush_rows:
                self._flush(fragment)
        self._finish_ready(self.done_through)

    def _kept(self, error: ConfigError) -> ConfigError:
        """``error`` saying what stays of the run: its folder and the hold tag on its read version."""
        tag = commits.hold_tag(self.source, self.run)
        return ConfigError(
            error.param,
            error.value,
            error.problem,
            f"{error.fix}. Nothing was committed; the run folder {self.where} and the hold tag {tag} are kept so "
            f"that a rerun continues; to give the run up instead: delete that folder and run "
            f"`{commits.release_hint(self.source, tag)}`",
        )

    def _flush(self, fragment: int) -> None:
        parts = self.buffers.pop(fragment)
        offsets = np.concatenate([part[0] for part in parts])
        columns = {name: pa.concat_arrays([part[1][name] for part in parts]) for name in [*self.names, ROW_IDS, BAD]}
        if self.folder.read_json("columns.json") is None:
            self.folder.write_json("columns.json", types_json(self.outputs.types))
        self.folder.write_piece(fragment, self.rank, offsets, columns)

    def _finish_ready(self, through: int) -> None:
        """Finish the owned fragments read past by this rank whose pieces hold all their rows."""
        for fragment in sorted(self.owned - self.finished, key=self.order.__getitem__):
            if self.order[fragment] > through:
                break
            if not self.table and self.folder.piece_rows(fragment) == self.expected[fragment]:
                self.folder.finish(self.source, fragment, self._types(), self.replacing)
                self.finished.add(fragment)

    # -- the end: finish every fragment, one commit, the marker -----------------------------------
    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.report.get("version") is None:
            self._end(trainer)

    def _end(self, trainer: Any) -> None:
        for fragment in list(self.buffers):
            self._flush(fragment)
        trainer.strategy.barrier("lance-lightning predict writer: pieces stored")
        runs.together(trainer, self._finish_owned)
        runs.together(trainer, self._commit if trainer.global_rank == 0 else lambda: None)
        self.report = self.folder.read_json("marker.json") or {}

    def _finish_owned(self) -> None:
        for fragment in sorted(self.owned - self.folder.recorded(), key=self.order.__getitem__):
            got = self.folder.piece_rows(fragment)
            if got != self.expected[fragment]:
                raise RuntimeError(
                    f"prediction run {self.run}: fragment {fragment} has {got} of {self.expected[fragment]} rows "
                    f"predicted; rerun the same command to predict the rest (nothing was committed)"
                )
            if not self.table:
                self.folder.finish(self.source, fragment, self._types(), self.replacing)

    def _commit(self) -> None:
        try:
            if self.table:
                fragments, options = list(self.order), self.source.storage_options
                version = commits.write_table(self.folder, fragments, self.table, options, self.run, self.overwrite)
                self._mark(self.source, version)
                return
            version, made = commits.commit(
                self.source, self.folder, list(self.order), self.run, self.names, self.replacing
            )
        except ConfigError as error:
            raise self._kept(error) from None
        self._mark(self.source, version, twin=not made)

    def _mark(self, source: PinnedSource, version: int, twin: bool = False) -> None:
        """Rank zero, after the commit: the marker, the report line, the pieces and the hold released
        (``twin``: a concurrent run of the same command made the commit)."""
        fragments = [int(f) for f in self.folder.written_json("run.json")["order"]]
        latest = lance.dataset(source.location, storage_options=source.storage_options)
        bad = commits.bad_rows(self.folder, fragments)
        if self.table:
            rows, written = commits.table_written(self.table, source.storage_options, version)
            appended = latest.count_rows() - latest.checkout_version(source.version).count_rows()
        else:
            rows, written = commits.written(self.folder, fragments)
            appended = (
                latest.checkout_version(version).count_rows() - latest.checkout_version(source.version).count_rows()
            )
        marker = {"run": self.run, "version": version, "read_version": source.version, "columns": self.names}
        marker.update(rows=rows, bad_rows=bad, bytes=written, appended_rows=max(0, appended))
        self.folder.write_json("marker.json", marker)
        self.folder.drop_pieces()
        commits.release(source, self.run)
        where = f"table {self.table} (rows of {source.uri})" if self.table else source.uri
        late = f"; {appended} rows appended meanwhile have no value (null)" if appended > 0 else ""
        if bad:
            late += f"; {bad} bad rows (replaced by the bad-row policy) have no value (null)"
        if twin:
            rank_zero_info(
                f"prediction writer: column(s) {', '.join(self.names)} of {where} are in version {version}, committed "
                f"by another run of the same command (run {self.run}, read version {source.version}) while this one "
                f"ran: {rows} rows{late}"
            )
            return
        rank_zero_info(
            f"prediction writer: wrote column(s) {', '.join(self.names)} of {where}: {rows} rows, "
            f"{runs.size(written)} of new column files, committed as version {version} (run {self.run}, read version "
            f"{source.version}){late}"
        )

    def _types(self) -> dict[str, pa.DataType]:
        if not self.outputs.types:
            self.outputs.types = read_types(self.folder.read_json("columns.json"))
        return self.outputs.types


#: Column names Lance or row identity use: an output column may not take them.
_RESERVED = frozenset({"_rowid", "_rowaddr", "_rowoffset", "_distance", "_score", *IDENTITY_KEYS})


def _plain(name: str) -> str:
    return name.strip().replace(".", "_").lstrip("_") or "prediction"


def _rows(parts: list[tuple[np.ndarray, dict[str, pa.Array]]]) -> int:
    return sum(len(part[0]) for part in parts)
