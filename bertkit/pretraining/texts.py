"""Single texts from the shards, for distillation: [CLS] text [SEP], where a text is a run of
consecutive sentences of one document packed up to a target length (the max length less the
two special tokens; short_seq_prob of the time a shorter random target, so the student also
sees short inputs). A sentence longer than its target is cut at the target.

The segmentation is drawn once from the seed, not anew each epoch: a text is then the same in
every epoch, so the teacher's outputs for it can be kept (distill.TeacherCache). Each epoch
shuffles the order; the masks for MLM beside distillation are drawn anew each epoch.
"""
from __future__ import annotations

import numpy as np
import torch

from .batches import PretrainingBatches
from .masking import mask_tokens
from .nsp import Instances
from .shards import Shard


def make_texts(shard: Shard, max_len: int, rng: np.random.Generator, short_seq_prob: float = 0.1) -> Instances:
    """The shard's texts as Instances with an empty segment B (b_start = b_end = a_end)."""
    max_tokens = max_len - 2  # [CLS] text [SEP]
    sent_len = np.diff(shard.sentences)
    docs = shard.documents
    rows = []

    def target() -> int:
        return max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
    for d in range(len(docs) - 1):
        first, last = int(docs[d]), int(docs[d + 1])
        start, length, goal = first, 0, target()
        for i in range(first, last):
            length += int(sent_len[i])
            nxt = int(sent_len[i + 1]) if i + 1 < last else 0
            if i == last - 1 or length + nxt > goal:  # the next sentence would not fit: the text ends here
                rows.append((start, i + 1, d, goal))
                start, length, goal = i + 1, 0, target()
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return Instances(z, z, z, z, z, z, z, np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64))
    r = np.asarray(rows, dtype=np.int64)
    a0 = shard.sentences[r[:, 0]].astype(np.int64)
    a1 = np.minimum(shard.sentences[r[:, 1]].astype(np.int64), a0 + r[:, 3])  # one long sentence: cut at the target
    zero = np.zeros(len(r), dtype=np.int64)
    return Instances(a0, a1, a1, a1, zero, r[:, 2], r[:, 2], r[:, 0:2], np.stack([r[:, 1], r[:, 1]], 1))


class TextBatches(PretrainingBatches):
    """Batches of single texts: input_ids as read (for the teacher and the student's distillation
    losses), and a masked copy (mlm_input_ids, mlm_positions, mlm_labels) for MLM beside them.
    `text_ids` numbers each text within the corpus (shard offset + index), the key of the
    teacher's cache."""

    def _shard_instances(self, epoch: int, s: int) -> Instances:
        # the same texts every epoch (the cache's rows); only their order changes
        return make_texts(self.store.shard(s), self.max_len, np.random.default_rng([self.seed, s, 5]),
                          self.short_seq_prob)

    def text_offsets(self) -> np.ndarray:
        """(shards + 1,) the first text number of each shard."""
        if not hasattr(self, "_offsets"):
            sizes = [len(self._shard_instances(0, s)) for s in range(len(self.store))]
            self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return self._offsets

    def _group(self, epoch: int, shards: np.ndarray, indices: np.ndarray):
        """The batch's rows grouped by shard, with each row's text number (in the same order)."""
        order = np.argsort(shards, kind="stable")
        return super()._group(epoch, shards, indices), self.text_offsets()[shards[order]] + indices[order]

    def build(self, grouped, rng: np.random.Generator) -> dict:
        group, numbers = grouped
        rows = []
        for s, inst in group:
            tokens = self.store.shard(s).tokens
            rows += [tokens[a0:a1] for a0, a1 in zip(inst.a_start, inst.a_end)]
        B = len(rows)
        lengths = np.array([len(a) + 2 for a in rows])
        T = int(lengths.max())
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        special = np.ones((B, T), dtype=bool)  # [CLS], [SEP] and padding: never masked
        for r, a in enumerate(rows):
            ids[r, 0], ids[r, 1:1 + len(a)], ids[r, 1 + len(a)] = self.cls_id, a, self.sep_id
            special[r, 1:1 + len(a)] = False
        masked = mask_tokens(ids, special, rng, self.masking, self.mask_id, self.random_ids, self.continuation)
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.zeros(B, T, dtype=torch.int64),
            "attention_mask": torch.from_numpy((np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)),
            "mlm_input_ids": torch.from_numpy(masked.input_ids),
            "mlm_positions": torch.from_numpy(masked.positions),
            "mlm_labels": torch.from_numpy(masked.labels),
            "text_ids": torch.from_numpy(numbers.astype(np.int64)),
        }
