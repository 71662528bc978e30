"""lance-lightning's benchmarks: one harness (``python -m benchmarks``, `benchmarks.harness`), the
probes (``benchmarks/probes/``) and the result files the docs quote (``benchmarks/results/``,
indexed by ``results/INDEX.md``). Imports nothing: the peers' environment imports this package."""
