"""One scenario of composed user steps, as plain JSON, and the seeded generator that draws them.

Guarantees:
- A `Scenario` round-trips through one JSON line (`Scenario.to_json` / `Scenario.from_json`):
  a failure is printed as that line and replayed from it.
- `generate(seed)` is deterministic: the same seed draws the same scenario on any machine.
- Every option a user can combine in one script is drawn here: table shape (rows, fragments,
  deleted rows), filter (none, half, selective, less than one batch per rank, matching nothing),
  strategy (all four, clumps, shards with and without a row shuffle inside), token packing, a
  mixture (2-3 sources, filters, both epoch rules, ``samples`` below and above ``block``), a
  schedule of a ``samples`` mixture's weights (2-3 stages, constant or linear, boundaries by
  sample or by step, zero weights; drawn from its own random stream), world size 1/2, workers
  0/2, reader threads, batch size, ``drop_last``, calls before fit, Lightning loop options, the
  stop, the checkpoint resumed from, changes on resume, a maintenance job (compaction and cleanup
  of old versions) between the runs, ``hold_versions``, steps after fit, tables on S3 with each
  run's remote cache (on, off, changed on resume, a limit the split exceeds; `tests.contract.store`)
  the compute-floor replay probe (`tests.contract.replay`) and "prepare, then fit" (table 0 given
  as a Parquet folder that the first fit's ``prepare_data`` prepares, after a SIGKILLed prepare;
  `_prepare`, `tests.contract.prepared`), each from its own random stream; with workers, whether
  they start while this process reads, who reads (forced or raced: ``worker_choice``) and, raced
  (without packing or clips), a transform whose workers lose every trial, so the race tries them
  again after 1, 2, 4, ... epochs (``lose``, ``f"{seed}-lose"``), and whether their fork server
  is the stock one instead of a fork of the trainer (``stock_server``, ``f"{seed}-server"``);
  forced to the workers (without wide batches, packing or clips), half the time a transform that
  records which process made each batch, so that who read is checked (``record_pids``,
  ``f"{seed}-pids"``: `tests.contract.readers`).
- Video clips (`Clips`, ``f"{seed}-clips"``: about 17% of scenarios, never with packing): small
  blob video tables (6-16 videos of 40-64 frames at 16x16, fragments, deleted rows), filters on
  ``id``/``label`` (one matching nothing: a clear error), a mixture of 2-3 sources over them
  where the main draw mixes (blocks of 4-10 clips), and ``VideoClips`` of 2-6 frames every 1-3
  frames, 1-3 clips per video, random or even starts; every other option composes with them as
  drawn, but S3 and "prepare, then fit" (video tables are written locally).
- Lightning's loop, as a user combines it (`_widen`, its own stream ``f"{seed}-loop"``):
  ``limit_train_batches`` as a count or a fraction; ``val_check_interval`` as a count or a
  fraction; ``check_val_every_n_epoch`` (2, or None with a count interval);
  ``num_sanity_val_steps``; ``accumulate_grad_batches``; ``reload_dataloaders_every_n_epochs``;
  the stopped run bound by ``max_steps`` (optimizer steps: batches = steps x accumulate),
  ``max_epochs``, ``max_time``, an exception, SIGKILL or SIGTERM; the resumed run by its own
  ``max_epochs`` (binding at the stopped epoch or the next), ``max_steps`` and ``max_time``; the
  kind of checkpoint resumed from (periodic, ``last.ckpt``, epoch end, on exception or SIGTERM,
  ``trainer.save_checkpoint`` after fit) with the callback that writes it; and a second ``fit`` of
  the same data module and model in the same process with a new ``Trainer``, after
  validate/test/predict on the first (`Resume.session`). Damage to the stopped run's cached copy
  before the resume comes from ``f"{seed}-damage"`` (`_damage`).
- Issue #50's parts (`tests.contract.parts`, each about 15% of scenarios, from its own stream):
  a ``prepare`` of raw files (`tests.contract.prepare_draws`), a ``Trainer.predict`` with the
  prediction writer (`tests.contract.writer_draws`) and clips over the media corpus
  (`tests.contract.media_draws`), checked beside the fit; ``fit=False`` runs only them.
- Options added later are absent from a scenario's JSON while at their default, so every line
  written before them (``cases.jsonl``) reads and writes the same.
A new option of the package or of Lightning's loop joins `generate` (and `truth`/`phase`/
`expected` where it needs to), from a random stream of its own.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal, get_args, get_origin, get_type_hints

from tests.contract import truth
from tests.contract.media_draws import Media
from tests.contract.parts import draw_parts
from tests.contract.prepare_draws import Ingest
from tests.contract.replay import Replay, draw_replay
from tests.contract.store import Cache, Store, with_store
from tests.contract.writer_draws import Writing

#: Calls a user script makes on the data module before ``trainer.fit`` (in order).
CALLS_BEFORE_FIT = ("explain", "setup", "train_dataloader", "state_dict", "peek", "dataset")
#: Trainer calls after fit, on the same data module.
CALLS_AFTER_FIT = ("validate", "predict")
#: How the stopped run ends: at a step budget, at the end of an epoch, by an exception, killed, by a time budget
#: (the old draw's choices: `_stop` draws among these, with its weights).
STOPS = ("max_steps", "epoch_end", "exception", "sigkill", "max_time")
#: Every stop, with those drawn from the loop's own stream (`_widen`): SIGTERM to the process.
ALL_STOPS = (*STOPS, "sigterm")
#: Trainer calls between the two fits of one process (`Resume.session`), on the first trainer.
CALLS_BETWEEN_FITS = ("validate", "test", "predict")
#: Which checkpoint the resume uses: ``pick`` (a fraction of all written: `Checkpoints.pick`) or a
#: kind: ``every_n_train_steps`` (periodic), ``last.ckpt`` (save_last), the default callback's
#: (epoch end / validation end), ``OnExceptionCheckpoint``'s (an exception or SIGTERM) and
#: ``trainer.save_checkpoint`` after fit (saved).
CHECKPOINT_KINDS = ("pick", "periodic", "last", "epoch", "exception", "saved")
#: Damage done to the remote cache's copy between the stopped and the resumed run (`tests.contract.store.damage`).
DAMAGES = ("truncate", "flip", "replace", "delete")


@dataclass(frozen=True)
class Table:
    """One Lance dataset: ``rows`` rows (documents, with ``tokens``) from id ``start``."""

    rows: int
    start: int = 0
    fragment_rows: int | None = None
    #: Rows with ``id % delete_mod == 1`` are deleted after the write (0: none).
    delete_mod: int = 0
    #: Token documents (``id, tokens, n_tokens, topic``) instead of ``id, label, x`` rows.
    tokens: bool = False
    #: Most tokens in a document (each has at least one).
    max_tokens: int = 12
    #: A blob video table (``id, video, label``: `tests.videos.write_videos`, 16x16 frames,
    #: ``start`` 0) instead of ``id, label, x`` rows; absent from the JSON when False.
    video: bool = False


@dataclass(frozen=True)
class Source:
    """A source read from one of the scenario's tables, with an optional filter (SQL)."""

    table: int
    filter: str | None = None


