"""The train data cursor: its saved position, Lightning's loop counters beside it, and its restore.

Guarantees: saving, restoring and validating the cursor happens in this folder: the saved state and
its strict validation (`position`), the live tracker the loader advances (`tracker`), Lightning's
loop counters (`loop`, `progress`) and the restore at the data version it was read at (`restore`).
Importing the folder imports nothing: a DataLoader worker that needs none of it never loads
Lightning.
"""
