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
- `parts` (issue #50): parts a scenario draws beside its fit, each from its own random stream and
  checked against its own oracle (``fit=False``: only them, as the replayed ``issue50-*`` cases do):
  `prepare_draws` (``lance-lightning prepare`` of raw files in every format, killed and rerun,
  read back against the files; the input a local folder, its ``file://`` URI or an S3 prefix on
  moto, issue #52, the credentials nowhere in the output or the dataset), `writer_draws`
  (``Trainer.predict`` with the prediction writer through `writer_script`, killed on any rank and
  rerun, against values computed from each row's ``id`` and an uninterrupted run) and
  `media_draws` (video clips and audio windows over `tests.media_corpus`, against a whole-stream
  PyAV decode; issue #52: also TorchCodec's ``policy``, sampling ranges, regular starts and names,
  clips filled past the end and the documented bad rows, from docs/video.md's placement rule).

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

Writing and media (issue #50): why the checker missed each defect, and which part of it now finds
it (each is a replayed case, ``issue50-*`` in ``cases.jsonl``; each failed on 53f5928, the code
before the fixes, with the failure its ``found`` quotes, and passes on 44d57a1, with the fixes):

1. ``prepare`` scrambled the columns after a blob column in every unit after the first commit
   (``issue50-blob-units``, ``issue50-blob-units-webdataset-rerun``). Missed: the only prepare the
   checker drew was "prepare, then fit" of Parquet (no blob column, one unit per file), held to a
   direct write of the same rows. Found now by `prepare_draws`: video/audio folders and webdataset
   members of about 1 MiB (blob columns), ``unit_files`` against ``workers`` (often more than
   ``2 x workers`` units), a SIGKILL at every commit point and the rerun, every column of every
   row read back (blobs as bytes) and compared with the files, their class folders and paths.
2. The writer, rerun after a SIGKILL on a dataset deleted and rewritten at the same path,
   committed a version that did not read (``issue50-rewritten-dataset``). 3. A rerun with another
   model mixed two models' outputs (``issue50-other-model``). Missed: the checker never ran the
   prediction writer (predict was only a call after fit, without a writer), so no kill or rerun of
   it either. Found now by `writer_draws`: ``Writing.rerun`` (the same, ``rewritten``,
   ``other_model``) after a kill at a random batch on any rank; the oracle computes every row's
   value from its ``id`` and the model's scale (no package), so a version that does not read, a
   row of the other model or of the old dataset fails.
4. A resumed predict with per-row randomness wrote other values than an uninterrupted run
   (``issue50-row-random-resume``, ``issue50-device-augment-resume``). Missed: per-row randomness
   was checked only across resumed fits (tests/row_random_worker.py), never a predict rerun.
   Found now by ``Writing.random`` (``RowRandom``, ``RandomFlip``, ``DeviceAugment(seed=...)``)
   with a kill, each row's value held to an uninterrupted one-rank run without workers.
5. MP3 / M4A windows started on other samples than a whole-stream decode
   (``issue50-audio-windows``). 6. Clips planned outside the video for MKV/WebM with a longer
   audio track or a non-zero start; an AVI clip at frame 0 failed (``issue50-clips-outside``).
   Missed: the checker's clips were video only, H.264 in MP4 without audio, starting at 0 at a
   constant rate (`tests.videos`), where the container's duration and the stream agree. Found now
   by `media_draws`: clips and windows over every file of the media corpus (MP4/MOV/MKV/WebM/AVI/
   MPEG-TS, WAV/FLAC/MP3/M4A/Opus), ``even`` starts (the first and the last possible clip always
   drawn), each compared with a whole-stream PyAV decode (frames bit-exact at their times; samples
   within the codec's tolerance from their documented first sample).
7. ``prepare`` kept a truncated JPEG as a good row (``issue50-truncated-jpeg``). Missed: no bad
   input was ever drawn. Found now by ``Ingest.truncated`` (a JPEG cut at 3/4: headers whole),
   the oracle decoding every image whole with PIL and expecting exactly the others as rows.

Also found as cases: ``ReplaceBadRow`` choosing a row of another fragment failed the writer's
commit (``issue50-replace-bad-row``: ``Writing.bad``), and a second ``trainer.predict`` of the same
trainer after the writer committed failed (``issue50-second-predict``: ``Writing.second``).
"""
