"""The oracle: `check` reports everything a scenario's phases got wrong against the reference run and the docs.

Guarantees (each failure is one line of `check`'s result, naming the phase, epoch and step):
- The reference run's sequences hold exactly the units `truth` computes, under the documented
  order and mixture rules (`reference.sequences`); a wrong reference stops the check there.
- The stopped and the resumed run train exactly the batches `expected` lays out from those
  sequences: a rank without a tail unit repeats one; ``limit_train_batches`` cuts each epoch; a
  run stops where its ``max_steps``, exception, kill or epochs say. So every unit is trained
  exactly once per epoch (less the documented tail), in the uninterrupted order, whatever the
  world size, batch size or workers, and a resume continues exactly where its checkpoint's batches end.
- Every rank trains the same number of batches; each epoch's length as Lightning took it equals
  the batches it trains; the data module's cursor (at each epoch end, in each checkpoint and at
  the end) names the data epoch and the units consumed, and says ``finished`` exactly when the
  data epoch is; each validation sees every val unit once (padding aside), predict every unit once.
- A scenario that must fail does so with a `ConfigError` before any batch, on every rank, and no
  phase hangs or raises anything else.
- Version holds (`lance_lightning.hold`): after the stopped run each train table carries exactly
  one tag of the package, at the version the run pinned, when the run left it held
  (`runner.held_after_stop`), and none otherwise; other tables never carry one. A resume from a
  checkpoint takes the held tags over (released at its normal end with "fit", kept with "keep"),
  a fresh resume adds its own with "keep", and a refused run adds or removes none.
"""

from __future__ import annotations

from typing import Any

