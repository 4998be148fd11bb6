"""Pretraining batches: NSP pairs from the shards, new masks every epoch, a resumable order.

Everything random is drawn from generators seeded by (seed, epoch, shard or batch), so the
batch at any (epoch, index) can be rebuilt exactly: resuming needs only that position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from ..errors import BertkitError
from ..tokenizer import WordPieceTokenizer
from .masking import MaskingConfig, mask_tokens
from .nsp import Instances, make_instances
from .shards import TokenStore

MIX_SHARDS = 8  # shards whose sentence pairs are shuffled together (the memory held: their instances)


@dataclass
class Position:
    epoch: int = 0
    batch: int = 0  # batches of this epoch already consumed


class PretrainingBatches:
    def __init__(self, store: TokenStore, tokenizer: WordPieceTokenizer, max_len: int, batch_size: int,
                 masking: MaskingConfig, seed: int, short_seq_prob: float = 0.1, drop_last: bool = True):
        if max_len < 5:
            raise BertkitError(f"max length {max_len} is too small for [CLS] A [SEP] B [SEP] "
                               "(needs at least 5 tokens)")
        self.store, self.max_len, self.batch_size = store, max_len, batch_size
        self.masking, self.seed, self.short_seq_prob, self.drop_last = masking, seed, short_seq_prob, drop_last
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = (
            tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id)
        vocab = tokenizer.tok.get_vocab()
        specials = set(tokenizer.special_ids())
        self.random_ids = np.array(sorted(i for t, i in vocab.items()
                                          if i not in specials and not (t.startswith("[") and t.endswith("]"))))
        self.continuation = np.zeros(tokenizer.vocab_size, dtype=bool)
        for t, i in vocab.items():
            self.continuation[i] = t.startswith("##")
        self._cache: dict[tuple[int, int], Instances] = {}

    # ---- one epoch's instances, mixed across shards ----
    def _shard_instances(self, epoch: int, s: int) -> Instances:
        return make_instances(self.store.shard(s), self.max_len, np.random.default_rng([self.seed, epoch, s, 0]),
                              self.short_seq_prob)

    def _epoch_rows(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(shard, instance) index pairs of one epoch, in training order: the shards in a random
        order, MIX_SHARDS at a time pooled and shuffled together, so that a batch draws from many
        shards (a corpus's files often follow a topic or a source) while memory holds only the
        instances of MIX_SHARDS shards. Every instance comes exactly once."""
        order = np.random.default_rng([self.seed, epoch, 2]).permutation(len(self.store))
        for k in range(0, len(order), MIX_SHARDS):
            group = [int(s) for s in order[k:k + MIX_SHARDS]]
            sizes = [len(self._instances(epoch, s)) for s in group]
            shard = np.repeat(np.array(group, dtype=np.int64), sizes)
            index = np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, np.int64)
            # one shard alone keeps the order it always had: [seed, epoch, shard, 1]
            perm = np.random.default_rng([self.seed, epoch, group[0] if len(group) == 1 else len(self.store) + k,
                                          1]).permutation(len(shard))
            yield shard[perm], index[perm]

    def _instances(self, epoch: int, s: int) -> Instances:
        """The instances of shard s in this epoch (cached for the epoch being read)."""
        key = (epoch, s)
        if key not in self._cache:
            if len(self._cache) >= 2 * MIX_SHARDS:
                self._cache.clear()
            self._cache[key] = self._shard_instances(epoch, s)
        return self._cache[key]

    def _epoch_batches(self, epoch: int) -> Iterator[list[tuple[int, Instances]]]:
        """Groups of (shard, instances) that make one batch each; a batch spans shards."""
        shard_ids, index_ids = [], []
        size = 0
        for shards, indices in self._epoch_rows(epoch):
            start = 0
            while start < len(shards):
                take = min(self.batch_size - size, len(shards) - start)
                shard_ids.append(shards[start:start + take])
                index_ids.append(indices[start:start + take])
                size += take
                start += take
                if size == self.batch_size:
                    yield self._group(epoch, np.concatenate(shard_ids), np.concatenate(index_ids))
                    shard_ids, index_ids, size = [], [], 0
        if size and not self.drop_last:
            yield self._group(epoch, np.concatenate(shard_ids), np.concatenate(index_ids))

    def _group(self, epoch: int, shards: np.ndarray, indices: np.ndarray) -> list[tuple[int, Instances]]:
        """A batch's rows grouped by shard (a stable sort: one shard keeps its order)."""
        order = np.argsort(shards, kind="stable")
        shards, indices = shards[order], indices[order]
        cuts = np.flatnonzero(np.diff(shards)) + 1
        return [(int(sh[0]), self._instances(epoch, int(sh[0])).take(ix))
                for sh, ix in zip(np.split(shards, cuts), np.split(indices, cuts))]

    def iterate(self, start: Position | None = None) -> Iterator[tuple[Position, dict]]:
        """Endless batches from `start` (default: the first); yields (position after this batch, batch)."""
        start = start or Position()
        epoch, skip = start.epoch, start.batch
        while True:
            n = 0
            for index, group in enumerate(self._epoch_batches(epoch)):
                n += 1
                if index < skip:
                    continue  # rebuilding the order is cheap; only skipped batches' tokens are never read
                yield Position(epoch, index + 1), self.build(group, np.random.default_rng([self.seed, epoch, index, 3]))
            if n == 0:
                raise BertkitError(f"the corpus makes fewer sentence pairs of {self.max_len} tokens than one batch "
                                   f"of {self.batch_size}; lower --batch-size or add text (a first phase on "
                                   "shorter pairs runs batches as many times larger: --short-len 0 runs none)")
            epoch, skip = epoch + 1, 0

    def fixed_batches(self, n_batches: int) -> list[dict]:
        """The first batches of epoch 0, partial last batch kept: a fixed evaluation set."""
        out = []
        for index, group in enumerate(self._epoch_batches(0)):
            if index >= n_batches:
                break
            out.append(self.build(group, np.random.default_rng([self.seed, 0, index, 3])))
        return out

    def count_pairs(self, epoch: int = 0) -> int:
        return sum(len(self._shard_instances(epoch, s)) for s in range(len(self.store)))

    # ---- tokens -> tensors ----
    def build(self, group: list[tuple[int, Instances]], rng: np.random.Generator) -> dict:
        rows = []
        nsp = []
        for s, inst in group:
            tokens = self.store.shard(s).tokens
            for a0, a1, b0, b1 in zip(inst.a_start, inst.a_end, inst.b_start, inst.b_end):
                rows.append((tokens[a0:a1], tokens[b0:b1]))
            nsp.append(inst.is_random)
        B = len(rows)
        lengths = np.array([len(a) + len(b) + 3 for a, b in rows])
        T = int(lengths.max())
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        types = np.zeros((B, T), dtype=np.int64)
        special = np.ones((B, T), dtype=bool)  # [CLS], [SEP] and padding: never masked
        for r, (a, b) in enumerate(rows):
            la, lb = len(a), len(b)
            ids[r, 0] = self.cls_id
            ids[r, 1:1 + la] = a
            ids[r, 1 + la] = self.sep_id
            ids[r, 2 + la:2 + la + lb] = b
            ids[r, 2 + la + lb] = self.sep_id
            types[r, 2 + la:3 + la + lb] = 1
            special[r, 1:1 + la] = special[r, 2 + la:2 + la + lb] = False
        masked = mask_tokens(ids, special, rng, self.masking, self.mask_id, self.random_ids, self.continuation)
        return {
            "input_ids": torch.from_numpy(masked.input_ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy((np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)),
            "mlm_positions": torch.from_numpy(masked.positions),
            "mlm_labels": torch.from_numpy(masked.labels),
            "nsp_labels": torch.from_numpy(np.concatenate(nsp)),
        }
