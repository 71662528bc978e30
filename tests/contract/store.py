"""Scenarios whose tables live on S3 (a moto server on loopback), and each run's remote cache.

Guarantees:
- `draw_store` draws, from its own random stream (``f"{seed}-store"``: the other draws of a seed
  stay as they were), S3 for about 18% of scenarios and, per run, the `RemoteCache`: on (a
  directory under the scenario's folder), off, or changed between the stopped run and the resumed
  one (on->off, off->on); for a single source sometimes a ``limit_gb`` too small for the split.
  Local scenarios draw nothing (`Scenario.store` is None and absent from the JSON).
- `serving` starts one S3 server (the caller owns its lifetime: once per test, or once per soak
  process) and puts its credentials in this process's environment (`environment_credentials`),
  where Lance reads them, and where every phase subprocess (DDP ranks, the CLI) inherits them:
  no secret is ever written into a scenario, a spec or a YAML config.
- `write_tables` writes a scenario's tables under its own key prefix of the server's bucket, with
  the same rows as `truth.write_tables` writes locally.
- `cache_arguments` gives each run's ``remote_cache`` arguments; a "small" limit is computed from
  the table: above one data file's share of the read columns (below it is a `ConfigError` by
  design) and, where the table allows, below the split's bytes (the cache then reads the store,
  and ``explain()`` says "exceed limit_gb"); a "tiny" one (a row shuffle's stopped run, rarely)
  is below one data file's share: the run must refuse it with a clear error (`expected_error`).
- `check_cache` (part of `tests.contract.oracle.check`): the plan's cache line says what the run's
  cache was set to do: nothing when off or for a mixture (read in place), a local copy for a row
  shuffle when on, the store when the limit is exceeded; a copy made for a split matching under
  `SPARSE_SHARE` of its rows was made by take of those rows, any other by a scan; after a resume
  from a damaged copy, every copy in the cache holds the source's rows again (read with Lance and
  compared with `tests.contract.truth`, not with what the package says). The oracle's
  expectations of the rows, their order and the resume do not change with the store, the cache
  or damage to a copy.
- `damage` (drawn by `tests.contract.scenario` from its own stream, ``f"{seed}-damage"``, into
  about half the scenarios on S3 with one source and no second fit: both runs' caches are then
  on and the split is row-shuffled, so that it is read by take and copied) truncates, flips bits
  in, replaces the rows of or deletes a data file of the stopped run's copy before the resume,
  keeping its manifest and the files' modification times: the resume must detect it, copy again
  and train exactly what an intact copy trains.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.contract.runner import Run
    from tests.contract.scenario import Scenario
    from tests.s3_server import S3Server

#: Share of scenarios on S3 (slower: every read goes through the loopback server).
S3_SHARE = 0.18
#: How the cache changes between the stopped and the resumed run (and each mode's weight).
CACHE_MODES = {"on": 3, "off": 2, "on->off": 2, "off->on": 2}


@dataclass(frozen=True)
class Cache:
    """One run's `RemoteCache`: ``enabled``; ``small``: a ``limit_gb`` the split exceeds; ``tiny``:
    one below a data file's share, which the run must refuse with a clear error (`expected_error`)."""

    enabled: bool = True
    small: bool = False
    tiny: bool = False


@dataclass(frozen=True)
class Store:
    """The scenario's tables are on S3; ``cache`` is the stopped run's cache, ``resume_cache`` the
    resumed run's (the reference run reads the store with the cache off)."""

    cache: Cache = field(default_factory=Cache)
    resume_cache: Cache = field(default_factory=Cache)
    #: Damage done to the stopped run's copy before the resume (`damage`; None: none).
    damage: str | None = None

    @property
    def mode(self) -> str:
        first, then = self.cache.enabled, self.resume_cache.enabled
        return {(True, True): "on", (False, False): "off", (True, False): "on->off", (False, True): "off->on"}[
            (first, then)
        ]


