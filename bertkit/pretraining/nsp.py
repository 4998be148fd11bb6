"""Sentence pairs for next sentence prediction, as BERT's create_pretraining_data.py makes them.

Sentences of a document are gathered into a chunk up to a target length (the max length less
the three special tokens; 10% of the time a shorter random target, so the model also sees short
inputs). The chunk is split at a random sentence boundary into A and B; half the time B is
replaced by a span from a different document (IsNext vs NotNext). The longer side is then
trimmed, one token at a time from a random end, until the pair fits. Instances are spans of the
shard's flat token array, so they cost a few integers each.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shards import Shard


@dataclass
class Instances:
    a_start: np.ndarray    # token offsets of segment A, [a_start, a_end)
    a_end: np.ndarray
    b_start: np.ndarray    # token offsets of segment B
    b_end: np.ndarray
    is_random: np.ndarray  # 1 = B comes from another document (NotNext), 0 = B follows A
    a_doc: np.ndarray      # document of A and of B (for tests and inspection)
    b_doc: np.ndarray
    a_sentences: np.ndarray  # (N, 2) sentence range of A before trimming
    b_sentences: np.ndarray  # (N, 2) sentence range of B before trimming

    def __len__(self) -> int:
        return len(self.a_start)

    def take(self, idx: np.ndarray) -> "Instances":
        return Instances(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))


def make_instances(shard: Shard, max_len: int, rng: np.random.Generator,
                   short_seq_prob: float = 0.1) -> Instances:
    max_tokens = max_len - 3  # [CLS] A [SEP] B [SEP]
    sent_len = np.diff(shard.sentences)
    docs = shard.documents
    n_docs = len(docs) - 1
    rows = []
    for d in range(n_docs):
        first, last = int(docs[d]), int(docs[d + 1])
        target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
        chunk_start, length, i = first, 0, first
        while i < last:
            length += int(sent_len[i])
            if i == last - 1 or length >= target:
                n = i + 1 - chunk_start
                a_end = chunk_start + (1 if n < 2 else int(rng.integers(1, n)))
                a_len = int(shard.sentences[a_end] - shard.sentences[chunk_start])
                if n == 1 or rng.random() < 0.5:
                    # NotNext: B from another document, as long as A leaves room for
                    other = int(rng.integers(0, n_docs - 1))
                    other += other >= d
                    o_first, o_last = int(docs[other]), int(docs[other + 1])
                    b0 = int(rng.integers(o_first, o_last))
                    b1, b_len = b0, 0
                    while b1 < o_last and b_len < max(target - a_len, 1):
                        b_len += int(sent_len[b1])
                        b1 += 1
                    rows.append((chunk_start, a_end, b0, b1, 1, d, other))
                    i = a_end - 1  # the unused sentences of the chunk start the next one
                else:
                    rows.append((chunk_start, a_end, a_end, i + 1, 0, d, d))
                chunk_start, length = i + 1, 0
                target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
            i += 1
    if not rows:
        return Instances(*(np.zeros(0, dtype=np.int64) for _ in range(7)),
                         np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64))
    r = np.asarray(rows, dtype=np.int64)
    s = shard.sentences
    a0, a1, b0, b1 = s[r[:, 0]], s[r[:, 1]], s[r[:, 2]], s[r[:, 3]]
    a0, a1, b0, b1 = _trim(a0, a1, b0, b1, max_tokens, rng)
    return Instances(a0, a1, b0, b1, r[:, 4], r[:, 5], r[:, 6], r[:, 0:2], r[:, 2:4])


def _trim(a0, a1, b0, b1, max_tokens, rng):
    """Trim the longer side first until A + B fits; each removed token comes off the front or
    the back at random (vectorised: the split between the ends is binomial)."""
    la, lb = a1 - a0, b1 - b0
    excess = np.maximum(la + lb - max_tokens, 0)
    # longest first: cut the longer down toward the shorter, then alternate (ties favour B)
    gap = np.abs(la - lb)
    first_cut = np.minimum(excess, gap)
    rest = excess - first_cut
    cut_a = np.where(la > lb, first_cut, 0) + rest // 2
    cut_b = excess - cut_a
    front_a = rng.binomial(cut_a, 0.5)
    front_b = rng.binomial(cut_b, 0.5)
    return a0 + front_a, a1 - (cut_a - front_a), b0 + front_b, b1 - (cut_b - front_b)
