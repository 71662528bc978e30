"""Producing: Arrow tables turned into torch batches on reader threads; the user's transform runs here,
under the bad-row policy (`badrows`)."""
