"""Row sets and document indexes reach worker processes as shared memory, not as copies."""

from __future__ import annotations

import io
import multiprocessing
import pickle
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import lance
import numpy as np
import pytest

from lance_lightning import LanceSource
from lance_lightning.load.shared import in_shared_memory
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.plan.packing import DocumentIndex, TokenPacking
from lance_lightning.plan.rowset import EliasFano, MatchBitmap, RangeRuns
from lance_lightning.source import pin_source
from tests.harness import make_dm
from tests.helpers import packages_imported_by, write_dataset

ROWS = 20_000
FILTERS = {EliasFano: "id % 10 = 3", MatchBitmap: "id % 2 = 0", RangeRuns: "id < 700 OR id >= 19000"}


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("shared") / "ds.lance", ROWS, fragment_rows=5000)


def structures(uri: str) -> list:
    found = [find_matches(pin_source(LanceSource(uri, filter=flt), "train")) for flt in FILTERS.values()]
    assert [type(rowset) for rowset in found] == list(FILTERS)
    counts = np.random.default_rng(0).integers(0, 50, 5000)
    return [*found, DocumentIndex.from_counts(TokenPacking(seq_len=16), counts)]


def contents(structure) -> np.ndarray:
    if isinstance(structure, DocumentIndex):
        return np.asarray(structure.starts)
    return structure.select(np.arange(structure.rows))


def primary_arrays(structure) -> list[np.ndarray]:
    """The arrays a structure is made of (not the counts derived from them)."""
    if isinstance(structure, DocumentIndex):
        return [structure.starts]
    if isinstance(structure, EliasFano):
        return [structure.upper.words, structure.low]
    if isinstance(structure, MatchBitmap):
        return [structure.words]
    return [structure.starts]


def _mapped_by_torch(array: np.ndarray, maps: str) -> bool:
    """Whether ``array``'s bytes lie in one mapping of torch's shared memory (``/proc/self/maps``)."""
    first, last = array.ctypes.data, array.ctypes.data + array.nbytes
    for line in maps.splitlines():
        span, *rest = line.split(maxsplit=5)
        low, high = (int(bound, 16) for bound in span.split("-"))
        if low <= first and last <= high:
            return len(rest) == 5 and "torch_" in rest[4]
    return False


def _inspect(structures, pipe) -> None:
    """In the worker: what it received of each structure, and whether its arrays map shared memory."""
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    pipe.send(
        [
            {
                "contents": contents(structure),
                "shared": all(in_shared_memory(array) for array in primary_arrays(structure)),
                "mapped": all(_mapped_by_torch(array, maps) for array in primary_arrays(structure)),
            }
            for structure in structures
        ]
    )


def test_a_worker_maps_the_structures_the_training_process_holds(uri: str) -> None:
    # One worker receives every structure (one interpreter's imports instead of one per structure);
    # each structure's arrays are checked on their own, and "mapped" asks that each array's bytes
    # lie in a mapping of torch's shared memory.
    context = multiprocessing.get_context("forkserver")
    sent = structures(uri)
    expected = [contents(structure).copy() for structure in sent]
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_inspect, args=(sent, send))
    worker.start()  # pickles the structures with multiprocessing's ForkingPickler, as DataLoader does
    assert receive.poll(120), f"the worker sent nothing (exit {worker.exitcode})"
    reports = receive.recv()
    worker.join(60)
    assert len(reports) == len(sent)
    for structure, report, values in zip(sent, reports, expected):
        name = type(structure).__name__
        assert np.array_equal(report["contents"], values), name
        assert report["shared"], f"{name} reached the worker as a copy"
        if sys.platform.startswith("linux"):
            assert report["mapped"], f"{name}: not in a shared-memory mapping in the worker"
        # The training process now reads the shared copy: the same values.
        assert all(in_shared_memory(array) for array in primary_arrays(structure)), name
        assert np.array_equal(contents(structure), values), name


def test_sharing_sends_handles_and_plain_pickling_still_sends_values(uri: str) -> None:
    # 512 KiB of words, 1,024 of them random and the rest 0: what is pickled is the whole array, and
    # the copy's 32,000 matches are compared in full (a dense bitmap's 2 million took 10 s of CPU).
    rng = np.random.default_rng(1)
    words = np.zeros(1 << 16, dtype=np.uint64)
    words[rng.choice(1 << 16, 1 << 10, replace=False)] = rng.integers(0, 2**63, 1 << 10, dtype=np.uint64)
    bitmap = MatchBitmap(words)
    expected = contents(bitmap).copy()
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(bitmap)
    assert len(buffer.getvalue()) < words.nbytes // 100
    plain = pickle.dumps(bitmap)
    assert len(plain) > words.nbytes
    copy = pickle.loads(plain)
    assert not in_shared_memory(copy.words) and np.array_equal(contents(copy), expected)


def test_a_loader_with_workers_trains_on_the_filtered_rows_from_one_shared_row_set(uri: str) -> None:
    flt = FILTERS[EliasFano]
    dm = make_dm(uri, "row:4", filter=flt, batch_size=32, num_workers=2, drop_last=False)
    dm.setup("fit")
    ids = sorted(i for batch in dm.train_dataloader() for i in batch["id"].tolist())
    expected = sorted(lance.dataset(uri).to_table(columns=["id"], filter=flt).column(0).to_pylist())
    assert ids == expected
    matches = dm.plans["train"].matches
    assert all(in_shared_memory(a) for a in primary_arrays(matches)), "the workers received a copy of the row set"


def test_sharing_imports_torch_never_lightning() -> None:
    imported = packages_imported_by(["lance_lightning.load.shared"], ("torch", "lightning", "pytorch_lightning"))
    assert imported == ["torch"]
