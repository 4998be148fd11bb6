"""Masked language modelling targets, vectorised over a whole batch.

Of the non-special tokens, `mask_prob` are chosen (at least one, at most `max_predictions` per
sequence); of those 80% become [MASK], 10% a random token and 10% stay unchanged (Devlin et al.
2019, section 3.1). With whole-word masking a word's pieces are chosen together (none in a
sequence whose every word has more pieces than max_predictions). The batch
carries the chosen positions and their labels, so the MLM head projects only those.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MaskingConfig:
    mask_prob: float = 0.15        # share of non-special tokens to predict
    max_predictions: int = 10      # per sequence; ~0.15 x 64 as in BERT's 20 for length 128
    whole_word: bool = False       # mask all pieces of a word together
    mask_token_share: float = 0.8  # of the chosen: become [MASK]
    random_token_share: float = 0.1  # of the chosen: become a random token (the rest stay as they were)


@dataclass
class MaskedBatch:
    input_ids: np.ndarray     # (B, T) with the chosen tokens replaced
    positions: np.ndarray     # (B, P) chosen positions, 0 in unused slots
    labels: np.ndarray        # (B, P) original token ids, -100 in unused slots


def mask_tokens(ids: np.ndarray, special: np.ndarray, rng: np.random.Generator, cfg: MaskingConfig,
                mask_id: int, random_ids: np.ndarray, continuation: np.ndarray | None = None) -> MaskedBatch:
    """ids (B, T) int; special (B, T) bool, True for [CLS]/[SEP]/[PAD] (never chosen);
    random_ids: the token ids a random replacement is drawn from (non-special ones);
    continuation: (V,) bool, True for '##' pieces, needed for whole-word masking."""
    B, T = ids.shape
    P = cfg.max_predictions
    candidates = ~special
    n_cand = candidates.sum(1)                                                # (B,)
    n_pick = np.minimum(P, np.maximum(1, np.rint(n_cand * cfg.mask_prob))).astype(np.int64)
    n_pick = np.minimum(n_pick, n_cand)                                       # a row with no text picks nothing

    if cfg.whole_word:
        if continuation is None:
            raise ValueError("whole-word masking needs the vocabulary's continuation table")
        # a word is a non-continuation piece plus the '##' pieces after it; every piece of a
        # word gets the word's random score, so a sort keeps words together
        after_special = np.ones((B, T), dtype=bool)
        after_special[:, 1:] = special[:, :-1]
        # a '##' piece right after [SEP] (a segment cut mid-word) starts a word of its own
        starts = candidates & (~continuation[ids] | after_special)
        word = np.cumsum(starts, axis=1)                                       # (B, T) word number
        word_score = rng.random((B, T + 1))
        score = np.take_along_axis(word_score, word, axis=1) + np.arange(T) * 1e-9  # in-word order
    else:
        score = rng.random((B, T))
    score = np.where(candidates, score, np.inf)
    order = np.argsort(score, axis=1, kind="stable")                           # chosen first
    if cfg.whole_word:
        take = _whole_words(np.take_along_axis(word, order, axis=1), np.take_along_axis(candidates, order, axis=1),
                            n_pick, P)
    else:
        take = np.arange(T)[None, :] < n_pick[:, None]
    take &= np.take_along_axis(candidates, order, axis=1)

    # pack the chosen positions into P slots, in position order for readability
    # (sorted before the cut: a skipped whole word leaves taken pieces past rank P)
    chosen = np.sort(np.where(take, order, T), axis=1)[:, :P]
    if chosen.shape[1] < P:
        chosen = np.pad(chosen, ((0, 0), (0, P - chosen.shape[1])), constant_values=T)
    used = chosen < T
    positions = np.where(used, chosen, 0)
    labels = np.where(used, np.take_along_axis(ids, positions, axis=1), -100)

    # 80 / 10 / 10
    r = rng.random((B, P))
    replacement = np.take_along_axis(ids, positions, axis=1)
    replacement = np.where(r < cfg.mask_token_share, mask_id, replacement)
    to_random = (r >= cfg.mask_token_share) & (r < cfg.mask_token_share + cfg.random_token_share)
    replacement = np.where(to_random, random_ids[rng.integers(0, len(random_ids), (B, P))], replacement)
    out = ids.copy()
    rows = np.nonzero(used)
    out[rows[0], positions[rows]] = replacement[rows]
    return MaskedBatch(out, positions, labels)


def _whole_words(sorted_word: np.ndarray, sorted_cand: np.ndarray, n_pick: np.ndarray, P: int) -> np.ndarray:
    """Which of the score-sorted pieces to take, whole words only: words in score order, one
    that would pass n_pick skipped and the next tried, as Google's create_pretraining_data does
    (stopping at the first such word left rows with none: a fifth of them at length 8). A row
    whose every word is longer than n_pick takes its first word that fits the P slots.
    sorted_word, sorted_cand: (B, T) word number and candidate flag in score order."""
    B, T = sorted_word.shape
    first = np.ones((B, T), dtype=bool)
    first[:, 1:] = sorted_word[:, 1:] != sorted_word[:, :-1]
    k = np.cumsum(first, axis=1) - 1                                           # (B, T) word's rank
    size = np.bincount((np.arange(B)[:, None] * T + k).ravel(), weights=sorted_cand.ravel(),
                       minlength=B * T).reshape(B, T).astype(np.int64)        # (B, words) pieces
    keep = np.zeros((B, T), dtype=bool)
    filled = np.zeros(B, dtype=np.int64)
    for j in range(int(k[sorted_cand].max(initial=-1)) + 1):                    # over word ranks, all rows at once
        fits = (size[:, j] > 0) & (filled + size[:, j] <= n_pick)
        keep[:, j] = fits
        filled += np.where(fits, size[:, j], 0)
    for b in np.flatnonzero((filled == 0) & (n_pick > 0)):                      # every word too long
        fitting = np.flatnonzero((size[b] > 0) & (size[b] <= P))
        if fitting.size:
            keep[b, fitting[0]] = True
    return np.take_along_axis(keep, k, axis=1) & sorted_cand


def prediction_kinds(input_ids, mlm_positions, mlm_labels, mask_id: int):
    """(B, P) bool masks of the predicted positions the model saw as [MASK], as a random token,
    or unchanged (80/10/10). Only the first measures what a model learned: an unchanged token
    can be copied from the input."""
    seen = input_ids.gather(1, mlm_positions)            # (B, P) what the model read there
    valid = mlm_labels != -100
    masked = valid & (seen == mask_id)
    unchanged = valid & ~masked & (seen == mlm_labels)
    return masked, valid & ~masked & ~unchanged, unchanged
