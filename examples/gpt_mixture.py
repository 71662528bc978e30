"""GPT pretraining example: two local corpora (code and prose), one BPE tokenizer, a small GPT.

Guarantees: :func:`prepare` needs no network. For one Python installation and one environment
(the packages ``uv.lock`` pins) it writes the same files every time:

* ``code``: the ``.py`` sources of the standard library (``examples.lm_pretrain.stdlib_files``);
* ``prose``: English text shipped with Python and the installed packages: the topic texts of
  ``pydoc_data.topics`` (the language reference ``help()`` shows) and the ``LICENSE*``,
  ``*.md``, ``*.rst`` and ``METADATA`` (package descriptions) files under ``site-packages``
  (except this project's own, whose description is its README).

Each corpus is cut into documents (consecutive whole lines, at most ``DOC_BYTES`` bytes), thinned
evenly to at most ``max_bytes``; every ``VAL_EVERY``-th document goes to the validation set. One
byte-level BPE tokenizer (HF ``tokenizers``) is trained on the train documents of both corpora
and saved as ``tokenizer.json``; its token 0 is ``<|endoftext|>`` (``EOS_ID``). Written under
``out_dir``:

* ``code.lance``, ``prose.lance`` (train) and ``val.lance`` (both corpora, column ``corpus``),
  each with ``tokens`` (list<int32>), ``n_tokens`` (int32) and ``path`` (string: where the
  document comes from, ``<file>#<chunk>``);
* ``tokenizer.json``.

An existing complete output is left alone (idempotent); :class:`GPT` trains on the packed
batches of ``TokenPacking`` (see ``configs/gpt_mixture.yaml``).

With ``ray=True`` (``--ray``; needs the ``ray`` extra: ``uv sync --extra ray``) the tokenize-and-write
step runs on Ray Data and lance-ray writes the datasets: the same rows in the same order as the
default single-process path (``tests/scenarios/test_ray.py``); the tokenizer is trained as before.
Without the extra, ``ray=True`` raises `RayExtraMissing` (``--ray``: one line, exit status 1)
before anything is written, so the same command without ``--ray`` then runs. The default path
imports nothing of Ray.

Usage::

    python examples/gpt_mixture.py [OUT_DIR] [--max-bytes N] [--vocab-size V] [--ray]   # default data/gpt
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):  # run as a script: make the `examples` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.lm_pretrain import chunk_lines, stdlib_files

__all__ = ["EOS_ID", "GPT", "RayExtraMissing", "code_documents", "prepare", "prose_documents"]

DEFAULT_OUT = "data/gpt"
EOS = "<|endoftext|>"
EOS_ID = 0
DOC_BYTES = 2048
VAL_EVERY = 20
DATASETS = ("code", "prose", "val")
_COLUMNS = ("tokens", "n_tokens", "path")
_PROSE_NAMES = ("LICENSE*", "*.md", "*.rst", "METADATA")
RAY_DOCS_PER_FILE = 1024  # --ray: documents per write task and Lance data file, at least (the last one fewer)

Document = tuple[str, str]  # (path#chunk, text)


def _documents(files: list[tuple[str, bytes]]) -> Iterator[Document]:
    for name, data in files:
        for index, chunk in enumerate(chunk_lines(data, DOC_BYTES)):
            text = chunk.decode("utf-8", errors="replace")
            if text.strip():
                yield f"{name}#{index}", text


def code_documents() -> list[Document]:
    """The standard library's sources as documents, in path order."""
    root, files = stdlib_files()
    return list(_documents([(f"stdlib/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in files]))


def prose_documents() -> list[Document]:
    """pydoc's topic texts, then the packages' licences, READMEs and descriptions, in path order."""
    from pydoc_data.topics import topics

    files = [(f"pydoc_data/topics/{name}", topics[name].encode()) for name in sorted(topics)]
    site = Path(sysconfig.get_paths()["purelib"])
    found = sorted(
        {
            p
            for pattern in _PROSE_NAMES
            for p in site.rglob(pattern)
            if p.is_file() and not p.relative_to(site).parts[0].startswith("lance_lightning")  # our README changes
        }
    )
    for path in found:
        data = path.read_bytes()
        if path.name == "METADATA":  # the description follows the e-mail style headers
            data = data.partition(b"\n\n")[2]
        files.append((f"site-packages/{path.relative_to(site).as_posix()}", data))
    return list(_documents(files))


def _thin(documents: list[Document], max_bytes: int | None) -> list[Document]:
    """At most ``max_bytes`` of ``documents``: every k-th one, spread evenly over the order."""
    total = sum(len(text) for _, text in documents)
    if max_bytes is None or total <= max_bytes:
        return documents
    stride = -(-total // max_bytes)
    return documents[::stride]


def _complete(out_dir: Path) -> bool:
    import lance

    if not (out_dir / "tokenizer.json").is_file():
        return False
    for name in DATASETS:
        try:
            if not set(_COLUMNS) <= set(lance.dataset(str(out_dir / f"{name}.lance")).schema.names):
                return False
        except Exception:  # noqa: BLE001 - anything that is not a readable dataset
            return False
    return True


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (``tokenizers.Tokenizer``) trained on ``texts``; token 0 is ``EOS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _table(tokenizer, documents: list[Document], corpus: str | None = None):
    import numpy as np
    import pyarrow as pa

    encoded = [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch([text for _, text in documents])]
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    values = np.concatenate(encoded) if encoded else np.zeros(0, np.int32)
    columns = {
        "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32())),
        "n_tokens": pa.array(lengths),
        "path": pa.array([name for name, _ in documents], pa.string()),
    }
    if corpus is not None:
        columns["corpus"] = pa.array([corpus] * len(documents), pa.string())
    return pa.table(columns)


def prepare(
    out_dir: str = DEFAULT_OUT,
    *,
    max_bytes: int | None = 4_000_000,
    vocab_size: int = 4096,
    overwrite: bool = False,
    ray: bool = False,
) -> str:
    """Write the tokenizer and the code, prose and val datasets under ``out_dir``; return ``out_dir``.

    Args:
        max_bytes: Text per corpus, at most (documents are thinned evenly); ``None``: all of it.
        vocab_size: BPE vocabulary size (the 256 bytes and ``EOS`` included).
        overwrite: Rewrite an existing output.
        ray: Tokenize and write on Ray Data with lance-ray (the ``ray`` extra), on the running Ray
            instance or a local one that Ray Data starts.

    Idempotent: if ``out_dir`` already holds a complete output and ``overwrite`` is False, nothing
    is written (whatever the other arguments say).

    Raises:
        FileExistsError: ``out_dir`` is not empty but not a complete output, and ``overwrite`` is False.
        RayExtraMissing: ``ray`` is True and Ray Data or lance-ray cannot be imported (nothing is written).
    """
    import lance
    import pyarrow as pa

    path = Path(out_dir)
    if not overwrite and path.exists() and any(path.iterdir()):
        if _complete(path):
            return os.fspath(out_dir)
        raise FileExistsError(
            f"{os.fspath(out_dir)!r} is not empty but not this example's output "
            f"(tokenizer.json, {', '.join(f'{n}.lance' for n in DATASETS)}); "
            "remove it, choose another directory, or pass overwrite=True"
        )
    if ray:
        _check_ray_extra(out_dir)  # before anything is written: a failed --ray run leaves no half output
    path.mkdir(parents=True, exist_ok=True)
    corpora = {"code": _thin(code_documents(), max_bytes), "prose": _thin(prose_documents(), max_bytes)}
    train = {name: [d for i, d in enumerate(docs) if i % VAL_EVERY] for name, docs in corpora.items()}
    val = {name: docs[::VAL_EVERY] for name, docs in corpora.items()}
    tokenizer = train_tokenizer([text for docs in train.values() for _, text in docs], vocab_size)
    tokenizer.save(str(path / "tokenizer.json"))
    if ray:
        val_rows = [(document, corpus) for corpus, docs in val.items() for document in docs]
        datasets = {name: [(document, None) for document in docs] for name, docs in train.items()}
        _write_on_ray(tokenizer, {**datasets, "val": val_rows}, path, "overwrite" if overwrite else "create")
        return os.fspath(out_dir)
    tables = {name: _table(tokenizer, docs) for name, docs in train.items()}
    tables["val"] = pa.concat_tables([_table(tokenizer, docs, corpus) for corpus, docs in val.items()])
    for name, table in tables.items():
        lance.write_dataset(table, str(path / f"{name}.lance"), mode="overwrite" if overwrite else "create")
    return os.fspath(out_dir)


# -- the tokenize-and-write step on Ray Data (the `ray` extra) --------------------------------------
class RayExtraMissing(ImportError):
    """``--ray`` without the ``ray`` extra (Ray Data, lance-ray); raised before anything is written."""


def _check_ray_extra(out_dir: str) -> None:
    """Import what ``--ray`` uses, or raise `RayExtraMissing` saying what to install."""
    # Under `uv run`, Ray would start its local workers with `uv run` in a copy of this directory (a
    # new environment); they use this interpreter instead. Read when Ray is first imported.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import ray.data  # noqa: F401
        from lance_ray import write_lance  # noqa: F401
    except ImportError as error:
        raise RayExtraMissing(
            f"--ray needs Ray Data and lance-ray, which the `ray` extra installs: install `lance-lightning[ray]` "
            f"(`uv sync --extra ray` in this checkout, or `pip install 'lance-lightning[ray]'`), or run without "
            f"--ray. Nothing was written to {os.fspath(out_dir)!r}. ({type(error).__name__}: {error})"
        ) from error


def _tokenize_batch(batch, tokenizer_json: str):
    """A Ray Data batch (Arrow: ``path``, ``text``, ``corpus``) -> the rows :func:`_table` makes."""
    import pyarrow as pa
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    table = _table(tokenizer, list(zip(batch["path"].to_pylist(), batch["text"].to_pylist())))
    corpus = batch["corpus"].to_pylist()
    if any(c is not None for c in corpus):
        table = table.append_column("corpus", pa.array(corpus, pa.string()))
    return table


def _write_on_ray(tokenizer, datasets: dict[str, list[tuple[Document, str | None]]], path: Path, mode: str) -> None:
    """Tokenize each dataset's documents on Ray Data and write it with lance-ray, in document order."""
    _check_ray_extra(os.fspath(path))  # also sets Ray's environment before its first import
    import ray.data
    from lance_ray import write_lance

    context = ray.data.DataContext.get_current()
    preserve_order = context.execution_options.preserve_order
    context.execution_options.preserve_order = True  # the fragments are committed in the documents' order
    try:
        for name, rows in datasets.items():
            items = [{"path": doc_path, "text": text, "corpus": corpus} for (doc_path, text), corpus in rows]
            tokenized = ray.data.from_items(items).map_batches(
                _tokenize_batch, batch_format="pyarrow", batch_size=64, fn_kwargs={"tokenizer_json": tokenizer.to_str()}
            )
            schema = _table(tokenizer, [], "" if name == "val" else None).schema
            write_lance(
                tokenized, str(path / f"{name}.lance"), mode=mode, schema=schema, min_rows_per_file=RAY_DOCS_PER_FILE
            )
    finally:
        context.execution_options.preserve_order = preserve_order


# -- the model --------------------------------------------------------------------------------------
def rotate(x: torch.Tensor, position_ids: torch.Tensor, base: float = 10_000.0) -> torch.Tensor:
    """Rotary position embedding of ``x`` (B, H, L, D) at ``position_ids`` (B, L), D even."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = (position_ids[:, None, :, None].float() * inv_freq).to(x.dtype)  # (B, 1, L, D/2)
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """Attention mask (B, 1, L, L), True where position i may attend to j: j <= i, same document."""
    steps = document_ids.shape[1]
    causal = torch.ones(steps, steps, dtype=torch.bool, device=document_ids.device).tril()
    return ((document_ids[:, :, None] == document_ids[:, None, :]) & causal)[:, None]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention with rotary positions, then an MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, steps, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, position_ids), rotate(k, position_ids)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, steps, width))
        return x + self.mlp(self.norm2(x))


class GPT(L.LightningModule):
    """A small decoder-only transformer for packed token windows.

    Takes the batches ``TokenPacking`` makes: ``input_ids``, ``labels`` (next-token targets,
    ``ignore_index`` where the next token starts another document), ``position_ids`` (rotary
    positions: the token's index within its document) and ``document_ids`` (attention is causal
    and never crosses documents); a mixture's ``source`` is optional. Without ``document_ids``
    attention is causal over the whole window, without ``position_ids`` positions count from 0.

    Logs ``train/loss``, ``train/tokens_per_s`` (all ranks' tokens per second of wall time
    between steps), ``train/padding_fraction`` (share of labels equal to ``ignore_index``), with
    a ``source`` column ``train/mixture/<name>`` (share of the batch's samples from each source),
    and ``val/loss``.

    Args:
        vocab_size: Token ids are ``0..vocab_size-1``.
        d_model, n_heads, n_layers: Width (divisible by ``2 * n_heads``), heads, blocks.
        lr: AdamW learning rate.
        ignore_index: Label that the loss ignores.
        source_names: Names of the mixture's sources, in order (default ``source0``, ...).
    """

    def __init__(
        self,
        vocab_size: int = 4096,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        lr: float = 3e-3,
        ignore_index: int = -100,
        source_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        if d_model % (2 * n_heads):
            raise ValueError(f"`d_model` must be divisible by 2 * n_heads = {2 * n_heads}, got {d_model}")
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied embeddings
        nn.init.normal_(self.embed.weight, std=0.02)  # small logits at the start (loss near log(vocab_size))
        self._last_step_at: float | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits (B, L, vocab_size)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        if document_ids is None:
            document_ids = torch.zeros_like(input_ids)
        mask = document_mask(document_ids)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, mask)
        return self.head(self.norm(x))

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        logits = self(batch["input_ids"], batch.get("position_ids"), batch.get("document_ids"))
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=self.hparams.ignore_index
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        windows = int(batch["input_ids"].shape[0])
        self.log("train/loss", loss, prog_bar=True, batch_size=windows)
        padding = (batch["labels"] == self.hparams.ignore_index).float().mean()
        self.log("train/padding_fraction", padding, batch_size=windows)
        now = time.perf_counter()
        if self._last_step_at is not None:
            tokens = batch["input_ids"].numel() * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / (now - self._last_step_at), batch_size=windows)
        self._last_step_at = now
        if "source" in batch:
            names = self.hparams.source_names or []
            source = batch["source"].flatten()
            counts = torch.bincount(source, minlength=len(names)).float() / source.numel()
            for index, share in enumerate(counts):
                name = names[index] if index < len(names) else f"source{index}"
                self.log(f"train/mixture/{name}", share, batch_size=windows)
        return loss

    def on_train_epoch_start(self) -> None:
        self._last_step_at = None  # the time between epochs is not a step

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss = self._loss(batch)
        windows = int(batch["input_ids"].shape[0])
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=windows)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python examples/gpt_mixture.py",
        description="Build the code and prose token datasets and their BPE tokenizer (no network).",
    )
    parser.add_argument("out_dir", nargs="?", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--max-bytes", type=int, default=4_000_000, help="text per corpus, at most")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size")
    parser.add_argument("--ray", action="store_true", help="tokenize and write on Ray Data (the `ray` extra)")
    args = parser.parse_args(argv)
    try:
        out = prepare(args.out_dir, max_bytes=args.max_bytes, vocab_size=args.vocab_size, ray=args.ray)
    except (RayExtraMissing, FileExistsError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    import lance

    print(out)
    for name in DATASETS:
        lengths = lance.dataset(os.path.join(out, f"{name}.lance")).to_table(columns=["n_tokens"])["n_tokens"]
        print(f"{name}: {len(lengths):,} documents, {int(lengths.to_numpy().sum()):,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
