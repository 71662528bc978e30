"""`LanceDataModule`: Lance sources in, planned, sharded, resumable dataloaders out.

Guarantees:
- Every argument is typed, so LightningCLI reads all of them from YAML and ``--print_config``
  shows them; strategies and transforms are given by ``class_path``.
- ``setup()`` pins each needed source to one dataset version and validates it in the main
  process, before any worker starts; bad input raises `ConfigError` naming parameter, value, fix.
  Each split is planned from its source and one frozen `SplitSettings`, by `plan_split`
  (`lance_lightning.split_plans`).
- Rank and world size come from the trainer (rank 0 of 1 without one), read when a loader is
  built: a loader built before the trainer attached is rebuilt for the trainer's topology
  (`lance_lightning.split_loaders`), and the plan's fit to it is checked at every ``setup``.
  Under a trainer, ``fit`` plans the train split once, after the checkpoint (if any) is restored,
  at the version its cursor was read at: one survey per resume. Every rank yields the same number
  of batches; the train order depends on (version, filter, strategy, seed, epoch).
- The train cursor is saved in the data module's own checkpoint state, its one copy: resume is
  exact even when Lightning skips ``loader.load_state_dict`` (#20550). A checkpoint of another
  plan is refused with the field. Saving, restoring and validating it is `lance_lightning.cursor`'s;
  the device stage is `lance_lightning.device.hooks.DeviceStage`'s: the data module owns one of
  each and its Lightning hooks delegate to them, with explicit arguments.
- While fitting, rank zero holds the versions the train split reads with Lance tags, so a
  ``cleanup_old_versions`` cannot delete what the run's checkpoints need; they are removed when
  the fit ends normally, kept (and taken over on resume) when it is stopped (`lance_lightning.hold`).
- Data loading does not make the step wait: batches are prepared ahead and copied to the device
  without blocking (`lance_lightning.split_loaders`). A model's own ``transfer_batch_to_device`` or
  ``on_after_batch_transfer`` still runs (after ours; its transfer hook turns ahead off).
- A row the transform cannot decode raises naming the dataset row and column (`RaiseOnBadRow`),
  or is replaced deterministically (`ReplaceBadRow`); either way it is counted as ``bad_rows``.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lance_lightning.arguments import check_arguments, check_units, split_settings
from lance_lightning.cursor.restore import FitLoop, plan_at_cursor
from lance_lightning.cursor.tracker import CursorTracker
from lance_lightning.device.hooks import DeviceStage
from lance_lightning.device.transfer import DeviceTransfer, host_columns
from lance_lightning.errors import ConfigError
from lance_lightning.hold import VersionHold, describe_holds
from lance_lightning.hparams import save_arguments
from lance_lightning.lifetime import destroy_gloo_group_at_exit
from lance_lightning.load.handoff import start_server_early
from lance_lightning.load.loader import LanceDataLoader
from lance_lightning.load.race import Race
from lance_lightning.materialize.cache import RemoteCache
from lance_lightning.materialize.view import MaterializedView
from lance_lightning.media.samplers import ClipSampler
from lance_lightning.plan.contract import Plan, SplitSettings
from lance_lightning.plan.mixture import LanceMixture
from lance_lightning.plan.packing import TokenPacking
from lance_lightning.plan.strategies import FilterRead, NoShuffle, ShuffleStrategy
from lance_lightning.preflight import note_checkpoint_error
from lance_lightning.produce.badrows import BadRowPolicy, RaiseOnBadRow
from lance_lightning.produce.identity import check_identity_settings, identity_problem
from lance_lightning.read.reader import TAKE_GROUP_BYTES
from lance_lightning.read.retry import RetryPolicy
from lance_lightning.source import LanceSource
from lance_lightning.split_loaders import SplitLoaders
from lance_lightning.split_plans import SplitPlans
from lance_lightning.vocabulary import STAGE_OF_SPLIT, BatchTransform, Split

_STATE_KEY = "train_cursor"
#: The run name whose Lance tags hold the versions the fit reads (`lance_lightning.hold`).
_HOLD_KEY = "version_hold"

# Our loaders' length is exact by construction (each worker reads a disjoint planned share).
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


class LanceDataModule(pl.LightningDataModule):
    """Train/val/test/predict dataloaders planned from Lance sources.

    Args:
        train, val, test, predict: The source of each split (uri, columns, filter, version,
            storage_options). A split that a stage uses must be configured.
        batch_size: Rows per batch and rank.
        eval_batch_size: Rows per batch for val/test/predict (default: ``batch_size``).
        shuffle: Train shuffle strategy (`NoShuffle`, `ShardShuffle`, `RowShuffle`,
            `BufferShuffle`); ``None`` (the default) is `NoShuffle()`. Val/test/predict are read in storage order.
        filter_read: How filtered splits are read; ``None`` is `FilterRead()` (scan or take, by
            selectivity).
        transform: Callable applied to each converted batch in the reader threads/workers,
            e.g. `lance_lightning.transforms.DecodeImage`; `lance_lightning.transforms.Compose`
            chains several. Columns it does not name pass through untouched.
        device_transform: Callable applied to each batch on the training device (on CUDA
            ``device_ahead`` batches ahead of the step, else in ``on_after_batch_transfer``), e.g.
            `lance_lightning.transforms.DeviceAugment` or ``DecodeImage(device="cuda")`` (GPU JPEG
            decode of a bytes column, which stays on host).
        bad_rows: Policy for rows the transform cannot decode: `RaiseOnBadRow` (``None``, the
            default) or `ReplaceBadRow` (see `lance_lightning.produce.badrows`).
        drop_last: Drop the train tail that does not fill a whole step (eval splits never drop:
            their last step is split across ranks and padded where a rank has no rows).
        num_workers: DataLoader worker processes per rank. 0 (the default) reads on in-process
            threads, the fastest choice unless the transform is heavy Python.
        reader_threads: Threads per process reading, converting and transforming batches; 0 does it
            all on the training loop's thread (no prefetch). Default ``min(4, os.cpu_count())``, split among workers.
        prefetch_groups: Read groups prepared ahead (scans: about 8 MiB and at most 16k rows each;
            takes: 16 batches at first, then doubling up to about ``take_group_bytes``).
        prefetch_batches: Transformed batches prepared ahead, per process. Memory bound per
            process: ``prefetch_groups`` groups of raw rows + ``prefetch_batches`` finished batches
            (+ ``prefetch_factor`` batches per worker process in the DataLoader queue).
        take_group_bytes: A take plan's read groups (RowShuffle, selective filters) grow to about
            this many bytes of rows, sorted before the take. On tables of 10^8 rows and more,
            larger groups read sparse rows faster (more of them share a Lance chunk) and hold more
            memory: at 10^8 int64 rows 1 MiB read 728,857 rows/s with 62 MB of RSS growth, 2 MiB
            1,017,529 rows/s with 100 MB (benchmarks/results/take_groups.md). Default 1 MiB.
            A mixture's reads keep groups of 16 batches.
        prefetch_factor: Batches each worker process prepares ahead (``num_workers > 0``).
        multiprocessing_context: Worker start method; Lance is not fork-safe, so ``"fork"`` with
            workers is refused.
        persistent_workers: Keep worker processes across epochs.
        pin_memory: Pin batches in page-locked memory (off the training thread) so host-to-GPU
            copies are asynchronous; default: when the trainer runs on CUDA.
        copy_stream: On CUDA, copy batches on a side stream that overlaps the previous step.
        device_ahead: On CUDA, batches copied and device-transformed (e.g. GPU-decoded) ahead of
            the step, in a background thread on its own stream; ``0`` does this work in the
            training loop's hooks, between steps. Off when the model overrides
            ``transfer_batch_to_device``.
        fill_nulls: Value per column that replaces nulls; otherwise a null is an error.
        resume_data: Restore the data cursor from checkpoints; ``False`` starts the data epoch
            fresh on purpose (e.g. after changing the shuffle seed).
        retry: How reads ride out transient storage errors (attempts, backoff, deadline); ``None``
            is `RetryPolicy()`.
        materialize: Copy each split's source once to a local view (`MaterializedView`) and
            read the view: for remote sources trained for many epochs.
        remote_cache: How a split read by ``take`` from an object store (a row shuffle, a
            selective filter) is cached: copied once, sequentially, to local disk and read there
            (`RemoteCache`; ``None`` is ``RemoteCache()``: on, under ``~/.cache/lance-lightning``,
            at most 50 GB, least recently used copies evicted). ``RemoteCache(enabled=False)``
            reads from the store. Order, cursor and resume are the same either way.
        packing: `TokenPacking`: every split's documents packed into windows of ``seq_len`` tokens
            across batches; batches, the cursor and ranks then count windows (docs/packing.md).
        clips: `VideoClips` or `AudioClips`: every split's media rows cut into clips decoded from
            their blobs; batches, the cursor and ranks then count clips (docs/video.md).
        hold_versions: While fitting, rank zero holds the dataset versions the train split reads
            with Lance tags so that ``cleanup_old_versions`` cannot delete them (`lance_lightning.hold`):
            ``"fit"`` (the default) removes them when the fit ends normally and keeps them when it is
            stopped (its checkpoints resume); ``"keep"`` keeps them after a normal end too (jobs that
            stop on ``max_time``/``max_steps`` and resume later); ``"off"`` never writes a tag.
            ``lance-lightning holds URI --release`` removes kept tags.
        row_identity: Which splits' batches carry their rows' identity (`lance_lightning.produce.identity`):
            int64 keys ``_rowaddr`` (the row's address in the pinned version), ``_rowid`` (Lance's
            row id: the stable one when the dataset has stable row ids), ``_position`` (the row's
            index in the epoch's order) and ``_epoch``, added before the transform. ``None`` (the
            default): the predict split only (none with packing); ``True``: every split;
            ``False``: none; or a list of splits, e.g. ``["train", "predict"]``.
    """

    def __init__(
        self,
        train: LanceSource | LanceMixture | None = None,
        val: LanceSource | None = None,
        test: LanceSource | None = None,
        predict: LanceSource | None = None,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        shuffle: ShuffleStrategy | None = None,
        filter_read: FilterRead | None = None,
        transform: BatchTransform | None = None,
        device_transform: BatchTransform | None = None,
        bad_rows: BadRowPolicy | None = None,
        drop_last: bool = True,
        num_workers: int = 0,
        reader_threads: int | None = None,
        prefetch_groups: int = 2,
        prefetch_batches: int = 4,
        take_group_bytes: int = TAKE_GROUP_BYTES,
        prefetch_factor: int = 2,
        multiprocessing_context: Literal["forkserver", "spawn", "fork"] = "forkserver",
        persistent_workers: bool = True,
        pin_memory: bool | None = None,
        copy_stream: bool = True,
        device_ahead: int = 2,
        fill_nulls: dict[str, Any] | None = None,
        resume_data: bool = True,
        retry: RetryPolicy | None = None,
        materialize: MaterializedView | None = None,
        remote_cache: RemoteCache | None = None,
        packing: TokenPacking | None = None,
        clips: ClipSampler | None = None,
        hold_versions: Literal["fit", "keep", "off"] = "fit",
        row_identity: bool | list[Split] | None = None,
    ) -> None:
        super().__init__()
        arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        save_arguments(self, arguments)
        self.sources: dict[Split, Any] = {"train": train, "val": val, "test": test, "predict": predict}
        if val is None:  # Lightning skips validation silently only when val_dataloader is not overridden
            # Not a bound method of self: that is a reference cycle, and a module freed only by the cyclic GC
            # shuts its loaders' workers down slowly (10 s). Calling it raises Lightning's error.
            self.val_dataloader = functools.partial(  # type: ignore[method-assign]  # over the method, on purpose
                pl.LightningDataModule.val_dataloader,
                None,  # type: ignore[arg-type]  # the hook uses no self
            )
        if reader_threads is None:
            reader_threads = max(1, min(4, os.cpu_count() or 1) // max(1, num_workers))  # the processes share the cores
        check_arguments(self.sources, {**arguments, "reader_threads": reader_threads})
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.shuffle = shuffle if shuffle is not None else NoShuffle()
        self.filter_read = filter_read if filter_read is not None else FilterRead()
        self.transform = transform
        self.device_transform = device_transform
        self.bad_rows = bad_rows if bad_rows is not None else RaiseOnBadRow()
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.reader_threads = reader_threads
        self.prefetch_groups = prefetch_groups
        self.prefetch_batches = prefetch_batches
        self.take_group_bytes = take_group_bytes
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory
        self.device_transfer = DeviceTransfer(copy_stream, host_columns(device_transform))
        self.device_ahead = device_ahead
        self.fill_nulls = dict(fill_nulls or {})
        #: How each loader's batches reach the device, and the work of the device hooks.
        self.device_stage = DeviceStage(
            self.device_transfer, device_transform, device_ahead, self.bad_rows, transform, self.fill_nulls
        )
        self.resume_data = resume_data
        self.retry = retry if retry is not None else RetryPolicy()
        self.materialize = materialize
        self.remote_cache = remote_cache if remote_cache is not None else RemoteCache()
        self.packing, self.clips = packing, check_units(self.bad_rows, packing, clips)
        #: How each split is planned besides its source: built once, here.
        settings = (self.shuffle, self.filter_read, self.batch_size, self.eval_batch_size, self.drop_last, packing)
        self.split_settings: dict[Split, SplitSettings] = {s: split_settings(s, *settings, clips) for s in self.sources}
        #: The arguments, their defaults resolved, as each split's plan and loader read them.
        settled = {**arguments, "reader_threads": reader_threads, "fill_nulls": self.fill_nulls}
        settled |= {"bad_rows": self.bad_rows, "retry": self.retry, "remote_cache": self.remote_cache}
        #: Each split's plan, and the ``_position`` shifts of a split planned with `plan_instead`.
        self.split_plans = SplitPlans(self.sources, self.split_settings, settled)
        self.train_cursor: CursorTracker | None = None
        self.version_hold = VersionHold(hold_versions)
        #: Output URI -> what `prepare_data` did to it (sources with a ``prepare`` spec; shown by `explain`).
        self.prepared: dict[str, str] = {}
        self.identity_splits = check_identity_settings(row_identity, packing, self.bad_rows, device_transform)
        self.identity_by_default = row_identity is None  # then a split identity cannot describe goes without
        #: Each split's loader, for the trainer and topology it was built for.
        self.loaders = SplitLoaders(self.device_stage, settled)
        #: The loop side of each fit: its trainer, the restore's note, the length re-reads.
        self._fit = FitLoop()

    # -- topology and plans -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    @property
    def global_rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def plans(self) -> dict[Split, Plan]:
        """Each planned split's plan."""
        return self.split_plans.plans

    # -- setup ------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Make each source that has a ``prepare`` spec from its raw files when its dataset does not
        exist or is incomplete (resuming an interrupted prepare); Lightning runs this once per node
        (`lance_lightning.write`). What it did is logged and shown by `explain`."""
        from lance_lightning.write.prepare import prepare_sources

        self.prepared.update(prepare_sources(self.sources.values()))

    def setup(self, stage: str | None = None) -> None:
        """Pin, validate and plan every split the stage uses (all configured ones for ``None``)."""
        stage = getattr(stage, "value", stage)  # Lightning passes a TrainerFn: its value is the name ("fit")
        destroy_gloo_group_at_exit()  # DDP on CPU: no SIGABRT at exit after the run (lance_lightning.lifetime)
        start_server_early(self.num_workers, self.multiprocessing_context, self.transform)  # boots while we plan
        if stage == "fit" and self._fit.starts(self.trainer) and "train" in self.plans:
            # a new trainer's fit reads from an empty cursor (a checkpoint is restored into it)
            self.train_cursor = CursorTracker(self.plans["train"], resume=self.resume_data)
            self.loaders.drop("train")
        for split in self.split_plans.needed(stage):  # raises naming a split the stage needs, not configured
            if split == "train" and stage == "fit" and self.trainer is not None:
                continue  # Lightning restores a checkpoint after setup: planned once, at its version
            self._plan(split)
        self.split_plans.check(self.world_size)

    def _ensure_planned(self, split: Split) -> None:
        """Plan and check ``split`` unless it is planned (a fit plans its train split here, once)."""
        if split in self.plans:
            return
        if self.sources[split] is None:
            self.setup(STAGE_OF_SPLIT[split])  # raises naming the split that is not configured
        self._plan(split)
        self.split_plans.check(self.world_size)

    def _plan(
        self, split: Split, source: LanceSource | None = None, position_shifts: list[tuple[int, int]] | None = None
    ) -> None:
        """Plan ``split`` (`SplitPlans.plan`), dropping its loader; a train split gets a new cursor."""
        self.split_plans.plan(split, source, position_shifts)
        self.loaders.drop(split)
        if split == "train":
            self.train_cursor = CursorTracker(self.plans["train"], resume=self.resume_data)

    def plan_instead(
        self, split: Split, source: LanceSource, position_shifts: list[tuple[int, int]] | None = None
    ) -> None:
        """Plan ``split`` from ``source`` for this run, in place of its configured source (a
        prediction writer's unfinished rows at its pinned version, `lance_lightning.write.predictions`);
        ``position_shifts`` keep the ``_position`` of the wider read (`RowIdentity`)."""
        self._plan(split, source, position_shifts)
        self.split_plans.check(self.world_size)

    def explain(self, split: Split = "train", world_size: int | None = None) -> str:
        """Which plan was chosen for ``split`` and why: rows, selectivity, strategy, batches per rank
        (of ``world_size`` ranks; the trainer's, or 1, when not given)."""
        if split not in self.plans:
            if self.sources.get(split) is None:
                raise ConfigError("split", split, "that split is not configured", f"configure `data.{split}`")
            self._plan(split)
        plan = self.plans[split]
        holds = describe_holds([source.stands_for or source for source in plan.sources], self.version_hold.run)
        uris = [(source.stands_for or source).uri for source in plan.sources]
        prepared = [self.prepared[uri] for uri in uris if uri in self.prepared]
        workers = [Race(self.num_workers, None).describe()] if self.num_workers > 0 else []  # who reads
        return "\n".join(
            [plan.explain(world_size or self.world_size), *([holds] if holds else []), *prepared, *workers]
        )

    # -- dataloaders ------------------------------------------------------------------------
    def train_dataloader(self) -> LanceDataLoader:
        """The train loader; under a Trainer, the plan it reads (and where it resumes) is printed
        when the loader is built, after a checkpoint re-pinned the version it was read at. While
        fitting, rank zero holds the versions it reads with a Lance tag (`lance_lightning.hold`)."""
        built = self.loaders.built("train", self.loaders.key(self.trainer, self.world_size, self.global_rank))
        loader = self._loader("train")
        if self.trainer is not None:
            if not built and self.global_rank == 0 and loader.progress is not None:  # only rank 0 prints
                resume = self._fit.resume_lines(loader.cursor, self.world_size, loader.progress)
                rank_zero_info("\n".join([self.explain("train"), *resume]))
            if self.global_rank == 0 and getattr(self.trainer.state.fn, "value", None) == "fit":
                held = self.plans["train"].sources if self.materialize is None else ()  # a local view is ours
                self.version_hold.acquire(tuple(source.stands_for or source for source in held))
            self._fit.reread_length_next_epoch(self.trainer, self.train_cursor)
        return loader

    def val_dataloader(self) -> LanceDataLoader:
        return self._loader("val")

    def test_dataloader(self) -> LanceDataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> LanceDataLoader:
        return self._loader("predict")

    def _loader(self, split: Split) -> LanceDataLoader:
        """The split's loader for the current trainer and topology (rebuilt when they changed)."""
        self._ensure_planned(split)
        plan = self.plans[split]
        return self.loaders.get(
            split,
            plan,
            self.trainer,
            self.world_size,
            self.global_rank,
            cursor=self.train_cursor,
            row_identity=split in self.identity_splits
            and not (self.identity_by_default and identity_problem(split, plan)),
            position_shifts=self.split_plans.position_shifts.get(split),
        )

    def teardown(self, stage: str) -> None:
        """Release the side copy stream and the reader threads (restarted on the next iteration);
        after a fit that ended normally, the tags holding its versions."""
        self.device_transfer.stop()
        self.loaders.stop()
        if getattr(stage, "value", stage) == "fit":
            self.version_hold.finish_fit()

    def on_exception(self, exception: BaseException) -> None:
        """A fit stopped by an error or SIGTERM (after ``OnExceptionCheckpoint`` wrote its checkpoint):
        release the tags no checkpoint of the run can need (`VersionHold.stopped`), count the batch
        whose step raised as never trained (`LoopCounters.settle`: a checkpoint saved after a
        ``test`` or ``validate`` that follows resumes it); a checkpoint
        Lightning could not migrate is named, with the field, under the traceback."""
        self.version_hold.stopped()
        if self.train_cursor is not None:  # the batch whose step raised was not trained, whatever runs next
            self.train_cursor.loop.settle()
        note_checkpoint_error(exception, self.trainer.ckpt_path if self.trainer is not None else None)

    # -- device hooks (main process, training loop thread): `DeviceStage` does the work ----------
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Non-blocking copies of the batch's tensors (side CUDA stream); str/bytes lists stay on host."""
        model = self.trainer.lightning_module if self.trainer is not None else None
        generic = functools.partial(super().transfer_batch_to_device, device=device, dataloader_idx=dataloader_idx)
        return self.device_stage.to_device(batch, device, dataloader_idx, model, generic)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Runs ``device_transform`` on the device batch, then the model's hook if it has one."""
        model = self.trainer.lightning_module if self.trainer is not None else None
        return self.device_stage.after_transfer(batch, dataloader_idx, model)

    # -- checkpoint state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = self.train_cursor.state() if self.train_cursor is not None else {}
        saved: dict[str, Any] = {_STATE_KEY: state} if state else {}
        if self.version_hold.holding:
            saved[_HOLD_KEY] = self.version_hold.record()
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict):
            raise ConfigError(
                "checkpoint LanceDataModule",
                state_dict,
                "the data module's state in the checkpoint is not a mapping: the checkpoint was edited or damaged",
                "resume from another checkpoint, or start the data epoch fresh with `resume_data=False`",
            )
        if _HOLD_KEY in state_dict:
            self.version_hold.adopt(state_dict[_HOLD_KEY])
        cursor = state_dict.get(_STATE_KEY, {})
        self._fit.restore(self.trainer, cursor)  # the trainer's loops resume where the data stopped
        if not cursor:
            return
        if self.resume_data and isinstance(cursor, dict):  # planned at the version it was read at
            train, planned = self.sources["train"], self.plans.get("train")
            plan_at_cursor(cursor, train, planned, self.materialize, functools.partial(self.plan_instead, "train"))
        self._ensure_planned("train")
        if self.train_cursor is None:  # planning the train split makes its cursor
            raise RuntimeError("the train split was planned without a cursor")
        self.train_cursor.restore(cursor)
