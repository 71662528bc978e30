"""The oracle: `check` reports everything a scenario's phases got wrong against the reference run and the docs.

Guarantees (each failure is one line of `check`'s result, naming the phase, epoch and step):
- The reference run's sequences hold exactly the units `truth` computes, under the documented
  order and mixture rules (`reference.sequences`); a wrong reference stops the check there.
- The stopped and the resumed run train exactly the batches the user's intent gives
  (`expected.intent`, written from Lightning's options, never from the package or from where
  Lightning says it resumed): trainer epoch ``e`` reads data epoch ``e``; ``limit_train_batches``
  (count or fraction) cuts each epoch; ``max_epochs``, ``max_steps`` (optimizer steps), an
  exception or a kill stop the run where they say (``max_time`` and SIGTERM: a prefix); a resume,
  from any checkpoint the stopped run wrote and in a new process or as a second ``fit`` of the
  same data module, continues after exactly the batches its checkpoint had trained, also when a
  stop cut that epoch short. A rank without a tail unit repeats one. So every unit is trained
  exactly once per epoch (less the documented tail and limit), in the uninterrupted order,
  whatever the world size, batch size or workers, with nothing lost or repeated across a resume.
- Every rank trains the same number of batches; each epoch's length as Lightning took it equals
  the batches the intent gives that epoch (those trained before a resume included, limit
  applied); the data module's cursor (at each epoch end, in each checkpoint and at the end) names
  the data epoch and the units consumed, and says ``finished`` exactly when the data epoch is;
  each validation sees every val unit once (padding aside), test and predict every unit once
  (with clips, the clips epoch 0 draws, every pass: `truth.val_units`).
- A scenario that must fail does so with a `ConfigError` before any batch, on every rank, and no
  phase hangs or raises anything else.
- Version holds (`lance_lightning.hold`): after the stopped run each train table carries exactly
  one tag of the package, at the version the run pinned, when the run left it held
  (`runner.held_after_stop`; a stop set past the run's last batch never fires: a normal end),
  and none otherwise; other tables never carry one. A resume from a
  checkpoint takes the held tags over (released at its normal end with "fit", kept with "keep"),
  a fresh resume adds its own with "keep", and a refused run adds or removes none.
"""

from __future__ import annotations

from typing import Any

from tests.contract import prepared, truth
from tests.contract.clips import check_clips
from tests.contract.expected import Batch, Intent, Position, Step, after, intent, layout
from tests.contract.readers import check_readers
from tests.contract.reference import sequences
from tests.contract.replay import check_replay
from tests.contract.retrials import check_retrials
from tests.contract.runner import Phase, Run, held_after_stop, stop_fired
from tests.contract.scenario import Topology
from tests.contract.store import check_cache