def with_store(seed: int, scenario: Scenario) -> Scenario:
    """``scenario`` with S3 and its caches drawn from ``seed`` (unchanged: local tables). A small
    limit comes with a table of at least 6 data files, so that a limit above one file's share can
    be below the split's bytes."""
    store = draw_store(seed, scenario)
    if store is None:
        return scenario
    tables = scenario.tables
    if store.cache.small or store.resume_cache.small:
        tables = [replace(t, fragment_rows=min(t.fragment_rows or t.rows, max(4, t.rows // 6))) for t in tables]
    return replace(scenario, tables=tables, store=store)


def draw_store(seed: int, scenario: Scenario) -> Store | None:
    """S3 and the caches of a scenario drawn from ``seed`` (None: local tables)."""
    rng = random.Random(f"{seed}-store")
    if rng.random() >= S3_SHARE:
        return None
    mode = rng.choices(list(CACHE_MODES), weights=list(CACHE_MODES.values()))[0]
    first, then = {"on": (True, True), "off": (False, False), "on->off": (True, False), "off->on": (False, True)}[mode]
    small = scenario.mixture is None and rng.random() < 0.3  # a mixture is read in place: no cache
    # A row shuffle of one source always reads by take: the cache applies, and refuses the limit.
    tiny = first and scenario.mixture is None and scenario.shuffle.kind == "row" and rng.random() < 0.3
    return Store(Cache(first, small and first, tiny), Cache(then, small and then))


# -- the server ----------------------------------------------------------------------------------
@contextmanager
def serving() -> Iterator[S3Server]:
    """A started S3 server, its credentials in ``os.environ`` for the block (restored after)."""
    from tests.s3_server import S3Server, environment_credentials

    with S3Server.serving() as server:
        server.create_bucket(bucket(server))
        saved = {name: os.environ.get(name) for name in environment_credentials(server)}
        os.environ.update(environment_credentials(server))
        try:
            yield server
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def bucket(server: S3Server) -> str:
    """One bucket per server (Lance keeps object stores per bucket: never one of an older server)."""
    return f"contract-{server.port}"


def write_tables(scenario: Scenario, root: Path, server: S3Server) -> list[str]:
    """Write the scenario's tables under a key prefix of its own (``root``'s name); return their URIs."""
    from tests.contract import truth

    prefix = f"s3://{bucket(server)}/{root.name}"
    return truth.write_tables(scenario, root, base=prefix, storage_options=server.storage_options())


# -- each run's cache ----------------------------------------------------------------------------
def cache_arguments(scenario: Scenario, role: str, root: Path, uris: list[str]) -> dict[str, Any] | None:
    """The run's ``remote_cache`` arguments (None for local tables), with ``exceeds``: whether the
    split's bytes exceed the limit (the runner keeps it for `check_cache`; it is not an argument)."""
    store = scenario.store
    if store is None:
        return None
    cache = {"reference": Cache(False), "stop": store.cache, "resume": store.resume_cache}[role]
    if not cache.enabled:
        return {"enabled": False}
    arguments: dict[str, Any] = {"enabled": True, "directory": str(root / "remote_cache")}
    if cache.tiny:
        per_file, _ = _bytes(scenario, uris)
        arguments["limit_gb"] = per_file / 4 / 1e9
    elif cache.small:
        per_file, needed = _bytes(scenario, uris)
        window = needed > 1.25 * per_file  # a limit between one file's share and the split
        limit = math.sqrt(per_file * needed) if window else 2 * max(per_file, needed)
        arguments["limit_gb"] = max(limit, 1.0) / 1e9
        arguments["exceeds"] = window
    return arguments


def _bytes(scenario: Scenario, uris: list[str]) -> tuple[float, float]:
    """One data file's share of the read columns, and the matching rows' bytes (the cache's estimates)."""
    import lance

    from lance_lightning.materialize.space import estimate_view_bytes
    from lance_lightning.source import LanceSource, pin_source
    from tests.contract import truth

    source = scenario.sources[0]
    columns = ["tokens", "n_tokens"] if scenario.packing is not None else ["id", "x"]
    pinned = pin_source(LanceSource(uris[source.table], columns=columns), "train")
    dataset = lance.dataset(uris[source.table])
    files = sum(len(fragment.metadata.files) for fragment in dataset.get_fragments())
    per_file = estimate_view_bytes(pinned, dataset, pinned.total_rows, staged=False) / max(1, files)
    matched = int(truth.matches(source.filter, truth.columns(scenario.tables[source.table])).sum())
    return per_file, estimate_view_bytes(pinned, dataset, matched, staged=False)


# -- damage to a copy between the runs ------------------------------------------------------------
def damage(directory: Path, kind: str) -> list[str]:
    """Damage every finished copy in the cache ``directory`` as ``kind`` says (``truncate``,
    ``flip``, ``replace``, ``delete``: `tests.helpers.damage_cached_copy`, which keeps each copy's
    manifest and Lance's, so that only the data files tell); return what was done, one line per
    file (empty: no copy to damage)."""
    from tests.helpers import damage_cached_copy

    if not directory.is_dir() or not any(directory.glob("*.lance")):
        return []
    return [f"{kind} {path}" for path in damage_cached_copy(directory, kind)]


def expected_error(scenario: Scenario) -> str | None:
    """Why the stopped run must stop with a clear `ConfigError` for its cache's limit, or None."""
    if scenario.store is not None and scenario.store.cache.tiny:
        return "remote_cache.limit_gb below one data file's share"
    return None


def check_cache(run: Run) -> list[str]:
    """What each run's cache line (recorded at the fit's end) says against what the cache was set to."""
    scenario, failures = run.scenario, []
    if scenario.store is None:
        return failures
    if scenario.store.cache.tiny and run.expected_errors["stop"] == expected_error(scenario):
        error = run.phases["stop"].error
        if error is not None and "remote_cache.limit_gb" not in error["message"]:
            failures.append(f"stop: refused, but not for remote_cache.limit_gb: {error['message'][:300]}")
    for role in ("stop", "resume"):
        phase, arguments = run.phases.get(role), run.caches.get(role)
        ends = phase.events("fit_end", rank=0) if phase is not None else []
        if not ends or arguments is None:
            continue
        note = ends[-1].get("cache")
        if not arguments["enabled"] or scenario.mixture is not None:
            if note is not None:
                why = "the cache was off" if not arguments["enabled"] else "a mixture is read in place"
                failures.append(f"{role}: {why}, yet the plan's cache line says {note!r}")
        elif arguments.get("exceeds"):  # a plan read by scan has no cache line; one read by take says so
            takes = scenario.shuffle.kind == "row"
            if (note is None and takes) or (note is not None and "exceed limit_gb" not in note):
                failures.append(f"{role}: the split exceeds limit_gb={arguments['limit_gb']:.3g}, cache line {note!r}")
        elif note is not None and "local copy" not in note:
            failures.append(f"{role}: the split fits the cache, yet its cache line says {note!r}")
        elif note is None and scenario.shuffle.kind == "row":
            failures.append(f"{role}: a row shuffle read by take from S3 with the cache on was not cached")
        if note is not None and "downloaded" in note:
            from lance_lightning.materialize.cache import SPARSE_SHARE

            share = _selectivity(scenario)
            if (share < SPARSE_SHARE) != ("by take of the matching" in note):
                failures.append(f"{role}: a split matching {share:.2%} of its rows was copied as {note!r}")
    return failures + _copies_after_damage(run)


def _copies_after_damage(run: Run) -> list[str]:
    """After a resume that ended normally, every copy in the damaged cache holds the source's
    matching rows again, in storage order (read here with Lance; `truth` says which rows)."""
    phase, arguments = run.phases.get("resume"), run.caches.get("resume")
    if not run.damaged or phase is None or phase.error is not None or phase.timed_out or not arguments:
        return []
    import lance

    from tests.contract import truth

    scenario = run.scenario
    source = scenario.sources[0]
    columns = truth.columns(scenario.tables[source.table])
    keep = truth.matches(source.filter, columns)
    key = "id" if scenario.packing is None else "n_tokens"  # a copy holds the read columns only
    failures = []
    for copy in sorted(Path(arguments["directory"]).glob("*.lance")):
        try:
            got = lance.dataset(str(copy)).to_table(columns=[key])[key].to_pylist()
        except Exception as error:  # noqa: BLE001 - any read error of a copy left behind is the finding
            failures.append(f"resume: the damaged copy {copy} was left unreadable ({run.damaged[0]}): {error}")
            continue
        if got != columns[key][keep].tolist():
            failures.append(
                f"resume: the damaged copy {copy} still holds other rows than its source ({run.damaged[0]})"
            )
    return failures


def _selectivity(scenario: Scenario) -> float:
    """The matching share of the single source's live rows (what the plan calls selectivity)."""
    from tests.contract import truth

    source = scenario.sources[0]
    columns = truth.columns(scenario.tables[source.table])
    return int(truth.matches(source.filter, columns).sum()) / len(columns["id"])
