"""The benchmark harness: a cell is ``workload/loader/size/workers/storage``; `registry` holds the
grid as data and the suites of record, `data` the tables, `loaders` each loader's construction,
`cell` the measurement in a fresh process, `runner` the processes and repetitions, `report` the
result file, `tables` the writing of every result table (the studies' too). The command is
``python -m benchmarks`` (``benchmarks/__main__.py``)."""