# -- the check -------------------------------------------------------------------------------------
class Oracle:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.scenario = run.scenario
        self.failures: list[str] = []

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def check(self) -> list[str]:
        phases = self.run.phases
        for phase in phases.values():  # the resumed run's refusal is judged against the intent's length
            error = phase.error
            if error is not None and _LIGHTNING_VAL_CHECK in error["message"] and phase.role != "resume":
                raise Inapplicable(f"{phase.role}: Lightning refuses the configuration: {error['message'][:200]}")
        for phase in phases.values():
            self._check_health(phase)
        if any(phase.timed_out for phase in phases.values()):
            return self.failures
        self._check_holds()
        if self.run.expected_errors["stop"] is not None:
            self._check_refused(phases["stop"], self.run.expected_errors["stop"])
            return self.failures
        seqs, wrong = sequences(self.scenario, phases["reference"])
        if wrong:  # a wrong reference makes every later comparison noise
            return self.failures + wrong
        self.seqs = seqs
        scenario = self.scenario
        stop_topology, resume_topology = scenario.topology, scenario.resume.topology
        epochs = scenario.stop.at if scenario.stop.kind == "epoch_end" else scenario.loop.epochs
        limit = int(scenario.stop.at) if scenario.stop.kind == "max_steps" else None
        expected_a = intent(seqs, scenario, stop_topology, Position(), int(epochs), limit)
        self._check_stopped(phases["stop"], expected_a.batches)
        self._check_phase(phases["stop"], expected_a, stop_topology, [])
        if self.run.expected_errors["resume"] is not None:
            self._check_refused(phases["resume"], self.run.expected_errors["resume"])
            return self.failures
        self._check_resumed(phases["resume"], expected_a.batches, resume_topology)
        return self.failures

    # -- health, errors ------------------------------------------------------------------------
    def _check_health(self, phase: Phase) -> None:
        if phase.timed_out:
            self.fail(f"{phase.role}: hung (no exit within the phase timeout)\n{phase.output[-1500:]}")
        expected = self.run.expected_errors.get(phase.role)
        error = phase.error
        killed = phase.role == "stop" and self.scenario.stop.kind == "sigkill"  # its other ranks lose their peer
        refused_epoch = phase.role == "resume" and _LIGHTNING_PAST_EPOCHS in (error or {}).get("message", "")
        if error is not None and expected is None and not killed and not refused_epoch:  # that: `_check_resumed`
            message = error["message"]
            shown = message if len(message) <= 1600 else f"{message[:300]} [...] {message[-1300:]}"
            if "Fatal Python error" in message:  # a crash: where each thread was matters, not the module list
                shown = message[:6000]
            self.fail(f"{phase.role}: raised {error['type']}: {shown}")
        stopped = bool(phase.events("stopped"))
        if phase.returncode not in (0, None) and error is None and not (killed or stopped) and expected is None:
            crashed = phase.output.startswith("Fatal Python error")  # faulthandler's report: every thread's stack
            shown = phase.output[:6000] if crashed else phase.output[-1500:]
            self.fail(f"{phase.role}: exited {phase.returncode} without a recorded error\n{shown}")
        for event in phase.events("warning"):
            self.fail(f"{phase.role}: warned {event['messages'][0][:300]}")
        for event in phase.events("call"):
            if event["name"] == "dataset" and event["result"] != "dict":
                self.fail(f"{phase.role}: iterating dm.train_dataloader().dataset gave {event['result']}, not a batch")

    def _check_refused(self, phase: Phase, why: str) -> None:
        # Every rank that started reports it (an error before fit, in rank 0's process, starts no other rank).
        started = [events for events in phase.ranks if events]
        errors = [events for events in started if any(e["t"] == "error" for e in events)]
        error = phase.error
        if error is None or not _clear_error(error):
            got = f"{error['type']}: {error['message'][:300]}" if error else "no error"
            self.fail(f"{phase.role}: expected a ConfigError ({why}), got {got}")
        if phase.events("batch"):
            self.fail(f"{phase.role}: trained {len(phase.events('batch'))} batch(es) before refusing ({why})")
        if error is not None and len(errors) < len(started):
            self.fail(f"{phase.role}: only {len(errors)} of the {len(started)} rank(s) that started reported the error")

    # -- version holds -------------------------------------------------------------------------
    def _check_holds(self) -> None:
        uris = list(self.run.versions)
        if not uris:  # a "prepare, then fit" run refused before its prepare made the table: none read
            return
        train = {uris[source.table] for source in self.scenario.sources}
        stop, resume = self.run.holds.get("stop", {}), self.run.holds.get("resume")
        refused = self.run.expected_errors["stop"] is not None
        stopped = self.run.phases.get("stop")
        # The hold counts every call of the data module's state_dict while it holds as a checkpoint
        # that may need the tags (`lance_lightning.hold`): the recorder makes one at each epoch end,
        # and every checkpoint saved counts, also one gone by now (Lightning's OnExceptionCheckpoint
        # removes its file at the next teardown: a validate after the failed fit; seed 1962).
        recorded = stopped is not None and bool(stopped.events("epoch_end", rank=0) or stopped.events("save", rank=0))
        for uri, tags in stop.items():
            needed = bool(self.run.checkpoints) or recorded
            held = uri in train and not refused and held_after_stop(self.scenario, needed, stop_fired(stopped))
            want = [self.run.versions[uri]] if held else []
            if sorted(tags.values()) != want:
                self.fail(f"stop: {uri} carries the tags {tags}, expected one per version in {want}")
        if resume is None or self.phases_failed("resume"):
            return
        if self.scenario.resume.session and self.run.chosen is None:
            return  # a second fit from the start, by the data module that took the first fit's holds
        adopted = self.run.chosen is not None
        for uri, tags in resume.items():
            before = stop.get(uri, {})
            if self.run.expected_errors["resume"] is not None:
                want = before
            elif self.scenario.hold == "fit":
                want = {} if adopted else before
            else:
                want = before
            fresh = self.scenario.hold == "keep" and not adopted and uri in train
            extra = sorted(set(tags) - set(want))
            if {k: v for k, v in tags.items() if k in want} != want or len(extra) != int(fresh):
                self.fail(f"resume: {uri} carries the tags {tags}, expected {want}" + (" and one new" if fresh else ""))
            elif extra and tags[extra[0]] != self.run.versions[uri]:
                pinned = self.run.versions[uri]
                self.fail(f"resume: the new tag {extra[0]} holds version {tags[extra[0]]}, not {pinned}")

    def phases_failed(self, role: str) -> bool:
        phase = self.run.phases.get(role)
        unexpected = phase is not None and phase.error is not None and self.run.expected_errors.get(role) is None
        return phase is None or phase.timed_out or unexpected

    # -- the stopped run ---------------------------------------------------------------------------
    def _check_stopped(self, phase: Phase, expected: list[Batch]) -> None:
        """How many batches the stopped run trained: exactly what its stop says."""
        got = len(phase.events("batch", rank=0))
        stop = self.scenario.stop
        want = {
            "exception": min(int(stop.at), len(expected)),
            "sigkill": min(int(stop.at), len(expected)),
        }.get(stop.kind, len(expected))
        if stop.kind == "sigterm" and int(stop.at) < len(expected):
            # Sent before batch `at` (which trains): a stop after it, by the end of its epoch at the
            # latest (one rank: Lightning stops at the epoch's end; the loader may stop sooner when
            # its workers died of the signal), as SIGTERMException.
            at, epoch = int(stop.at), expected[int(stop.at)].trainer_epoch
            last = 1 + max(i for i, b in enumerate(expected) if b.trainer_epoch == epoch)
            if not phase.events("stopped"):
                self.fail(f"stop: SIGTERM before batch {at} did not stop the run")
            if not at + 1 <= got <= last:
                self.fail(f"stop: trained {got} batches, SIGTERM before batch {at} stops after {at + 1} to {last}")
            return
        if stop.kind == "max_time":  # a prefix
            if got > len(expected):
                self.fail(f"stop: trained {got} batches, the run has only {len(expected)}")
        elif got != want:
            self.fail(f"stop: trained {got} batches, its {stop.kind} stop ({stop.at}) gives {want}")

    def _check_phase(self, phase: Phase, planned: Intent, topology: Topology, before: list[Batch]) -> None:
        """Every rank's batches, epoch lengths and cursors against the ``planned`` ones (a prefix for a stopped run)."""
        expected = planned.batches
        ranks = [[e for e in events if e["t"] == "batch"] for events in phase.ranks]
        counts = [len(r) for r in ranks]
        if len(set(counts)) > 1 and not (phase.role == "stop" and self.scenario.stop.kind == "sigkill"):
            self.fail(f"{phase.role}: ranks trained different numbers of batches: {counts}")
        trained = min(counts) if counts else 0
        for i in range(trained):
            want = expected[i] if i < len(expected) else None
            events = [r[i] for r in ranks]
            where = f"{phase.role} batch {i} (epoch {events[0]['epoch']}, idx {events[0]['idx']})"
            if want is None:
                self.fail(f"{where}: trained beyond the {len(expected)} expected batches")
                return
            problem = _step_problem([e["units"] for e in events], want.step)
            if problem or (events[0]["epoch"], events[0]["idx"]) != (want.trainer_epoch, want.batch_idx):
                expected_at = (
                    f"expected data epoch {want.data_epoch} as epoch {want.trainer_epoch} idx {want.batch_idx}"
                )
                found = _locate(events[0]["units"], i, expected, before) if problem else "the right units"
                self.fail(f"{where}: {expected_at}: {problem or 'numbered otherwise'} ({found})")
                return
        self._check_lengths(phase, planned)
        self._check_cursors(phase, expected[:trained], before, topology)
        self._check_evaluation(phase, topology)

    def _check_lengths(self, phase: Phase, planned: Intent) -> None:
        """Each trainer epoch's batch count as Lightning took it at its start (it stops the epoch
        there, and scales ``val_check_interval`` by it): the intent's, restored batches included."""
        for event in phase.events("epoch", rank=0):
            want = planned.caps.get(event["epoch"])
            if want is not None and event["num_training_batches"] != want:
                self.fail(
                    f"{phase.role}: Lightning took epoch {event['epoch']} as {event['num_training_batches']} "
                    f"batches, it has {want}"
                )

    def _check_cursors(self, phase: Phase, done: list[Batch], before: list[Batch], topology: Topology) -> None:
        """Cursors at epoch ends, saves and the fit's end name the data epoch and units consumed
        (positions compared as `_position` normalizes them)."""
        events = phase.ranks[0]
        seen = 0
        for event in events:
            if event["t"] == "batch":
                seen += 1
            if event["t"] not in ("epoch_end", "save", "end") or event.get("cursor") is None:
                continue
            count = event.get("batches", seen)
            after = done[count - 1] if 0 < count <= len(done) else (before[-1] if count == 0 and before else None)
            if after is None:
                continue
            cursor = event["cursor"]
            want = (after.data_epoch, after.consumed)
            got = (cursor.get("epoch"), cursor.get("rows_consumed"))
            where = f"{phase.role}: cursor at {event['t']} after {count} batch(es)"
            ended = after.last_of_epoch and got == (after.data_epoch + 1, 0)  # the trainer began its next epoch
            if not ended and self._position(*got, topology) != self._position(*want, topology):
                self.fail(f"{where} says (epoch, consumed) {got}, expected {want}")
                return
            finished = cursor.get("finished")
            if finished is not None and finished != (after.consumed >= after.rows):
                self.fail(f"{where} says finished={finished} at {after.consumed} of {after.rows} units")
                return

    def _position(self, epoch: Any, consumed: Any, topology: Topology) -> tuple[Any, Any]:
        """A data position with its equivalents made one: where the rest of the data epoch makes no
        step for ``topology`` (read to its end, or only a dropped tail left), the next epoch's start."""
        if not isinstance(epoch, int) or not 0 <= epoch < len(self.seqs) or not isinstance(consumed, int):
            return epoch, consumed
        rest = layout(self.seqs[epoch], consumed, topology.world_size, topology.batch_size, self.scenario.drop_last)
        return (epoch + 1, 0) if not rest else (epoch, consumed)

    def _check_evaluation(self, phase: Phase, topology: Topology) -> None:
        units = None
        runs = [[e for e in events if e["t"] == "val" and not e["sanity"]] for events in phase.ranks]
        if any(runs):
            units = sorted(truth.val_units(self.scenario).tolist())
            for i in range(min(len(r) for r in runs)):
                got = [u for r in runs for u in r[i]["units"]]
                if sorted(set(got)) != units or len(got) - len(units) >= topology.world_size:
                    self.fail(
                        f"{phase.role}: validation {i} saw {len(got)} units, {len(set(got))} distinct of {len(units)}"
                    )
                    break
        resume = self.scenario.resume
        calls = {"resume": resume.after_fit, "stop": resume.between if resume.session else []}.get(phase.role, [])
        for call in ("predict", "test"):
            seen = [u for e in phase.events(call) for u in e["units"]]
            if call not in calls or phase.error:
                continue
            units = units or sorted(truth.val_units(self.scenario).tolist())
            distinct = sorted(set(seen))
            if (
                (sorted(seen) != units)
                if call == "predict"
                else (distinct != units or len(seen) - len(units) >= topology.world_size)
            ):
                self.fail(f"{phase.role}: {call} gave {len(seen)} units, {len(distinct)} distinct of {len(units)}")

    # -- the resumed run ---------------------------------------------------------------------------
    def _check_resumed(self, phase: Phase, stopped: list[Batch], topology: Topology) -> None:
        """The resumed run trains the intent's batches from where the chosen checkpoint's trained
        batches end (a run from the start without one), up to its own ``max_epochs``, ``max_steps``
        and ``max_time`` (a prefix)."""
        scenario, chosen = self.scenario, self.run.chosen
        n = chosen.batches if chosen is not None else 0
        if n > len(stopped):
            self.fail(
                f"resume: its checkpoint {chosen.path} had trained {n} batches, the stopped run has {len(stopped)}"
            )
            return
        last = stopped[n - 1] if n else None
        global_step = sum(b.optimizer_step for b in stopped[:n])
        max_steps = scenario.resume.max_steps
        limit = None if max_steps in (None, "loose") else int(max_steps)
        planned = intent(self.seqs, scenario, topology, after(last), scenario.resume_epochs, limit, global_step)
        error = phase.error
        if error is not None and _LIGHTNING_VAL_CHECK in error["message"]:
            interval, cap = scenario.loop.val_check_interval, planned.caps.get(after(last).epoch)
            if cap is None or cap < interval:
                raise Inapplicable(f"resume: Lightning refuses the configuration: {error['message'][:200]}")
            self.fail(f"resume: Lightning refused val_check_interval={interval}; the intent's epoch has {cap} batches")
            return
        if error is not None and _LIGHTNING_PAST_EPOCHS in error["message"]:
            if after(last).epoch <= scenario.resume_epochs:  # Lightning refuses only a checkpoint past max_epochs
                epochs = scenario.resume_epochs
                self.fail(f"resume: Lightning refused the checkpoint after {_where(last)} under max_epochs={epochs}")
            return
        got = len(phase.events("batch", rank=0))
        timed = scenario.resume.max_time is not None
        if (got > len(planned.batches) if timed else got != len(planned.batches)) and not phase.error:
            self.fail(f"resume: trained {got} batches after {_where(last)}, expected {len(planned.batches)}")
        self._check_phase(phase, planned, topology, stopped[:n])


