"""The randomized contract checker: composed user steps through the real Trainer, against an oracle.

- `scenario`: what one scenario composes (tables, filter, strategy, packing or clips, mixture, topology,
  calls before fit, Lightning's loop options in either run, the stop, the kind of checkpoint
  resumed from, changes on resume, a second fit of the same data module, damage to a cached copy)
  and the seeded generator that draws scenarios.
- `truth`: writes a scenario's Lance datasets and computes, without the package, which units
  (rows, packed windows, video clips, mixture draws) each source holds.
- `phase`: one real ``Trainer.fit`` of a scenario (in this process, or as a script that Lightning's
  DDP launcher runs once per rank), recording every trained batch, epoch length, cursor and
  checkpoint; or a user script's two fits of one data module with new trainers (`phase._session`).
- `runner`: runs a scenario's phases (reference, stopped, resumed) and returns their records.
- `reference`: checks the reference run's sequences of units against `truth` and the documented order
  and mixture rules.
- `expected`: the user's intent, laid out from the reference sequences: the batches each run must
  train for the Lightning options it was given, and where a resume continues (never from the
  package, nor from where Lightning says it resumed).
- `oracle`: checks every phase's records against `reference` and `expected` (`oracle.check`).
- `clips`: each trained video clip is the clip its unit names (frames, times, dataset row), and
  clip starts follow the documented rule.
- `store`: tables on S3, each run's remote cache, and damage to a cached copy between the runs.
- `soak`: the command that draws and checks many scenarios (``python -m tests.contract.soak``).
- `prepared`: "prepare, then fit" (issue #40): a table given as raw Parquet that the first fit's
  ``prepare_data`` prepares (after a SIGKILLed prepare, where drawn), checked against a direct
  write of the same rows, with every later prepare doing nothing.

Where Lightning's loop meets the loader (issue #37): why the checker missed the four defects, and
which part of it now finds each (each is also a replayed case, ``issue37-*`` in ``cases.jsonl``;
each failed on the code before the fix, 5a33ce1, and passes after it):

1. ``limit_train_batches`` as a fraction, resumed at the last batch of a limited epoch (the next
   epoch trained half its batches). Missed: the generator drew ``limit_train_batches`` only as a
   count, and with a count Lightning takes ``min(len(loader), L)``, which hides a ``len`` inflated
   by the carried batch index; the old expectation (``min(length, limit)``) had no meaning for a
   fraction. Found now by `scenario._widen` drawing the limit as a fraction (from the loop's own
   random stream) with ``Checkpoints.resume_from``, so that a periodic checkpoint can fall on a
   limited epoch's last batch, and by the intent's ``int(n * f)`` batches of every epoch
   (`expected.epoch_cap`), each epoch's ``num_training_batches`` included (`Oracle._check_lengths`).
2. A second ``Trainer.fit`` with the same data module (it trained 80 of the 100 remaining
   batches). Missed: every phase built a new data module (mostly in a new process); the only
   calls after a fit were validate/predict after the resumed one, never another fit. Found now by
   ``Resume.session``: the stopped fit, optional validate/test/predict on its trainer, then a new
   ``Trainer`` and ``fit(model, datamodule=dm, ckpt_path=<a checkpoint the first fit wrote>)`` in
   the same process (`phase._session`), held to the batches any resume from that checkpoint owes.
3. A resume from a checkpoint written after ``max_steps``/``max_time`` cut an epoch short, with
   ``max_epochs`` binding (a data epoch lost, or nothing trained). Missed: the oracle agreed with
   the package. Its expectation encoded what the package did ("the next trainer epoch reads the
   rest of that data epoch"), took where Lightning resumed from the run itself, and ran one epoch
   less after an epoch-end checkpoint. The resumed run's ``max_epochs`` was also always the
   stopped run's (the stopped epoch + 3), so the lost epoch was one no expectation looked at.
   Found now by the intent (`expected.intent`, `expected.after`): data epochs ``0..E-1``, each
   whole (as limited), continuing after exactly the batches the checkpoint had trained, whatever
   wrote it. Also by ``Resume.max_epochs`` (binding at the stopped epoch or the next), and by
   resuming from every kind of checkpoint: ``resume_from`` periodic, ``last.ckpt``, epoch end, on
   exception or SIGTERM, and ``trainer.save_checkpoint`` after fit (``save_after_fit``).
4. A damaged remote-cache copy was trusted (other rows trained, or a Lance traceback). Missed: the
   checker never touched a copy between runs, so every resume reused an intact one, and its cache
   check read only the plan's cache line. Found now by ``Store.damage``, which truncates, flips
   bits, replaces rows or deletes a data file of the stopped run's copy before the resume
   (`store.damage`, through `tests.helpers.damage_cached_copy`). The intent fails the wrong rows,
   the health check fails the traceback, and `store.check_cache` fails a copy still damaged after
   the resume (it reads every copy with Lance and compares it with `truth`).
"""
