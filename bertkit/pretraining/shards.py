"""Tokenized corpora as sharded, memory-mapped token files.

A corpus is tokenized once. Each shard holds whole documents:
  shard_NNNNN.tokens.npy     flat token ids (uint16 when the vocabulary fits, else uint32)
  shard_NNNNN.sentences.npy  int64 start offset of each sentence in the tokens, plus the end
  shard_NNNNN.documents.npy  int64 first sentence of each document, plus the end
and meta.json says how many shards and what vocabulary made them. Reading maps the token files
(np.load mmap_mode="r"), so a corpus larger than memory trains with flat memory use.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import BertkitError
from ..tokenizer import WordPieceTokenizer
from .corpus import TrainOnly

FORMAT = 1


@dataclass
class Shard:
    tokens: np.ndarray      # (n_tokens,) memory-mapped
    sentences: np.ndarray   # (n_sentences + 1,) token offsets
    documents: np.ndarray   # (n_documents + 1,) sentence offsets


def vocab_fingerprint(tokenizer: WordPieceTokenizer) -> str:
    return hashlib.sha256(tokenizer.tok.to_str().encode()).hexdigest()[:16]


class ShardWriter:
    """Accumulates tokenized documents and writes a shard whenever `shard_tokens` is reached.

    A shard is written only once the next one has started, so a short tail (fewer than two
    documents: no random NSP partner within it) can be merged into the shard before it."""

    def __init__(self, folder: Path, dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = folder, dtype, shard_tokens
        self.pending: list[list[np.ndarray]] | None = None   # a full shard not yet written
        self.current: list[list[np.ndarray]] = []            # documents, each a list of sentences
        self.current_tokens = 0
        self.n_shards = self.n_documents = self.n_sentences = self.n_tokens = 0

    def add(self, doc: list[np.ndarray]) -> None:
        self.current.append(doc)
        self.current_tokens += sum(len(s) for s in doc)
        self.n_documents += 1
        self.n_sentences += len(doc)
        self.n_tokens += sum(len(s) for s in doc)
        if self.current_tokens >= self.shard_tokens and len(self.current) >= 2:
            if self.pending is not None:
                self._write(self.pending)
            self.pending, self.current, self.current_tokens = self.current, [], 0

    def close(self) -> None:
        if self.pending is not None and len(self.current) < 2:
            self.pending, self.current = self.pending + self.current, []
        for docs in (self.pending, self.current):
            if docs:
                self._write(docs)

    def _write(self, docs: list[list[np.ndarray]]) -> None:
        sentences = [s for d in docs for s in d]
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        base = self.folder / f"shard_{self.n_shards:05d}"
        np.save(f"{base}.tokens.npy", np.concatenate(sentences).astype(self.dtype, copy=False))
        np.save(f"{base}.sentences.npy", np.concatenate([[0], np.cumsum(lengths)]))
        np.save(f"{base}.documents.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64))
        self.n_shards += 1


def held_out(n: int, holdout_every: int) -> bool:
    """Whether the n-th counted document (0-based; TrainOnly ones are not counted) is held out."""
    return bool(holdout_every) and n % holdout_every == holdout_every // 2


def training_documents(documents: Iterable[list[str]], holdout_every: int) -> Iterable[list[str]]:
    """The documents tokenize_corpus trains on, before there is a vocabulary: for training one
    on them alone (trained on every document, it had pieces of words only held-out text holds,
    which flattered the held-out figures). A document counts, as there, when some sentence has
    text left after BERT's normalisation (the pieces of such text are never empty)."""
    from tokenizers import normalizers
    # as the vocabulary pretraining trains normalises (uncased: accents stripped, so a sentence of
    # combining marks alone is empty)
    normalize = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                           lowercase=True).normalize_str
    n = 0
    for doc in documents:
        if isinstance(doc, TrainOnly):
            yield doc
        elif any(normalize(s).strip() for s in doc):
            if not held_out(n, holdout_every):
                yield doc
            n += 1


