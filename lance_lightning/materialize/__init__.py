"""Materialized views: a shuffled or filtered copy of a source, written once and read in order."""