from tests.contract import truth
from tests.contract.expected import Batch, Step, batches, fresh_plans, layout, resumed_plans, until_max_steps
from tests.contract.reference import sequences
from tests.contract.replay import check_replay
from tests.contract.runner import Phase, Run, held_after_stop
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
        for phase in phases.values():
            error = phase.error
            if error is not None and _LIGHTNING_VAL_CHECK in error["message"]:
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
        stop_topology, resume_topology = self.scenario.topology, self.scenario.resume.topology
        epochs = self.scenario.stop.at if self.scenario.stop.kind == "epoch_end" else self.scenario.loop.epochs
        expected_a = list(
            batches(fresh_plans(seqs, self.scenario, stop_topology, int(epochs)), self.scenario.loop.accumulate)
        )
        limit = int(self.scenario.stop.at) if self.scenario.stop.kind == "max_steps" else None
        expected_a = until_max_steps(iter(expected_a), limit)
        self._check_stopped(phases["stop"], expected_a)
        self._check_phase(phases["stop"], expected_a, stop_topology, [])
        if self.run.expected_errors["resume"] is not None:
            self._check_refused(phases["resume"], self.run.expected_errors["resume"])
            return self.failures
        self._check_resumed(phases["resume"], seqs, expected_a, resume_topology)
        return self.failures

    # -- health, errors ------------------------------------------------------------------------
    def _check_health(self, phase: Phase) -> None:
        if phase.timed_out:
            self.fail(f"{phase.role}: hung (no exit within the phase timeout)\n{phase.output[-1500:]}")
        expected = self.run.expected_errors.get(phase.role)
        error = phase.error
        killed = phase.role == "stop" and self.scenario.stop.kind == "sigkill"  # its other ranks lose their peer
        if error is not None and expected is None and not killed:
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
        train = {uris[source.table] for source in self.scenario.sources}
        stop, resume = self.run.holds.get("stop", {}), self.run.holds.get("resume")
        refused = self.run.expected_errors["stop"] is not None
        for uri, tags in stop.items():
            held = uri in train and not refused and held_after_stop(self.scenario)
            want = [self.run.versions[uri]] if held else []
            if sorted(tags.values()) != want:
                self.fail(f"stop: {uri} carries the tags {tags}, expected one per version in {want}")
        if resume is None or self.phases_failed("resume"):
            return
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
        if stop.kind == "max_time":
            if got > len(expected):
                self.fail(f"stop: trained {got} batches, the run has only {len(expected)}")
        elif got != want:
            self.fail(f"stop: trained {got} batches, its {stop.kind} stop ({stop.at}) gives {want}")

    def _check_phase(self, phase: Phase, expected: list[Batch], topology: Topology, before: list[Batch]) -> None:
        """Every rank's batches, epoch lengths and cursors against ``expected`` (a prefix for a stopped run)."""
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
            if (events[0]["epoch"], events[0]["idx"]) != (want.trainer_epoch, want.batch_idx):
                self.fail(f"{where}: expected epoch {want.trainer_epoch} idx {want.batch_idx}")
                return
            problem = _step_problem([e["units"] for e in events], want.step)
            if problem:
                self.fail(f"{where}, data epoch {want.data_epoch}: {problem}")
                return
        self._check_lengths(phase, expected)
        self._check_cursors(phase, expected[:trained], before, topology)
        self._check_evaluation(phase, topology)

    def _check_lengths(self, phase: Phase, expected: list[Batch]) -> None:
        lengths: dict[int, int] = {}
        limit = self.scenario.loop.limit_train_batches  # a restarted epoch may train one past it: `expected.epoch_plan`
        for batch in expected:
            if batch.last_of_epoch or batch.trainer_epoch not in lengths:
                count = batch.batch_idx + 1 if batch.last_of_epoch else -1
                lengths[batch.trainer_epoch] = min(count, limit) if limit is not None else count
        for event in phase.events("epoch", rank=0):
            want = lengths.get(event["epoch"])
            if want is not None and want >= 0 and event["num_training_batches"] != want:
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
        predicted = [u for e in phase.events("predict") for u in e["units"]]
        if "predict" in self.scenario.resume.after_fit and phase.role == "resume" and not phase.error:
            units = units or sorted(truth.val_units(self.scenario).tolist())
            if sorted(predicted) != units:
                self.fail(
                    f"resume: predict gave {len(predicted)} units, {len(set(predicted))} distinct of {len(units)}"
                )

    # -- the resumed run ---------------------------------------------------------------------------
    def _resumed_at(self, phase: Phase, after: Batch | None) -> tuple[int, int]:
        """(trainer epoch, batch index) where Lightning resumed: the first epoch the resumed run
        touched (a restored epoch may have no batch left) and its first batch's index. Lightning
        restarting from a checkpoint at an epoch's end with ``max_steps`` set runs its next epoch
        without a batch (its restored ``is_last_batch``): then the first epoch with a batch."""
        events = [e for e in phase.ranks[0] if e["t"] in ("batch", "epoch", "epoch_end")] if phase.ranks else []
        if not events:
            if after is None:
                return 0, 0
            return (after.trainer_epoch + 1, 0) if after.last_of_epoch else (after.trainer_epoch, after.batch_idx + 1)
        epoch = min(e["epoch"] for e in events)
        batches = [e for e in events if e["t"] == "batch"]
        first = [e["idx"] for e in batches if e["epoch"] == epoch][:1]
        if first:
            return epoch, first[0]
        mid = after is not None and epoch == after.trainer_epoch
        skipped = after is not None and not mid and batches and self.scenario.resume.max_steps is not None
        if skipped and (self.run.chosen.epoch_end or after.last_of_epoch):
            return batches[0]["epoch"], batches[0]["idx"]
        return epoch, after.batch_idx + 1 if mid else 0

    def _check_resumed(self, phase: Phase, seqs: list[list[int]], stopped: list[Batch], topology: Topology) -> None:
        chosen = self.run.chosen
        n = chosen.batches if chosen is not None else 0
        after = stopped[n - 1] if 0 < n <= len(stopped) else None
        resumed_at = self._resumed_at(phase, after)
        if after is not None:
            mid = resumed_at == (after.trainer_epoch, after.batch_idx + 1)
            if not mid and resumed_at[0] <= after.trainer_epoch:
                self.fail(f"resume: Lightning resumed at (epoch, idx) {resumed_at} after batch {_where(after)}")
                return
        global_step = sum(b.optimizer_step for b in stopped[:n])
        max_steps = self.scenario.resume.max_steps
        limit = None if max_steps in (None, "loose") else int(max_steps)
        epochs = self.scenario.loop.epochs
        if chosen is not None and chosen.epoch_end and after is not None and resumed_at[0] == after.trainer_epoch:
            epochs -= 1  # Lightning re-enters an epoch it counted as processed (its end hooks ran), to end it
        plans = resumed_plans(seqs, self.scenario, topology, after, resumed_at, epochs)
        expected = until_max_steps(batches(plans, self.scenario.loop.accumulate), limit, global_step)
        got = len(phase.events("batch", rank=0))
        if got != len(expected) and not phase.error:
            self.fail(f"resume: trained {got} batches after {_where(after)}, expected {len(expected)}")
        self._check_phase(phase, expected, topology, stopped[:n])


class Inapplicable(Exception):
    """The scenario is a configuration Lightning itself refuses: nothing of the package to check."""


#: Lightning refuses an integer ``val_check_interval`` above an epoch's batches (a resumed epoch on
#: another topology can be that short).
_LIGHTNING_VAL_CHECK = "must be less than or equal to the number of the training batches"


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
    cache's and the replay probe's own checks (`store.check_cache`, `replay.check_replay`)."""
    return Oracle(run).check() + check_cache(run) + check_replay(run)