@dataclass(frozen=True)
class Mixture:
    sources: list[Source]
    weights: list[float]
    epoch: Literal["first_exhausted", "samples"] = "first_exhausted"
    samples: int | None = None
    block: int = 100
    #: Stages ``{until_sample|until_step: N, weights: [...]}`` (``weights`` above is then unused).
    schedule: list[dict[str, Any]] | None = None
    interpolate: Literal["constant", "linear"] = "constant"
    step_samples: int | None = None


@dataclass(frozen=True)
class Shuffle:
    kind: Literal["none", "shard", "row", "buffer"] = "none"
    seed: int = 0
    shard_rows: int | None = None
    within: bool = False
    clump_rows: int = 1
    buffer_rows: int = 64


@dataclass(frozen=True)
class Packing:
    seq_len: int = 8
    eos: bool = False
    labels: str | None = "document"
    lengths_column: bool = False


@dataclass(frozen=True)
class Clips:
    """``clips=VideoClips(frames, frame_step, clips_per_item=per_item, starts, size=[16, 16], seed)``:
    every table is a video table, and each matching row stands for ``per_item`` clips per epoch
    (the unit the strategy orders, the layout lays out and the cursor counts)."""

    frames: int = 4
    frame_step: int = 1
    per_item: int = 1
    starts: Literal["random", "even"] = "random"
    seed: int = 0


@dataclass(frozen=True)
class Topology:
    """What may change between the stopped run and the resumed one."""

    world_size: int = 1
    batch_size: int = 8
    num_workers: int = 0
    reader_threads: int = 2
    take_group_bytes: int = 1 << 20


@dataclass(frozen=True)
class Loop:
    """Lightning loop options, the same in every run of the scenario (``epochs``: the stopped
    run's ``max_epochs``, and the resumed run's unless `Resume.max_epochs` says otherwise)."""

    epochs: int = 3
    accumulate: int = 1
    val_check_interval: float | int | None = None
    #: An int: batches per epoch; a float: that fraction of each epoch's batches (``int(n * f)``).
    limit_train_batches: int | float | None = None
    reload_every: int = 0
    #: ``check_val_every_n_epoch`` (None: ``val_check_interval`` counts batches across epochs).
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int = 2
    #: A val split even without ``val_check_interval`` (validation at each epoch's end).
    validate: bool = False


@dataclass(frozen=True)
class Stop:
    """How the first run stops: ``at`` is optimizer steps (max_steps), epochs (epoch_end), the
    batch before which it raises or is killed (exception, sigkill), or seconds (max_time)."""

    kind: str = "max_steps"
    at: float = 3


@dataclass(frozen=True)
class Checkpoints:
    #: ``ModelCheckpoint(every_n_train_steps=every)``.
    every: int = 2
    save_last: bool = False
    #: A second ``ModelCheckpoint()`` with Lightning's defaults (saves at each validation / epoch end).
    default_callback: bool = False
    #: ``OnExceptionCheckpoint``: a checkpoint when the run raises.
    on_exception: bool = False
    #: Which checkpoint the resume uses: 1.0 the last written, less an earlier one (this fraction of the list).
    pick: float = 1.0
    #: Which kind of checkpoint the resume uses (`CHECKPOINT_KINDS`; ``pick`` above chooses among
    #: those of that kind; a kind the run did not write falls back to all of them).
    resume_from: str = "pick"
    #: ``trainer.save_checkpoint(".../saved.ckpt")`` after the stopped fit returns.
    save_after_fit: bool = False