def tokenize_corpus(documents: Iterable[list[str]], tokenizer: WordPieceTokenizer, folder: str | Path,
                    holdout_every: int = 20, shard_tokens: int = 10_000_000,
                    encode_batch: int = 2000) -> tuple["TokenStore", "TokenStore"]:
    """Tokenize documents (lists of sentences) once into folder/train and folder/eval shards.

    Every `holdout_every`-th document (0: none) is held out for evaluation, counting only those
    that are not TrainOnly (the held-out set of "wiki" and of "wiki+python-docs" is the same).
    The folder is written under a temporary name and renamed when complete."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32
    writers = {}
    for split in ("train", "eval"):
        (tmp / split).mkdir(parents=True)
        writers[split] = ShardWriter(tmp / split, dtype, shard_tokens)
    buffer: list[list[str]] = []
    n_docs = 0

    def flush():
        nonlocal n_docs
        flat = [s for d in buffer for s in d]
        encs = tokenizer.tok.encode_batch(flat, add_special_tokens=False) if flat else []
        i = 0
        for d in buffer:
            ids = [np.asarray(e.ids, dtype=dtype) for e in encs[i:i + len(d)]]
            i += len(d)
            ids = [s for s in ids if len(s)]  # a sentence of only unknown characters may vanish
            if ids and isinstance(d, TrainOnly):  # added text: trained on, never held out
                writers["train"].add(ids)
            elif ids:
                writers["eval" if held_out(n_docs, holdout_every) else "train"].add(ids)
                n_docs += 1
        buffer.clear()

    tokenizer.tok.no_truncation()
    # "[MASK]" or "[SEP]" written in the text is text, split as BERT's create_pretraining_data
    # splits it: as the special ids they sat unpredicted inside segments and were drawn as labels
    split_specials = tokenizer.tok.encode_special_tokens
    tokenizer.tok.encode_special_tokens = True
    try:
        pending = 0
        for doc in documents:
            buffer.append(doc)
            pending += len(doc)
            if pending >= encode_batch:
                flush()
                pending = 0
        flush()
    finally:  # fill-mask and the samples read "[MASK]" as the token
        tokenizer.tok.encode_special_tokens = split_specials
    for split, w in writers.items():
        w.close()
        meta = dict(format=FORMAT, vocab=vocab_fingerprint(tokenizer), vocab_size=tokenizer.vocab_size,
                    dtype=np.dtype(dtype).name, shards=w.n_shards, documents=w.n_documents,
                    sentences=w.n_sentences, tokens=w.n_tokens)
        (tmp / split / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return TokenStore(folder / "train"), TokenStore(folder / "eval")


def _shard_problem(shard: Shard, vocab_size: int | None = None) -> str | None:
    """What makes a shard's three arrays disagree (a token file cut short still loads, and its
    pairs would be silently short), or a token id past the vocabulary (a file overwritten in
    place: an IndexError in the embeddings), or None."""
    t, s, d = shard.tokens, shard.sentences, shard.documents
    if t.ndim != 1 or s.ndim != 1 or d.ndim != 1 or len(s) < 2 or len(d) < 2:
        return "not the 1-D arrays of a shard"
    if s[0] != 0 or s[-1] != len(t):
        return f"the sentences end at token {int(s[-1])} of {len(t)}"
    if d[0] != 0 or d[-1] != len(s) - 1:
        return f"the documents end at sentence {int(d[-1])} of {len(s) - 1}"
    if vocab_size is not None and len(t) and int(t.max()) >= vocab_size:
        return f"token id {int(t.max())} is past the vocabulary's {vocab_size}"
    return None


class TokenStore:
    """A written shard folder, opened read-only with memory-mapped tokens."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        try:
            self.meta = json.loads((self.folder / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise BertkitError(f"{self.folder}: not a token shard folder ({e})") from None
        if self.meta.get("format") != FORMAT:
            raise BertkitError(f"{self.folder}: shard format {self.meta.get('format')} is not {FORMAT}")
        self._open: dict[int, Shard] = {}

    def __len__(self) -> int:
        return self.meta["shards"]

    def shard(self, i: int) -> Shard:
        if i not in self._open:
            if len(self._open) >= 4:  # keep a few shards mapped; batches may span two
                self._open.pop(next(iter(self._open)))
            base = self.folder / f"shard_{i:05d}"
            try:
                shard = Shard(*(np.load(f"{base}.{part}.npy", mmap_mode="r")
                                for part in ("tokens", "sentences", "documents")))
                problem = _shard_problem(shard, self.meta.get("vocab_size"))
            except (OSError, ValueError, EOFError) as e:  # numpy's errors, from the batch thread
                problem = str(e)
            if problem:
                raise BertkitError(f"{base}: damaged or missing ({problem}); delete {self.folder.parent} "
                                   "to tokenize the corpus again")
            self._open[i] = shard
        return self._open[i]

    def matches(self, tokenizer: WordPieceTokenizer) -> bool:
        return self.meta.get("vocab") == vocab_fingerprint(tokenizer)
