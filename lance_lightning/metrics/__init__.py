"""Metrics: the reader-side stage clock, the consumer-side meter, the figures and the report."""
