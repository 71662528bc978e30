"""Packing benchmark: setup time and memory of `TokenPacking` on 10^7 documents, and windows/s read.

Datasets (written once to the cache folder): ``documents`` rows with a ``tokens`` list<int32> column of
0..``max_len`` tokens (uniform) and their count ``n_tokens`` int32. Each case runs in a fresh
subprocess and measures:

- setup: ``LanceDataModule.setup("fit")`` with packing (pin, count the tokens, plan); with
  ``lengths_column`` (reads only ``n_tokens``) on ``documents``, without it (counts the token
  lists: one scan of the token column) on ``documents`` and on ``small`` documents;
- memory: the `DocumentIndex` kept (bytes per document), the peak of numpy allocations during
  setup (``tracemalloc``, which numpy reports to) and the process's peak RSS;
- windows/s: the first ``batches`` batches of ``batch_size`` windows of ``seq_len`` tokens
  read through `LanceIterableDataset` (2 reader threads), timed from the start of the iteration
  (read-ahead cannot hide reads made before the clock starts), NoShuffle and RowShuffle.

- mixing (pure, no I/O): with the windows of the 10^7-document dataset, the share of neighbouring
  windows of a batch that are neighbours in the stream (1.0: every batch is a run of the stream,
  so the model sees one stretch of documents per batch), per strategy.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.common import peak_rss_mb, table_ready
from benchmarks.harness import tables
from benchmarks.harness.study import Params, child

HEADS = (
    "documents | token counts from | shuffle | tokens | windows | setup s | index B/document | setup peak MB "
    "| peak RSS MB | windows/s | tokens/s"
)


def dataset(cache: Path, documents: int, max_len: int) -> str:
    """The token dataset of ``documents`` rows in ``cache`` (written once, streaming)."""
    import lance
    import numpy as np
    import pyarrow as pa

    path = cache / f"tokens_{documents}_{max_len}.lance"
    if table_ready(path, documents, None):
        return str(path)
    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("n_tokens", pa.int32())])
    rng = np.random.default_rng(0)

    def batches():
        for first in range(0, documents, 1 << 20):
            counts = rng.integers(0, max_len + 1, min(1 << 20, documents - first)).astype(np.int32)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            values = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
            tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            yield pa.record_batch([tokens, pa.array(counts)], schema=schema)

    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()), str(path), mode="overwrite", max_rows_per_file=1 << 22
    )
    return str(path)


def case(uri: str, lengths: bool, seq_len: int, batch_size: int, batches: int, shuffle: str) -> dict:
    """One case, in this process."""
    import tracemalloc

    from lance_lightning import LanceDataModule, LanceIterableDataset, LanceSource, NoShuffle, RowShuffle, TokenPacking

    packing = TokenPacking(seq_len=seq_len, lengths_column="n_tokens" if lengths else None)
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["tokens", "n_tokens"]),
        packing=packing,
        shuffle=RowShuffle(seed=0) if shuffle == "RowShuffle" else NoShuffle(),
        batch_size=batch_size,
    )
    tracemalloc.start()
    started = time.perf_counter()
    dm.setup("fit")
    setup_s = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    plan = dm.plans["train"]
    index = plan.documents
    result = {
        "documents": index.documents,
        "tokens": index.tokens,
        "windows": plan.matched_rows,
        "setup_s": setup_s,
        "index_bytes_per_doc": index.starts.nbytes / index.documents,
        "setup_peak_numpy_mb": peak / 2**20,
    }
    if batches:
        dataset = LanceIterableDataset(plan, reader_threads=2)
        started = time.perf_counter()
        read = 0
        for count, batch in enumerate(dataset, 1):  # from the first read on: read-ahead hides nothing
            read += len(batch["input_ids"])
            if count == batches:
                break
        result["windows_per_s"] = read / (time.perf_counter() - started)
        result["tokens_per_s"] = result["windows_per_s"] * seq_len
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def measure(p: Params) -> str:
    cache = p.cache / "packing"
    cache.mkdir(parents=True, exist_ok=True)
    big, small = int(p.documents), int(p.small)
    uris = {n: dataset(cache, n, p.max_len) for n in (big, small)}
    cases = [
        (big, True, "NoShuffle", p.batches),
        (big, True, "RowShuffle", p.batches),
        (big, False, "NoShuffle", 0),
        (small, False, "NoShuffle", 0),
    ]
    rows = []
    for documents, lengths, shuffle, batches in cases:
        spec = {"uri": uris[documents], "lengths": lengths, "seq_len": p.seq_len, "batch_size": p.batch_size}
        result = child("packing:case", batches=batches, shuffle=shuffle, **spec)
        rows.append({"lengths": lengths, "shuffle": shuffle, **result})
        print(rows[-1], flush=True)
    return report(rows, mixing(rows[0]["windows"], p.batch_size), p)


def mixing(windows: int, batch_size: int) -> dict[str, float]:
    """Per strategy: the share of a batch's neighbouring windows that are neighbours in the stream."""
    import numpy as np

    from lance_lightning import BufferShuffle, NoShuffle, RowShuffle, ShardShuffle
    from lance_lightning.plan.order import EpochOrder

    shares = {}
    for strategy in (NoShuffle(), ShardShuffle(seed=0), BufferShuffle(seed=0), RowShuffle(seed=0)):
        order = EpochOrder(windows, strategy, 0).matched_indices(np.arange(windows // batch_size * batch_size))
        batches = order.reshape(-1, batch_size)
        shares[repr(strategy)] = float((np.abs(np.diff(batches, axis=1)) == 1).mean())
    return shares


def report(rows: list[dict], shares: dict[str, float], p: Params) -> str:
    lines = [
        f"Documents of 0..{p.max_len} tokens (uniform), seq_len {p.seq_len}, "
        f"batch {p.batch_size}; one fresh process per case, warm page cache. Setup = "
        "`LanceDataModule.setup('fit')` (pin, count tokens, plan). Memory: the index kept "
        "(`DocumentIndex.starts`), the peak of numpy allocations during setup (tracemalloc) and the process's "
        "peak RSS (imports included). Windows/s: the first batches of an epoch read through "
        f"`LanceIterableDataset` (2 reader threads, at most {p.batches} batches, timed from the iteration's start).",
        "",
    ]
    body = [
        (
            r["documents"],
            "`lengths_column`" if r["lengths"] else "token lists (no lengths_column)",
            r["shuffle"],
            *(r[k] for k in ("tokens", "windows", "setup_s", "index_bytes_per_doc", "setup_peak_numpy_mb")),
            *(r.get(k) for k in ("peak_rss_mb", "windows_per_s", "tokens_per_s")),
        )
        for r in rows
    ]
    lines += tables.table(HEADS, ">, < < >, >, >.2f >.1f >.0f >.0f >,.0f >,.0f", body)
    lines += [
        "",
        f"Mixing: share of neighbouring windows of a batch (batch {p.batch_size}) that are neighbours in the "
        f"stream, over the {rows[0]['windows']:,} windows of the first dataset (pure: the epoch order only).",
        "",
        *tables.table("strategy | neighbours in the stream", "< >.3f", [(f"`{n}`", v) for n, v in shares.items()]),
    ]
    return "\n".join(lines)
