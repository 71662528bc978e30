"""The randomized contract checker: composed user steps through the real Trainer, against an oracle.

- `scenario`: what one scenario composes (tables, filter, strategy, packing, mixture, topology,
  calls before fit, Lightning loop options, the stop, the checkpoint chosen, changes on resume)
  and the seeded generator that draws scenarios.
- `truth`: writes a scenario's Lance datasets and computes, without the package, which units
  (rows, packed windows, mixture draws) each source holds.
- `phase`: one real ``Trainer.fit`` of a scenario (in this process, or as a script that Lightning's
  DDP launcher runs once per rank), recording every trained batch, epoch length, cursor and checkpoint.
- `runner`: runs a scenario's phases (reference, stopped, resumed) and returns their records.
- `reference`: checks the reference run's sequences of units against `truth` and the documented order
  and mixture rules.
- `expected`: lays out, from the reference sequences, the batches each run must train (the documented
  layout, epoch lengths, cursors and where a resume continues).
- `oracle`: checks every phase's records against `reference` and `expected` (`oracle.check`).
- `soak`: the command that draws and checks many scenarios (``python -m tests.contract.soak``).
"""
