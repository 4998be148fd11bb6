"""The word task as a reverse dictionary (`--option head=encoder`, word.py): a phrase and every
candidate word are encoded by the same BERT, and a word's score is the cosine between the two
vectors. A word that was never a training target is scored by what it means, not by a trained
row of weights, so "a word for being late on purpose" can name a word no example taught.

Training is contrastive: the phrase's vector is pulled toward its target word's (encoded with
gradients) and away from the other targets of the batch and from every candidate of the cache,
the candidate vocabulary encoded by the model as it was at the last refresh (no gradients; a
stale copy is what MoCo-style memory banks use). The cache is refreshed before the model is
scored (evaluation, predict) whenever training has moved the encoder since; it is saved with the
folder, so a saved model answers without encoding its vocabulary again.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..pooling import pool

CACHE_BATCH = 512  # candidate words encoded per call when the cache is refreshed


class CandidateHead(nn.Module):
    """The candidate vocabulary's vectors (N, H), unit length, and whether they are those of the
    encoder as it is now (both saved with the folder)."""

    def __init__(self, n_candidates: int, hidden_size: int):
        super().__init__()
        self.register_buffer("vectors", torch.zeros(n_candidates, hidden_size))
        # 1.0 or 0.0: a folder's tensors are floating point (folders.load_model refuses the rest)
        self.register_buffer("fresh", torch.zeros(()))


def encode_words(bert, ids: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Unit vectors (B, H) of texts given as padded ids and mask (B, T): the phrase and the words
    alike."""
    rows = torch.zeros_like(ids[:, :1]) if pooling in ("pooler", "cls") else None
    out = bert(ids, torch.zeros_like(ids), mask, last_layer_rows=rows)
    return F.normalize(pool(out.sequence_output, out.pooled_output, mask, pooling).float(), dim=-1)


@torch.no_grad()
def refresh(model, candidates: list[list[int]], pad_id: int, pooling: str) -> None:
    """Encode every candidate word (token ids with [CLS] and [SEP]) into model.head.vectors with
    the encoder as it is now, in eval mode, in batches of similar length."""
    head, was_training = model.head, model.training
    model.eval()
    device = head.vectors.device
    order = sorted(range(len(candidates)), key=lambda i: len(candidates[i]))
    for s in range(0, len(order), CACHE_BATCH):
        part = order[s:s + CACHE_BATCH]
        width = max(len(candidates[i]) for i in part)
        ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        for row, i in enumerate(part):
            ids[row, :len(candidates[i])] = torch.tensor(candidates[i])
        ids = ids.to(device)
        head.vectors[torch.tensor(part, device=device)] = encode_words(model.bert, ids, (ids != pad_id).long(),
                                                                       pooling).to(head.vectors.dtype)
    head.fresh.fill_(1.0)
    model.train(was_training)


def contrastive_loss(phrases: torch.Tensor, targets: torch.Tensor, cache: torch.Tensor, keys: torch.Tensor,
                     labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean cross-entropy of each phrase (B, H) against its target's vector (B, H), among the
    batch's other targets and the cache's candidates (N, H), all unit length, as cosines over
    `temperature`. keys (B,): a target word's identity (two rows of one word are not each other's
    negatives); labels (B,): the target's row in the cache (-100 if it has none), left out of the
    negatives there (the target's own, fresher, vector is the positive)."""
    in_batch = phrases @ targets.T                                          # (B, B)
    same = keys[:, None] == keys[None, :]
    in_batch = in_batch.masked_fill(same & ~torch.eye(len(keys), dtype=torch.bool, device=keys.device),
                                    float("-inf"))
    against_cache = phrases @ cache.T                                       # (B, N)
    has = labels != -100
    own = torch.zeros_like(against_cache, dtype=torch.bool)
    own[has.nonzero().squeeze(1), labels[has]] = True
    logits = torch.cat([in_batch, against_cache.masked_fill(own, float("-inf"))], dim=1) / temperature
    return F.cross_entropy(logits, torch.arange(len(keys), device=keys.device))


def ranks(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each target's rank among the candidates (1: first; ties count against it), 0 without one."""
    has = labels != -100
    target = scores.gather(1, labels.clamp(min=0)[:, None])                 # (B, 1)
    return torch.where(has, (scores >= target).sum(1), torch.zeros_like(labels))
