"""Producing: Arrow tables turned into torch batches on reader threads, with bad-row handling."""