@dataclass(frozen=True)
class Resume:
    topology: Topology
    #: ``None``: no step budget; ``"loose"``: one that never binds; an int: optimizer steps to stop at.
    max_steps: int | str | None = None
    calls: list[str] = field(default_factory=list)
    after_fit: list[str] = field(default_factory=list)
    #: Between the stopped run and the resume, a maintenance job compacts every table, commits a
    #: new version and deletes every old version Lance lets it (`truth.maintain`).
    maintenance: bool = False
    #: The resumed run's ``max_epochs`` (None: `Loop.epochs`).
    max_epochs: int | None = None
    #: The resumed run's ``max_time`` in seconds, each of its steps sleeping ``step_sleep``.
    max_time: float | None = None
    step_sleep: float = 0.0
    #: The resumed fit runs in the stopped run's process, with the same data module and model and a
    #: new ``Trainer`` (a user script calling ``fit`` twice), after the ``between`` calls on the first.
    session: bool = False
    between: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Prepared:
    """Table 0 is not written directly: its rows are a Parquet folder (one file per fragment the
    direct write would have), and every source of it carries ``prepare`` (format ``parquet``,
    ``unit_files=1``: one unit, one fragment per file), which the first fit's ``prepare_data``
    runs (`tests.contract.prepared`)."""

    workers: int = 1
    #: Before the first fit, a prepare SIGKILLed at this moment (`tests.contract.prepared.MOMENTS`):
    #: ``commit:N`` after its N-th unit commit, ``write:N`` after writing unit N's files, ``rename``
    #: after the completion commit; the first fit's ``prepare_data`` resumes it. None: no kill.
    kill: str | None = None