class Inapplicable(Exception):
    """The scenario is a configuration Lightning itself refuses: nothing of the package to check."""


#: Lightning refuses an integer ``val_check_interval`` above an epoch's batches (a resumed epoch on
#: another topology can be that short).
_LIGHTNING_VAL_CHECK = "must be less than or equal to the number of the training batches"
#: Lightning refuses to resume a checkpoint whose epoch is past the resumed run's ``max_epochs``
#: (a user resuming a run further than it now goes): correct when the intent's position is past them.
_LIGHTNING_PAST_EPOCHS = "You restored a checkpoint with current_epoch="


def _clear_error(error: dict[str, str]) -> bool:
    """A `ConfigError`: raised from Python, or printed by ``lance-lightning`` on one screen, exit 1."""
    if error["type"] == "ConfigError":
        return True
    message = error["message"]
    return error["type"] == "CommandError" and message.startswith("exit 1:") and "\n  parameter: " in message


def _where(batch: Batch | None) -> str:
    if batch is None:
        return "no batch"
    return f"epoch {batch.trainer_epoch} idx {batch.batch_idx} (data epoch {batch.data_epoch}, unit {batch.consumed})"


def _locate(units: list[int], i: int, expected: list[Batch], before: list[Batch]) -> str:
    """Where rank 0's ``units`` (the run's ``i``-th batch) sit in the intent: a batch trained before
    the resume (repeated), a later one (the ones between lost), or none (another order or rows)."""
    for j, batch in enumerate(before):
        if batch.step[0] == units:
            return f"a repeat of batch {j} of the stopped run ({_where(batch)})"
    for j, batch in enumerate(expected[i + 1 :], start=i + 1):
        if batch.step[0] == units:
            return f"the intent's batch {j}: {j - i} expected batch(es) before it lost ({_where(batch)})"
    for j, batch in enumerate(expected[:i]):
        if batch.step[0] == units:
            return f"a repeat of batch {j} of this run ({_where(batch)})"
    return "no batch of the intent"


