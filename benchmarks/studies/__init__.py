"""The studies of the harness: one module each, ``measure(p) -> markdown`` with the parameters of its
entry in `benchmarks.harness.registry.STUDIES`; run as ``python -m benchmarks run NAME``."""