@dataclass(frozen=True)
class Scenario:
    id: int
    tables: list[Table]
    shuffle: Shuffle
    topology: Topology
    loop: Loop
    stop: Stop
    checkpoints: Checkpoints
    resume: Resume
    source: Source | None = None
    mixture: Mixture | None = None
    packing: Packing | None = None
    drop_last: bool = True
    #: `DataCursorCheckpoint` among the callbacks (resume must be exact without it too).
    cursor_callback: bool = True
    #: Run the stopped and the resumed fit as ``lance-lightning fit --config <yaml>`` (no calls
    #: before or after fit: a command line makes none).
    cli: bool = False
    calls: list[str] = field(default_factory=list)
    #: Seconds each training step sleeps (gives ``max_time`` a run to cut).
    step_sleep: float = 0.0
    #: The data module's ``hold_versions`` (the reference run never holds).
    hold: Literal["fit", "keep", "off"] = "fit"
    #: Tables on S3 and each run's remote cache (None: local tables; absent from the JSON).
    store: Store | None = None
    #: ``DataLoadingMonitor(replay_batches=..., replay_steps=...)`` among the callbacks (None: absent from the JSON).
    replay: Replay | None = None
    #: "Prepare, then fit": table 0 made from raw Parquet by the fit's ``prepare_data`` (None: written
    #: directly; absent from the JSON).
    prepare: Prepared | None = None
    #: Video clips as the unit (`Clips`; None: rows or windows; absent from the JSON).
    clips: Clips | None = None
    #: A transform that makes every batch pass 1 MiB (`tests.worker_probe.WidenRows`), so batches
    #: leave worker processes through shared-memory slabs (None: no transform; absent from the JSON).
    wide: bool | None = None
    #: With ``wide``: each batch about this many bytes instead of over 1 MiB (96 KiB: a worker's run
    #: of batches shares one slab; None: over 1 MiB; absent from the JSON).
    wide_bytes: int | None = None
    #: False: every loader waits for its workers (``LANCE_LIGHTNING_WORKER_HANDOFF=off``) instead of
    #: reading the first batches while they start (None: the default; absent from the JSON).
    handoff: bool | None = None
    #: Issue #50's parts (`tests.contract.parts`), each checked against its own oracle beside the
    #: fit: a ``prepare`` of raw files (`tests.contract.prepare_draws.Ingest`), a ``Trainer.predict``
    #: with the prediction writer (`tests.contract.writer_draws.Writing`) and clips over the media
    #: corpus (`tests.contract.media_draws.Media`); None: not drawn (absent from the JSON).
    ingest: Ingest | None = None
    writing: Writing | None = None
    media: Media | None = None
    #: False: only the parts above run (a replayed case of one of them; the fit is not run).
    fit: bool | None = None
    #: Who reads when workers are configured (``LANCE_LIGHTNING_WORKER_CHOICE``, issue #51):
    #: ``"in_process"`` (the workers' trial loses: this process reads on from their first batch not
    #: delivered), ``"race"`` (measured; either outcome); None: the suite's default, the workers
    #: (tests/conftest.py); absent from the JSON.
    worker_choice: str | None = None
    #: With ``worker_choice="race"``: a transform the workers lose every trial with
    #: (`tests.worker_probe.SlowInWorkers`), so the race tries them again after 1, 2, 4, ... epochs
    #: read in process (`lance_lightning.load.race.Race.retrial_due`); None: no transform; absent
    #: from the JSON.
    lose: bool | None = None
    #: True: workers start from the stock fork server, a fresh interpreter
    #: (``LANCE_LIGHTNING_FORKED_SERVER=off``) instead of a fork of the training process
    #: (`lance_lightning.load.forked_server`); None: the default; absent from the JSON.
    stock_server: bool | None = None
    #: True: a transform adds the process that made each batch (`tests.worker_probe.RecordProcess`),
    #: and the oracle checks who read it (`tests.contract.readers`); None: no such transform;
    #: absent from the JSON.
    record_pids: bool | None = None

    @property
    def sources(self) -> list[Source]:
        return self.mixture.sources if self.mixture is not None else [self.source]

    @property
    def uses_ddp(self) -> bool:
        return self.topology.world_size > 1 or self.resume.topology.world_size > 1

    @property
    def resume_epochs(self) -> int:
        """The resumed run's ``max_epochs``."""
        return self.resume.max_epochs if self.resume.max_epochs is not None else self.loop.epochs

    @property
    def data_epochs(self) -> int:
        """How many data epochs any run of the scenario may read (the reference run reads one more)."""
        return max(self.loop.epochs, self.resume_epochs)

    def to_json(self) -> str:
        plain = asdict(self)
        mixture = plain.get("mixture")
        if mixture is not None and mixture["schedule"] is None:  # as scenarios were written before schedules
            for key in _SCHEDULE_FIELDS:
                del mixture[key]
        for key in _LATER_FIELDS:  # as scenarios were written before these options
            if plain[key] is None:
                del plain[key]
        for table in plain["tables"]:  # as tables were written before video tables
            if not table["video"]:
                del table["video"]
        for key, names in _DEFAULTED_FIELDS.items():  # options added later, absent at their default
            part = getattr(self, key)
            for name in names if part is not None else ():
                if plain[key][name] == _default(type(part), name):
                    del plain[key][name]
        return json.dumps(plain, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> Scenario:
        return _build(cls, json.loads(text) if isinstance(text, str) else text)


#: Fields of `Mixture` left out of the JSON of a mixture without a schedule.
_SCHEDULE_FIELDS = ("schedule", "interpolate", "step_samples")
#: ``wide_bytes`` when drawn: batches between `VIEW_BYTES` (64 KiB) and 1 MiB.
SMALL_WIDE_BYTES = 96 * 1024
#: Fields of `Scenario` left out of the JSON when None.
_LATER_FIELDS = (
    "store", "replay", "prepare", "clips", "wide", "handoff", "wide_bytes", "ingest", "writing", "media", "fit",
    "worker_choice", "lose", "stock_server", "record_pids",
)  # fmt: skip
#: Fields added to a part of `Scenario` later, left out of the JSON while at their default (so
#: that every scenario written before them reads and writes the same line).
_DEFAULTED_FIELDS = {
    "loop": ("check_val_every_n_epoch", "num_sanity_val_steps", "validate"),
    "checkpoints": ("resume_from", "save_after_fit"),
    "resume": ("max_epochs", "max_time", "step_sleep", "session", "between"),
    "store": ("damage",),
    "ingest": ("location",),
    "media": ("policy", "range_start", "range_end", "every", "aliases"),
}


def _default(kind: Any, name: str) -> Any:
    (found,) = [f for f in fields(kind) if f.name == name]
    return found.default_factory() if callable(found.default_factory) else found.default


def _build(kind: Any, value: Any) -> Any:
    """``value`` (plain JSON) as an instance of the annotated type ``kind``."""
    if value is None:
        return None
    if is_dataclass(kind):
        hints = get_type_hints(kind)
        return kind(**{f.name: _build(hints[f.name], value[f.name]) for f in fields(kind) if f.name in value})
    origin = get_origin(kind)
    if origin is list:
        (item,) = get_args(kind)
        return [_build(item, v) for v in value]
    for arg in get_args(kind):  # Optional[X] / X | None: the dataclass member, if any
        if is_dataclass(arg):
            return _build(arg, value)
    return value


# -- the generator --------------------------------------------------------------------------------
ROW_FILTERS = ("label < 5", "label = 3", "label != 3", "id % 31 = 7", "id % 4 != 2")
TOKEN_FILTERS = ("topic < 2", "id % 5 != 0", "topic != 1")


def generate(seed: int) -> Scenario:
    """A scenario drawn from ``seed``: mostly ones that train, some that must fail with a clear error."""
    rng = random.Random(seed)
    packing = _packing(rng) if rng.random() < 0.2 else None
    tables, source, mixture = _data(rng, packing is not None)
    clips = None
    clipped = random.Random(f"{seed}-clips")  # its own stream: a scenario without clips stays as it was
    if packing is None and clipped.random() < CLIPS_SHARE:
        clips = _clips(clipped)
        tables, source, mixture = _video_data(clipped, mixture is not None, clips)
    topology = _topology(rng, 1)
    shuffle = _shuffle(rng)
    drop_last = rng.random() < 0.7
    scenario = Scenario(
        id=seed,
        tables=tables,
        source=source,
        mixture=mixture,
        packing=packing,
        clips=clips,
        shuffle=shuffle,
        drop_last=drop_last,
        cursor_callback=rng.random() < 0.8,
        topology=topology,
        loop=Loop(),
        stop=Stop(),
        checkpoints=Checkpoints(),
        resume=Resume(topology=topology),
        calls=_calls(rng),
    )
    if rng.random() < 0.15:
        scenario = replace(scenario, cli=True, calls=[])
    units = truth.epoch_units(scenario)  # per epoch, before the layout (0: a clear error is expected)
    batch_size = _batch_size(rng, units, topology.world_size)
    topology = replace(topology, batch_size=batch_size)
    steps = max(1, units // (topology.world_size * batch_size))
    loop = _loop(rng, steps)
    stop, step_sleep, stop_epoch = _stop(rng, steps, loop)
    resume = _resume(rng, topology, units, loop, scenario.cli)
    later = random.Random(f"{seed}-later")  # options added later: the draws above stay as they were
    if scenario.mixture is not None and scenario.mixture.epoch == "samples":
        scheduled = random.Random(f"{seed}-schedule")
        if scheduled.random() < 0.6:
            epochs = stop_epoch + 3
            mixture = _schedule(scheduled, scenario.mixture, epochs, topology.world_size * batch_size)
            scenario = replace(scenario, mixture=mixture)
    scenario = replace(
        scenario,
        topology=topology,
        loop=replace(loop, epochs=stop_epoch + 3),  # the resumed epoch and two more
        stop=stop,
        step_sleep=step_sleep,
        checkpoints=_checkpoints(rng, stop),
        resume=replace(resume, maintenance=later.random() < 0.25),
        hold=later.choices(["fit", "keep", "off"], weights=[8, 1, 1])[0],
    )
    scenario = _widen(random.Random(f"{seed}-loop"), scenario, units, stop_epoch)
    if clips is None:  # video tables are local (`tests.videos.write_videos` writes no object store)
        scenario = with_store(seed, scenario)
    scenario = replace(scenario, replay=draw_replay(seed))
    if scenario.store is not None and scenario.resume.session:  # one data module: one cache
        scenario = replace(scenario, store=replace(scenario.store, resume_cache=scenario.store.cache))
    scenario = _damage(random.Random(f"{seed}-damage"), scenario)
    workers = scenario.topology.num_workers or scenario.resume.topology.num_workers
    if workers and packing is None and clips is None and random.Random(f"{seed}-wide").random() < 0.5:
        scenario = replace(scenario, wide=True)
        if random.Random(f"{seed}-wide-bytes").random() < 0.5:
            scenario = replace(scenario, wide_bytes=SMALL_WIDE_BYTES)
    if workers and random.Random(f"{seed}-handoff").random() < 0.3:
        scenario = replace(scenario, handoff=False)
    elif workers and not scenario.wide and (draw := random.Random(f"{seed}-choice").random()) < 0.4:
        scenario = replace(scenario, worker_choice="in_process" if draw < 0.25 else "race")
    if scenario.worker_choice == "race" and packing is None and clips is None:  # its own stream: added later
        scenario = _lose(random.Random(f"{seed}-lose"), scenario)
    if workers and random.Random(f"{seed}-server").random() < 0.3:
        scenario = replace(scenario, stock_server=True)
    forced = scenario.worker_choice is None and not scenario.wide and not scenario.lose
    if forced and packing is None and clips is None and random.Random(f"{seed}-pids").random() < 0.5:
        scenario = replace(scenario, record_pids=True)
    return draw_parts(seed, _prepare(random.Random(f"{seed}-prepare"), scenario))


def _lose(rng: random.Random, scenario: Scenario) -> Scenario:
    """Raced workers that lose every trial (``lose``), 6 in 10 times; a resumed run that would stop
    at `Loop.epochs` then runs 3 epochs more, so that a trial lost in its first epochs is followed
    by a whole epoch read in process and a second trial (`lance_lightning.load.race.Race.retrial_due`)."""
    if rng.random() >= 0.6:
        return scenario
    resume = scenario.resume
    if resume.max_epochs is None and resume.max_steps is None and resume.max_time is None:
        resume = replace(resume, max_epochs=scenario.loop.epochs + 3)
    return replace(scenario, lose=True, resume=resume)


def _table(rng: random.Random, index: int, tokens: bool) -> Table:
    return Table(
        rows=rng.randint(30, 150) if tokens else rng.choice([rng.randint(20, 60), rng.randint(60, 400)]),
        start=index * 100_000,
        fragment_rows=rng.choice([None, None, 17, 50, 128]),
        delete_mod=rng.choice([0, 0, 0, 7, 13]),
        tokens=tokens,
        max_tokens=rng.choice([3, 12, 30]),
    )


def _filter(rng: random.Random, table: Table) -> str | None:
    if rng.random() < 0.45:
        return None
    roll = rng.random()
    if roll < 0.03:  # matches nothing: a clear error
        return "id < 0"
    if roll < 0.10 and not table.tokens:  # a handful of rows: less than one batch per rank
        return f"id < {table.start + rng.randint(2, 9)}"
    choices = TOKEN_FILTERS if table.tokens else ROW_FILTERS
    if table.rows < 150:  # a 3% filter of a small table leaves a row or two
        choices = tuple(c for c in choices if "31" not in c)
    return rng.choice(choices)


def _data(rng: random.Random, tokens: bool) -> tuple[list[Table], Source | None, Mixture | None]:
    if rng.random() >= 0.3:
        table = _table(rng, 0, tokens)
        return [table], Source(0, _filter(rng, table)), None
    count = rng.choice([2, 2, 3])
    tables = [_table(rng, j, tokens) for j in range(rng.randint(1, count))]
    sources = []
    for _ in range(count):
        index = rng.randrange(len(tables))
        sources.append(Source(index, _filter(rng, tables[index])))
    weights = [rng.choice([1.0, 1.0, 2.0, 3.0, 0.5]) for _ in sources]
    block = rng.choice([10, 25, 100, 1000])
    if rng.random() < 0.05:  # as few slots as sources: unequal weights leave a source none (a clear error)
        block = count
    rule = rng.choice(["first_exhausted", "samples"])
    samples = None
    if rule == "samples":
        samples = rng.choice([max(1, block // 3), block + rng.randint(1, block), rng.randint(40, 300)])
    mixture = Mixture(sources, weights, rule, samples, block)
    if rule == "first_exhausted" and rng.random() < 0.85:  # mostly blocks that the sources fill
        while block > 10 and _whole_blocks(tables, mixture) == 0:
            block = {1000: 100, 100: 25}.get(block, 10)
            mixture = replace(mixture, block=block)
    return tables, None, mixture


def _schedule(rng: random.Random, mixture: Mixture, epochs: int, step_samples: int) -> Mixture:
    """``mixture`` with 2-3 stages over the samples of its ``epochs`` epochs (a boundary may fall
    mid-epoch, on an epoch's start or past the run), weights >= 0 with one positive per stage."""
    count, total = len(mixture.sources), epochs * int(mixture.samples)
    stages = rng.choice([2, 2, 3])
    ends = sorted(rng.sample(range(1, total + total // 2 + 2), stages - 1))
    by_step = rng.random() < 0.4
    if by_step:  # boundaries by step: whole steps of the planned step size
        ends = sorted({max(1, e // step_samples) for e in ends})
    schedule: list[dict[str, Any]] = []
    for end in [*ends, None]:
        weights = [rng.choice([0.0, 0.0, 0.5, 1.0, 2.0, 3.0]) for _ in range(count)]
        if not any(weights):
            weights[rng.randrange(count)] = 1.0
        stage: dict[str, Any] = {"weights": weights}
        if end is not None:
            stage["until_step" if by_step else "until_sample"] = end
        schedule.append(stage)
    interpolate = rng.choice(["constant", "linear"])
    return replace(mixture, schedule=schedule, interpolate=interpolate, step_samples=step_samples if by_step else None)


def _whole_blocks(tables: list[Table], mixture: Mixture, clips: Clips | None = None) -> int:
    probe = Scenario(
        0,
        tables,
        Shuffle(),
        Topology(),
        Loop(),
        Stop(),
        Checkpoints(),
        Resume(Topology()),
        mixture=mixture,
        clips=clips,
    )
    return truth.epoch_units(probe)


# -- clips (their own random stream, ``f"{seed}-clips"``) -----------------------------------------------
#: Share of the scenarios without packing that train on video clips (about 17% of all).
CLIPS_SHARE = 0.21
#: Filters of a video table (``label`` is ``id % 3``).
VIDEO_FILTERS = ("label != 1", "label = 0", "id % 4 != 2", "id % 3 != 2")


def _clips(rng: random.Random) -> Clips:
    """A small clip sampler: 2-6 frames every 1-3 frames (at most 16 of a video's 40 or more),
    1-3 clips per video, random (mostly) or even starts."""
    return Clips(
        frames=rng.randint(2, 6),
        frame_step=rng.randint(1, 3),
        per_item=rng.randint(1, 3),
        starts=rng.choice(["random", "random", "even"]),
        seed=rng.randint(0, 1000),
    )


def _video_table(rng: random.Random) -> Table:
    """6-16 videos (decoding costs: every table stays small), in one or several fragments, some deleted."""
    return Table(
        rows=rng.randint(6, 16),
        fragment_rows=rng.choice([None, None, 4, 5, 7]),
        delete_mod=rng.choice([0, 0, 0, 5, 7]),
        video=True,
    )


def _video_filter(rng: random.Random) -> str | None:
    if rng.random() < 0.5:
        return None
    roll = rng.random()
    if roll < 0.04:  # matches nothing: a clear error
        return "id < 0"
    if roll < 0.15:  # a video or a few: less than one batch per rank
        return f"id < {rng.randint(2, 4)}"
    return rng.choice(VIDEO_FILTERS)


def _video_data(rng: random.Random, mixed: bool, clips: Clips) -> tuple[list[Table], Source | None, Mixture | None]:
    """Video tables, and the source or (``mixed``) the mixture of 2-3 sources over them, with
    blocks and samples sized for a few dozen clips."""
    if not mixed:
        return [_video_table(rng)], Source(0, _video_filter(rng)), None
    count = rng.choice([2, 2, 3])
    tables = [_video_table(rng) for _ in range(rng.randint(1, count))]
    sources = [Source(rng.randrange(len(tables)), _video_filter(rng)) for _ in range(count)]
    weights = [rng.choice([1.0, 1.0, 2.0, 0.5]) for _ in sources]
    block = rng.choice([4, 6, 10])
    rule = rng.choice(["first_exhausted", "samples"])
    samples = None
    if rule == "samples":
        samples = rng.choice([max(1, block // 3), block + rng.randint(1, block), rng.randint(12, 40)])
    mixture = Mixture(sources, weights, rule, samples, block)
    if rule == "first_exhausted" and rng.random() < 0.85:  # mostly blocks that the sources fill
        while block > 4 and _whole_blocks(tables, mixture, clips) == 0:
            block = {10: 6, 6: 4}[block]
            mixture = replace(mixture, block=block)
    return tables, None, mixture


def _packing(rng: random.Random) -> Packing:
    return Packing(
        seq_len=rng.choice([2, 4, 8, 16]),
        eos=rng.random() < 0.5,
        labels=rng.choice(["document", "stream", None]),
        lengths_column=rng.random() < 0.5,
    )


def _shuffle(rng: random.Random) -> Shuffle:
    kind = rng.choice(["none", "shard", "row", "row", "buffer"])
    seed = rng.randint(0, 1000)
    if kind == "shard":
        return Shuffle("shard", seed, shard_rows=rng.choice([5, 8, 16, 50, 8192]), within=rng.random() < 0.4)
    if kind == "row":
        return Shuffle("row", seed, clump_rows=rng.choice([1, 1, 4, 16]))
    if kind == "buffer":
        buffer_rows = rng.choice([16, 64, 200])
        return Shuffle("buffer", seed, buffer_rows=buffer_rows, shard_rows=rng.choice([None, 4, buffer_rows // 2]))
    return Shuffle("none")


def _topology(rng: random.Random, batch_size: int) -> Topology:
    return Topology(
        world_size=2 if rng.random() < 0.35 else 1,
        batch_size=batch_size,
        num_workers=2 if rng.random() < 0.25 else 0,
        reader_threads=rng.choice([0, 1, 2, 4]),
        take_group_bytes=rng.choice([1 << 20, 1 << 20, 256, 4096]),
    )


def _batch_size(rng: random.Random, units: int, world_size: int) -> int:
    """A batch size that gives at most about 40 steps per epoch (small scenarios run in seconds) and,
    but rarely, at least two steps."""
    floor = -(-max(1, units) // (40 * world_size))
    choices = [3, 4, 5, 8, 16, 32]
    fitting = [b for b in choices if 2 * b * world_size <= units]
    if fitting and rng.random() < 0.9:
        choices = fitting
    return max(floor, rng.choice(choices))


def _calls(rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        return []
    calls = rng.sample(CALLS_BEFORE_FIT, rng.randint(1, len(CALLS_BEFORE_FIT)))
    return calls


def _loop(rng: random.Random, steps: int) -> Loop:
    limit = rng.randint(2, max(2, steps)) if rng.random() < 0.15 and steps > 2 else None
    interval: float | int | None = None
    roll = rng.random()
    if roll < 0.12:
        interval = 0.5
    elif roll < 0.2 and steps > 3:  # Lightning refuses an interval above a (resumed) epoch's batches
        interval = rng.randint(1, min(3, steps, limit or steps) - 1) if min(steps, limit or steps) > 1 else None
    return Loop(
        epochs=3,
        accumulate=rng.choice([1, 1, 1, 2, 3]),
        val_check_interval=interval,
        limit_train_batches=limit,
        reload_every=rng.choice([0, 0, 0, 1, 2]),
    )


def _stop(rng: random.Random, steps: int, loop: Loop) -> tuple[Stop, float, int]:
    """The stop, each step's sleep (``max_time`` needs a run long enough to cut) and the epoch it
    most likely stops in."""
    kind = rng.choices(STOPS, weights=[25, 15, 20, 20, 8])[0]
    per_epoch = min(steps, loop.limit_train_batches or steps)
    batches = rng.randint(1, 2 * per_epoch)
    epoch = (batches - 1) // per_epoch
    if kind == "max_steps":
        return Stop(kind, max(1, batches // loop.accumulate)), 0.0, epoch
    if kind == "epoch_end":
        at = rng.choice([1, 2])
        return Stop(kind, at), 0.0, at
    if kind == "max_time":
        return Stop(kind, 2), 0.05, 1
    return Stop(kind, batches), 0.0, epoch


def _checkpoints(rng: random.Random, stop: Stop) -> Checkpoints:
    return Checkpoints(
        every=rng.choice([1, 2, 3, 5]),
        save_last=rng.random() < 0.4,
        default_callback=rng.random() < 0.25,
        on_exception=stop.kind == "exception" and rng.random() < 0.5,
        pick=1.0 if rng.random() < 0.5 else round(rng.random(), 3),
    )


def _resume(rng: random.Random, topology: Topology, units: int, loop: Loop, cli: bool) -> Resume:
    new = topology
    if rng.random() < 0.3:
        new = replace(new, world_size=3 - new.world_size)
    if rng.random() < 0.3:
        new = replace(new, batch_size=_batch_size(rng, units, new.world_size))
    if rng.random() < 0.2:
        new = replace(new, num_workers=2 - new.num_workers)
    if rng.random() < 0.2:
        new = replace(new, take_group_bytes=rng.choice([1 << 20, 256, 4096]))
    if rng.random() < 0.2:
        new = replace(new, reader_threads=rng.choice([0, 1, 2, 4]))
    roll = rng.random()
    max_steps: int | str | None = None
    if roll < 0.2:
        max_steps = "loose"
    elif roll < 0.3:
        max_steps = rng.randint(2, 40)
    after = [call for call in CALLS_AFTER_FIT if rng.random() < 0.15]
    calls = _calls(rng)
    if cli:
        calls, after = [], []
    return Resume(topology=new, max_steps=max_steps, calls=calls, after_fit=after)


# -- Lightning's loop, widened (one random stream of its own: the draws above stay as they were) -----
def _widen(rng: random.Random, scenario: Scenario, units: int, stop_epoch: int) -> Scenario:
    """``scenario`` with Lightning's loop options drawn where the package's draws left them at
    their defaults: ``limit_train_batches`` as a fraction, ``val_check_interval`` as a fraction,
    ``check_val_every_n_epoch``, ``num_sanity_val_steps``, a val split alone; the resumed run's
    ``max_epochs`` (binding at the stopped epoch or the next) and ``max_time``; a SIGTERM stop;
    the kind of checkpoint resumed from (and its writer: ``save_last``, the default callback,
    ``OnExceptionCheckpoint``, ``trainer.save_checkpoint`` after fit); a second ``fit`` of the
    same data module in the same process (`Resume.session`) after validate/test/predict."""
    loop, stop, resume, checkpoints = scenario.loop, scenario.stop, scenario.resume, scenario.checkpoints
    first, then = scenario.topology, resume.topology
    per_step = first.world_size * first.batch_size
    steps = min(-(-units // per_step), -(-units // (then.world_size * then.batch_size))) if units else 0
    # limit_train_batches as a fraction: int(batches * f) of each epoch (at least one batch). Only
    # where both runs take the same units per step: a fraction of a resumed epoch on another
    # topology has no one meaning (Lightning keeps the first epoch's count for every later one).
    if loop.limit_train_batches is None and rng.random() < 0.18 and steps >= 3:
        fraction = rng.choice([0.25, 0.34, 0.5, 0.5, 0.75])
        if int((steps - 1) * fraction) >= 1 and per_step == then.world_size * then.batch_size:
            loop = replace(loop, limit_train_batches=fraction)
    if loop.val_check_interval is None and rng.random() < 0.1:
        loop = replace(loop, val_check_interval=rng.choice([0.25, 0.34, 1.0]))
    roll = rng.random()
    if roll < 0.12:
        loop = replace(loop, check_val_every_n_epoch=2)
    elif roll < 0.2 and isinstance(loop.val_check_interval, int):
        loop = replace(loop, check_val_every_n_epoch=None)  # the interval counts across epochs
    if loop.val_check_interval is None and rng.random() < 0.1:
        loop = replace(loop, validate=True)
    sanity = rng.choice([2, 2, 0, 1, -1])
    # The resumed run's max_epochs: the stopped epoch only (its rest), or one more; rarely one the
    # checkpoint already reached (nothing left to train).
    roll = rng.random()
    if roll < 0.3:
        resume = replace(resume, max_epochs=max(1, stop_epoch + rng.choice([1, 1, 2, 0])))
    if rng.random() < 0.05:
        resume = replace(resume, max_time=1.0, step_sleep=0.05)
    # SIGTERM to the (one-rank) stopped run before a batch: it stops by the end of that epoch.
    if rng.random() < 0.08 and first.world_size == 1:
        at = stop.at if stop.kind in ("exception", "sigkill") else rng.randint(1, max(1, 2 * steps))
        stop = Stop("sigterm", int(at))
        if rng.random() < 0.8:
            checkpoints = replace(checkpoints, on_exception=True)
    # A second fit in the same process, with the same data module (so the same topology and cache).
    if not scenario.cli and rng.random() < 0.15:
        # The process must live on to fit again; under DDP a fit after one that raised hung in
        # trials (Lightning's, the package's or the checker's: not yet known), so not drawn.
        if stop.kind in ("sigkill", "sigterm") or (stop.kind == "exception" and first.world_size > 1):
            stop = Stop("max_steps", max(1, int(stop.at) // loop.accumulate))
        between = [call for call in CALLS_BETWEEN_FITS if rng.random() < 0.3]
        resume = replace(resume, topology=first, session=True, between=between, maintenance=False, calls=[])
    # The kind of checkpoint resumed from, with what writes it.
    kind = rng.choices(CHECKPOINT_KINDS, weights=[4, 2, 3, 1, 1, 2])[0]
    normal_end = stop.kind in ("max_steps", "epoch_end", "max_time")
    if kind == "saved" and (scenario.cli or not normal_end):
        kind = "last"
    if kind == "exception" and stop.kind not in ("exception", "sigterm"):
        kind = "periodic"
    writers = {
        "last": {"save_last": True},
        "epoch": {"default_callback": True},
        "exception": {"on_exception": True},
        "saved": {"save_after_fit": True},
    }
    checkpoints = replace(checkpoints, resume_from=kind, **writers.get(kind, {}))
    if kind == "last" and normal_end and rng.random() < 0.5:  # no periodic save: last.ckpt at the fit's end
        checkpoints = replace(checkpoints, every=1000)
    if normal_end and not scenario.cli and kind != "saved" and rng.random() < 0.15:
        checkpoints = replace(checkpoints, save_after_fit=True)
    validated = loop.val_check_interval is not None or loop.validate or loop.check_val_every_n_epoch != 1
    if validated or "validate" in resume.after_fit + resume.between:  # sanity steps need a val split
        loop = replace(loop, num_sanity_val_steps=sanity)
    return replace(scenario, loop=loop, stop=stop, resume=resume, checkpoints=checkpoints)


def _damage(rng: random.Random, scenario: Scenario) -> Scenario:
    """A scenario on S3 whose runs both cache a single source, with the stopped run's copy damaged
    before the resume (`DAMAGES`; a row shuffle, so that the split is read by take and copied)."""
    store = scenario.store
    if store is None or scenario.mixture is not None or scenario.resume.session or rng.random() >= 0.5:
        return scenario
    store = replace(store, cache=Cache(), resume_cache=Cache())  # both runs cache, within the limit
    shuffle = scenario.shuffle
    if shuffle.kind != "row":
        shuffle = Shuffle("row", rng.randint(0, 1000), clump_rows=rng.choice([1, 4]))
    return replace(scenario, shuffle=shuffle, store=replace(store, damage=rng.choice(DAMAGES)))


def _prepare(rng: random.Random, scenario: Scenario) -> Scenario:
    """A local scenario whose table 0 has no deleted rows (a prepared row's ``id`` is its position
    in the input), mostly with a SIGKILL of a prepare before the first fit (`Prepared`)."""
    table = scenario.tables[0]
    if scenario.store is not None or scenario.clips is not None or table.delete_mod or rng.random() >= 0.15:
        return scenario
    units = -(-table.rows // table.fragment_rows) if table.fragment_rows else 1
    moments = [f"write:{rng.randrange(units)}", "rename"] + (
        [f"commit:{rng.randint(1, units - 1)}"] * 2 if units > 1 else []
    )
    kill = rng.choice(moments) if rng.random() < 0.7 else None
    return replace(scenario, prepare=Prepared(workers=rng.choice([1, 1, 2]), kill=kill))