def _step_problem(got: list[list[int]], want: Step) -> str | None:
    """Why one global step's per-rank units differ from the documented ones (None: they agree)."""
    tail_units = {u for rank in want for u in rank}
    for rank, (units, wanted) in enumerate(zip(got, want)):
        if wanted:
            if units != wanted:
                return f"rank {rank} got {units[:12]}, expected {wanted[:12]}"
        elif len(units) != 1 or units[0] not in tail_units:
            return f"rank {rank} (no tail unit) got {units}, expected one repeated tail unit"
    return None


def check(run: Run) -> list[str]:
    """Everything the scenario's phases got wrong (empty: the contract holds), with the remote
    cache's, the replay probe's, a prepared table's, the trained clips', the race's trials' and
    who read's own checks (`store.check_cache`, `replay.check_replay`, `prepared.check`,
    `clips.check_clips`, `retrials.check_retrials`, `readers.check_readers`) and the failures of
    the issue #50 parts (`Run.parts`)."""
    if run.scenario.fit is False:  # only the issue #50 parts ran (`tests.contract.parts`)
        return list(run.parts)
    fit = Oracle(run).check() + check_cache(run) + check_replay(run) + prepared.check(run) + check_clips(run)
    return fit + check_retrials(run) + check_readers(run) + run.parts
