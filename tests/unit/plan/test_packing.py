"""Token packing across batches: the window -> documents mapping and the packed arrays, against a
reference built by concatenating documents in Python; real reads through `LanceIterableDataset`
for every strategy, rank and filter; bad input at setup."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lance_lightning import (
    BufferShuffle,
    ConfigError,
    DataReadError,
    LanceDataModule,
    LanceIterableDataset,
    LanceSource,
    NoShuffle,
    RowShuffle,
    ShardShuffle,
    TokenPacking,
)
from lance_lightning.plan.packing import DocumentIndex, pack_windows, sequence_bounds
from tests.helpers import write_token_dataset

PURE = settings(max_examples=200, deadline=None)


# -- the reference: documents concatenated in Python -----------------------------------------------
def reference_stream(documents: list[list[int]], eos_id: int | None) -> tuple[list[int], list[int], list[int]]:
    """The stream's tokens, the document of each token, and each token's index in its document."""
    tokens, owner, inside = [], [], []
    for d, doc in enumerate(documents):
        doc = doc + ([eos_id] if eos_id is not None else [])
        tokens += doc
        owner += [d] * len(doc)
        inside += list(range(len(doc)))
    return tokens, owner, inside


def reference_batch(documents: list[list[int]], packing: TokenPacking, windows: list[int]) -> dict[str, list]:
    tokens, owner, inside = reference_stream(documents, packing.eos_id)
    L = packing.seq_len
    out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "document_ids": [], "cu_seqlens": [0]}
    for j, w in enumerate(windows):
        first = w * L
        out["input_ids"].append(tokens[first : first + L])
        out["position_ids"].append(inside[first : first + L])
        ids, piece = [], 0
        for s in range(first, first + L):
            if s > first and owner[s] != owner[s - 1]:
                piece += 1
                out["cu_seqlens"].append(j * L + s - first)
            ids.append(piece)
        out["document_ids"].append(ids)
        out["cu_seqlens"].append((j + 1) * L)
        if packing.labels is None:
            continue
        labels = []
        for s in range(first, first + L):
            crosses = owner[s + 1] != owner[s]
            labels.append(packing.ignore_index if crosses and packing.labels == "document" else tokens[s + 1])
        out["labels"].append(labels)
    return out


@st.composite
def packed_cases(draw: st.DrawFn) -> tuple[list[list[int]], TokenPacking, list[int]]:
    counts = draw(st.lists(st.integers(0, 12), min_size=1, max_size=30))
    documents = [[draw(st.integers(0, 50_000)) for _ in range(n)] for n in counts]
    packing = TokenPacking(
        seq_len=draw(st.integers(1, 16)),
        eos_id=draw(st.sampled_from([None, 99_999])),
        labels=draw(st.sampled_from(["document", "stream", None])),
        ignore_index=-100,
    )
    index = DocumentIndex.from_counts(packing, np.array(counts))
    if index.windows == 0:
        return documents, packing, []
    windows = draw(st.lists(st.integers(0, index.windows - 1), min_size=1, max_size=12))
    return documents, packing, windows


def packed(documents: list[list[int]], packing: TokenPacking, windows: list[int]) -> dict[str, torch.Tensor]:
    index = DocumentIndex.from_counts(packing, np.array([len(d) for d in documents]))
    needed = index.documents_of(np.array(windows))
    read = [documents[d] for d in needed]  # what a reader reads: the spanned documents' tokens
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in read])])
    values = np.array([t for d in read for t in d], dtype=np.int64)
    arrays = pack_windows(index, np.array(windows), needed, values, offsets)
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    batch["cu_seqlens"], batch["max_seqlen"] = sequence_bounds(batch["document_ids"])
    return batch


@PURE
@given(packed_cases())
def test_packed_windows_equal_the_python_concatenation(case) -> None:
    documents, packing, windows = case
    counts = np.array([len(d) for d in documents])
    index = DocumentIndex.from_counts(packing, counts)
    total = int(counts.sum()) + (len(documents) if packing.eos_id is not None else 0)
    extra = 1 if packing.labels is not None else 0
    assert index.tokens == total
    assert index.windows == max(0, (total - extra) // packing.seq_len)
    assert 0 <= index.dropped_tokens - extra < packing.seq_len or index.windows == 0
    if not windows:
        return
    # window -> (first document, offset): the token at w*L is that document's token at offset
    _, owner, inside = reference_stream(documents, packing.eos_id)
    first, offset = index.locate(np.array(windows))
    assert first.tolist() == [owner[w * packing.seq_len] for w in windows]
    assert offset.tolist() == [inside[w * packing.seq_len] for w in windows]

    got = packed(documents, packing, windows)
    want = reference_batch(documents, packing, windows)
    assert got["input_ids"].dtype == torch.int64 and got["input_ids"].shape == (len(windows), packing.seq_len)
    assert got["input_ids"].tolist() == want["input_ids"]
    assert got["position_ids"].tolist() == want["position_ids"]
    assert got["document_ids"].dtype == torch.int32 and got["document_ids"].tolist() == want["document_ids"]
    if packing.labels is None:
        assert "labels" not in got
    else:
        assert got["labels"].tolist() == want["labels"]
    assert got["cu_seqlens"].dtype == torch.int32 and got["cu_seqlens"].tolist() == want["cu_seqlens"]
    pieces = np.diff(want["cu_seqlens"])
    assert got["max_seqlen"].dtype == torch.int64 and got["max_seqlen"].ndim == 0
    assert int(got["max_seqlen"]) == int(pieces.max())


def test_the_documents_of_windows_are_exactly_those_they_span() -> None:
    packing = TokenPacking(seq_len=4, labels="document")
    index = DocumentIndex.from_counts(packing, np.array([3, 0, 0, 9, 1, 1, 2]))  # 16 tokens, 3 windows
    assert index.windows == 3 and index.dropped_tokens == 4
    # window 0 reads tokens 0..4 (the 5th is the last target): documents 0 (3 tokens) and 3
    assert index.documents_of(np.array([0])).tolist() == [0, 1, 2, 3]
    assert index.documents_of(np.array([2])).tolist() == [3, 4]  # tokens 8..12
    assert index.documents_of(np.array([2, 0])).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"seq_len": 0}, "packing.seq_len"),
        ({"labels": "next"}, "packing.labels"),
        ({"eos_id": -1}, "packing.eos_id"),
        ({"column": ""}, "packing.column"),
        ({"lengths_column": 3}, "packing.lengths_column"),
        ({"ignore_index": 1.5}, "packing.ignore_index"),
    ],
)
def test_bad_packing_arguments_raise_config_error(kwargs, param) -> None:
    with pytest.raises(ConfigError) as error:
        TokenPacking(**kwargs)
    assert error.value.param == param


# -- real reads ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokens_dataset(tmp_path_factory) -> tuple[str, np.ndarray]:
    return write_token_dataset(tmp_path_factory.mktemp("packing") / "docs.lance", 300, fragment_rows=70)


def epoch_batches(uri: str, packing: TokenPacking, shuffle, world_size: int = 1, *, filter=None, epoch=0, batch=4):
    dm = LanceDataModule(
        train=LanceSource(uri, columns=["tokens", "n_tokens"], filter=filter),
        packing=packing,
        shuffle=shuffle,
        batch_size=batch,
        drop_last=False,
        reader_threads=1,
    )
    dm.setup("fit")
    plan = dm.plans["train"]
    ranks = []
    for rank in range(world_size):
        dataset = LanceIterableDataset(plan, world_size=world_size, rank=rank, reader_threads=1)
        dataset.set_epoch(epoch)
        ranks.append(list(dataset))
    return plan, ranks


@pytest.mark.parametrize(
    "shuffle",
    [NoShuffle(), ShardShuffle(shard_rows=8, seed=1), RowShuffle(seed=2), BufferShuffle(buffer_rows=16, shard_rows=4)],
    ids=repr,
)
@pytest.mark.parametrize("labels", ["document", "stream", None])
def test_every_window_of_an_epoch_is_read_once_and_equals_the_reference(tokens_dataset, shuffle, labels) -> None:
    uri, counts = tokens_dataset
    documents = _documents(counts)
    packing = TokenPacking(seq_len=16, labels=labels, lengths_column="n_tokens")
    plan, ranks = epoch_batches(uri, packing, shuffle, world_size=2)
    assert len(ranks[0]) == len(ranks[1])  # equal batches per rank
    keys = {"input_ids", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"} | ({"labels"} if labels else set())
    seen = []
    for batches in ranks:
        for batch in batches:
            assert set(batch) == keys
            windows = (batch["input_ids"][:, 0] // 16).tolist()  # token t of the stream has id t
            want = reference_batch(documents, packing, windows)
            for key in keys - {"max_seqlen"}:
                assert batch[key].tolist() == want[key], key
            seen += windows
    # drop_last=False on 2 ranks: every window once, plus at most one padding repeat
    assert sorted(set(seen)) == list(range(plan.matched_rows)) and len(seen) - plan.matched_rows < 2
    assert plan.matched_rows == (int(counts.sum()) - (1 if labels else 0)) // 16
    if isinstance(shuffle, NoShuffle):
        assert [w for batch in ranks[0][:1] for w in (batch["input_ids"][:, 0] // 16).tolist()] == [0, 1, 2, 3]
    else:
        assert seen[: len(seen) // 2] != sorted(seen[: len(seen) // 2])


def _documents(counts: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(counts)
    return [list(range(int(e - c), int(e))) for c, e in zip(counts, ends)]


def test_a_filter_packs_only_the_matching_documents_in_storage_order(tokens_dataset) -> None:
    uri, counts = tokens_dataset
    packing = TokenPacking(seq_len=8, lengths_column="n_tokens", eos_id=0)
    plan, ranks = epoch_batches(uri, packing, RowShuffle(seed=3), filter="topic = 1 OR topic = 3")
    matching = [d for i, d in enumerate(_documents(counts)) if (i * 4 // len(counts)) in (1, 3)]
    tokens, _, _ = reference_stream(matching, 0)
    windows = (len(tokens) - 1) // 8
    assert plan.matched_rows == windows and plan.documents.documents == len(matching)
    got = sorted(tuple(row) for batch in ranks[0] for row in batch["input_ids"].tolist())
    assert got == sorted(tuple(tokens[w * 8 : w * 8 + 8]) for w in range(windows))
    assert "tail: " in plan.explain() and "per epoch not trained" in plan.explain()


def test_counting_tokens_without_a_lengths_column_gives_the_same_windows(tokens_dataset) -> None:
    uri, _ = tokens_dataset
    with_lengths, a = epoch_batches(uri, TokenPacking(seq_len=16, lengths_column="n_tokens"), RowShuffle(seed=5))
    counted, b = epoch_batches(uri, TokenPacking(seq_len=16), RowShuffle(seed=5))
    assert np.array_equal(with_lengths.documents.starts, counted.documents.starts)
    assert all(x["input_ids"].tolist() == y["input_ids"].tolist() for x, y in zip(a[0], b[0]))


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("packing", "param", "words"),
    [
        (TokenPacking(column="text"), "packing.column", "no such column"),
        (TokenPacking(column="id"), "packing.column", "not a list of integers"),
        (TokenPacking(lengths_column="count"), "packing.lengths_column", "no such column"),
        (TokenPacking(lengths_column="tokens"), "packing.lengths_column", "not an integer"),
        (TokenPacking(seq_len=100_000), "packing.seq_len", "less than one window"),
    ],
)
def test_bad_packing_columns_raise_config_error_at_setup(tokens_dataset, packing, param, words) -> None:
    uri, _ = tokens_dataset
    dm = LanceDataModule(train=LanceSource(uri), packing=packing)
    with pytest.raises(ConfigError) as error:
        dm.setup("fit")
    assert error.value.param == param and words in str(error.value)


def test_a_list_of_floats_is_not_a_token_column(tmp_path) -> None:
    import lance

    lance.write_dataset(pa.table({"tokens": pa.array([[0.5, 1.5]] * 4, pa.list_(pa.float32()))}), tmp_path / "f")
    dm = LanceDataModule(train=LanceSource(str(tmp_path / "f")), packing=TokenPacking(seq_len=2))
    with pytest.raises(ConfigError, match="not a list of integers"):
        dm.setup("fit")


def test_a_lengths_column_that_disagrees_with_the_tokens_raises_naming_the_row(tmp_path) -> None:
    import lance

    table = pa.table({"tokens": pa.array([[1, 2, 3], [4, 5], [6]], pa.list_(pa.int32())), "n": pa.array([3, 3, 1])})
    lance.write_dataset(table, tmp_path / "w")
    dm = LanceDataModule(
        train=LanceSource(str(tmp_path / "w")), packing=TokenPacking(seq_len=2, lengths_column="n"), batch_size=1
    )
    dm.setup("fit")
    with pytest.raises(DataReadError, match="dataset row 1 .* holds 2 token"):
        list(LanceIterableDataset(dm.plans["train"], reader_threads=0))


def test_a_cursor_of_other_packing_settings_is_refused_naming_the_field(tokens_dataset) -> None:
    from lance_lightning import CursorMismatchError
    from lance_lightning.cursor.tracker import CursorTracker

    uri, _ = tokens_dataset
    saved_plan, _ = epoch_batches(uri, TokenPacking(seq_len=16, lengths_column="n_tokens"), RowShuffle(seed=1))
    other, _ = epoch_batches(
        uri, TokenPacking(seq_len=16, lengths_column="n_tokens", labels="stream"), RowShuffle(seed=1)
    )
    tracker = CursorTracker(saved_plan)
    tracker.begin_epoch(0, 1, 0)
    tracker.loop.on_yield()
    state = tracker.state()
    assert state["plan"]["packing"]["seq_len"] == 16 and state["rows_consumed"] == 4  # windows
    CursorTracker(saved_plan).restore(state)
    with pytest.raises(CursorMismatchError, match="plan.packing"):
        CursorTracker(other).restore(state)


def test_replacing_bad_rows_of_packed_windows_is_refused(tokens_dataset) -> None:
    from lance_lightning.produce.badrows import ReplaceBadRow

    with pytest.raises(ConfigError) as error:
        LanceDataModule(train=LanceSource(tokens_dataset[0]), packing=TokenPacking(), bad_rows=ReplaceBadRow())
    assert error.value.param == "bad_rows"
