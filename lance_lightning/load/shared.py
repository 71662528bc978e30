"""A plan's large arrays shared with worker processes: one copy per machine, not one per worker.

Guarantees:
- Pickled for another process by multiprocessing (its ``ForkingPickler``, which starts
  DataLoader workers under forkserver and spawn), a filter's row set (`RangeRuns`, `MatchBitmap`,
  `EliasFano`) and a packed plan's `DocumentIndex` travel as handles to shared memory, not as
  bytes: every worker maps the pages the training process holds (a 10% filter of 10^9 rows, 2
  workers: 72-74 MiB of each worker's own memory instead of 133; benchmarks/results/worker_memory.md).
  Ordinary pickling (``pickle.dumps``,
  a deep copy) still carries the values.
- The first such pickling copies the structure's arrays into shared memory and points the
  structure at that copy (the same values), so the training process holds one copy too; later
  picklings send the same memory. Counts derived from the arrays (rank/select blocks, run
  offsets) are rebuilt in each process: a 64th of a bitmap, or as large as the runs (at most an
  eighth of a bitmap).
- The memory goes when the last process using it ends, however it ends: torch's shared memory
  (its default file-descriptor strategy on Linux) unlinks the segment at once and lives on in
  open descriptors.
- Registration happens when this module is imported (`lance_lightning.load.dataset` imports it);
  a worker needs this module to rebuild the structures and imports torch, never Lightning.
"""

from __future__ import annotations

import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from lance_lightning.plan.packing import DocumentIndex
from lance_lightning.plan.rowset import EliasFano, MatchBitmap, RangeRuns, RowSet, rowset_from_arrays

#: The shared tensors of each row set shared so far, alive as long as the row set: the descriptors
#: pickling hands a starting process are sent after pickling ends, so no tensor may go before then
#: (a row set's ``arrays()`` can be computed afresh, like run lengths, and no attribute holds them).
_SHARED_ROWSETS: weakref.WeakKeyDictionary[RowSet, dict[str, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def in_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a whole tensor in shared memory (as shared structures' arrays are)."""
    return _shared_base(array) is not None


def _shared_base(array: np.ndarray) -> torch.Tensor | None:
    base = array.base
    if isinstance(base, torch.Tensor) and base.is_shared() and base.numel() == array.size > 0:
        if base.data_ptr() == array.ctypes.data:
            return base
    return None


def _shared(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """A tensor in shared memory holding ``array``: its own base when it lives there already. An
    empty array or a scalar stays as it is (shared memory cannot be empty; a scalar pickles small)."""
    if array.size == 0 or array.ndim == 0:
        return array
    base = _shared_base(array)
    return base if base is not None else torch.from_numpy(np.require(array, requirements="C")).share_memory_()


def _views(tensors: dict[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
    return {name: t.numpy() if isinstance(t, torch.Tensor) else t for name, t in tensors.items()}


def _reduce_rowset(rowset: RowSet) -> tuple[Any, tuple[dict[str, Any]]]:
    with _LOCK:
        tensors = _SHARED_ROWSETS.get(rowset)
        if tensors is None:
            tensors = {name: _shared(array) for name, array in rowset.arrays().items()}
            vars(rowset).update(vars(rowset_from_arrays(_views(tensors))))  # read the shared copy from now on
            _SHARED_ROWSETS[rowset] = tensors
    return _rebuild_rowset, (tensors,)


def _rebuild_rowset(tensors: dict[str, Any]) -> RowSet:
    return rowset_from_arrays(_views(tensors))


def _reduce_documents(index: DocumentIndex) -> tuple[Any, tuple[Any, dict[str, Any]]]:
    with _LOCK:  # the index's own ``starts`` keeps the shared memory (and its descriptor) alive
        tensors = {"starts": _shared(index.starts)}
        object.__setattr__(index, "starts", _views(tensors)["starts"])  # read the shared copy from now on
    return _rebuild_documents, (index.packing, tensors)


def _rebuild_documents(packing: Any, tensors: dict[str, Any]) -> DocumentIndex:
    return DocumentIndex(packing, _views(tensors)["starts"])


for _kind in (RangeRuns, MatchBitmap, EliasFano):
    ForkingPickler.register(_kind, _reduce_rowset)
ForkingPickler.register(DocumentIndex, _reduce_documents)
